"""L1': slow, obviously-correct oracles (exact rationals, float64 reasoning) used by the tests.

Never imports ``mpt.kernels``: an oracle must be independent of the kernel it checks.
"""
