"""L3: differentiable ops (names and defaults as ``torch.nn.functional``), each with its precision
contract in its docstring, and the autocast category it declares (``mpt.autocast_categories()``).

Modules by topic: ``elementwise`` (arithmetic, transcendentals, activations), ``reductions``,
``shape``, ``linalg`` (matmul, linear), ``nn_ops`` (softmax, norms, embedding, dropout),
``losses``, ``conv`` (conv2d, pooling), ``attention``. Importing this package also registers the
ops behind ``Tensor``'s operators and methods.
"""
from mpt.functional.attention import causal_mask, scaled_dot_product_attention
from mpt.functional.conv import avg_pool2d, conv2d, max_pool2d
from mpt.functional.elementwise import (abs, add, clone, div, exp, gelu, log, mul, neg, pow, relu,
                                        sigmoid, silu, sqrt, sub, tanh)
from mpt.functional.linalg import linear, matmul
from mpt.functional.losses import cross_entropy, mse_loss, nll_loss
from mpt.functional.nn_ops import (dropout, dropout_mask, embedding, layer_norm, log_softmax,
                                   rms_norm, softmax)
from mpt.functional.rng import get_rng_state, manual_seed, set_rng_state
from mpt.functional.reductions import max, mean, sum, var
from mpt.functional.shape import (cat, expand, flatten, getitem, permute, reshape, squeeze, stack,
                                  transpose, unsqueeze, view)
from mpt.autograd.tensor import register_op

__all__ = [
    "add", "sub", "mul", "div", "neg", "abs", "exp", "log", "sqrt", "pow", "relu", "gelu", "silu",
    "tanh", "sigmoid", "clone",
    "sum", "mean", "var", "max",
    "reshape", "view", "transpose", "permute", "flatten", "unsqueeze", "squeeze", "expand",
    "getitem", "cat", "stack",
    "matmul", "linear",
    "softmax", "log_softmax", "layer_norm", "rms_norm", "embedding", "dropout", "dropout_mask",
    "manual_seed", "get_rng_state", "set_rng_state",
    "cross_entropy", "nll_loss", "mse_loss",
    "conv2d", "max_pool2d", "avg_pool2d",
    "scaled_dot_product_attention", "causal_mask",
]

for _name in ("add", "sub", "mul", "div", "neg", "abs", "pow", "matmul", "getitem", "reshape",
              "view", "transpose", "permute", "flatten", "unsqueeze", "squeeze", "expand", "sum",
              "mean", "max", "var", "exp", "log", "sqrt", "relu", "softmax", "log_softmax",
              "clone"):
    register_op(_name, globals()[_name])
