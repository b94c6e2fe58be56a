"""L2: autograd — tensors stored in their format, differentiable Functions, the thread-local
context every op reads, and the memory ledger (an autograd hook)."""
