"""L5: ``mpt characterize`` — what does this GPU's matrix unit do?

The published probing method (Fasi et al. 2021; Khattak & Mikaitis, arXiv:2512.07004; the probes
of MMA-Sim, Xie et al. arXiv:2511.10909), run through an *adapter* — anything that computes one
MMA output element d = a·b + c (:mod:`mpt.characterize.adapters`): mpt's own models
(``mpt:<model>``, the CPU reference) or PyTorch on a CUDA/ROCm device (``torch:cuda``,
``torch:rocm``; never run on a GPU). For every configuration (input format, output format,
instruction variant; block-scaled instructions with unit scales, software configurations through
``mpt.gemm``) it infers the block size, the alignment bits, the output rounding, the handling of
subnormals, zeros (e_zero and the open zero rules D1–D5), NaNs (which of several comes out) and
special values, the order of blocks and passes and other behaviours (rounded products, pairwise
trees), fits the block model of docs/tensor_cores.md, and names the registered models of every
kind that reproduce every probe, with the choices of their assumed rules that the probes settle
(or report as indistinguishable) — or the nearest ones, with every difference and, where a
changed F or L reproduces the unit, the parameters that differ. docs/characterize.md describes
the method and how to run it on a GPU.

    >>> from mpt.characterize import characterize, get_adapter
    >>> ch = characterize(get_adapter("mpt:hopper"), [("fp16", "fp32")])
    >>> ch.pairs[0].fit.params["block"], ch.pairs[0].fit.params["fraction_bits"]
    (16, 25)
"""
from mpt.characterize.adapters import MptAdapter, TorchAdapter, get_adapter, with_fraction_bits
from mpt.characterize.battery import build_battery
from mpt.characterize.core import Characterization, Difference, PairResult, characterize
from mpt.characterize.infer import Finding
from mpt.characterize.match import Candidate, Settlement, candidates

__all__ = ["characterize", "Characterization", "PairResult", "Difference", "Finding",
           "MptAdapter", "TorchAdapter", "get_adapter", "with_fraction_bits", "build_battery",
           "Candidate", "Settlement", "candidates"]
