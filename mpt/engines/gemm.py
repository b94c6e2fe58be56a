"""L1: ``mma`` — one matrix engine's D = A·B + C — and ``gemm``, the software around it.

**Hardware** (:func:`mma`): ``D = A·B + C`` as one MMA model computes it, bit for bit, with the
whole K chained through the model's instructions in increasing k (``mpt.mma_models()`` lists the
models and their evidence).

**Software** (:func:`gemm`): what a library adds around the instructions — the k-order of
split-K (partial sums reduced with IEEE FP32 adds, FP64 for f64 instructions), FP8 promotion of
the partial accumulator into an FP32 register every ``promote_every`` products (DeepSeek-V3:
128), dequantisation scales, and the output cast (the epilogue).

**Two kinds of scales.** The *instruction's block scales* are hardware: E8M0 or UE4M3 codes, one
per 16 or 32 elements along K, applied inside a block-scaled MMA (Blackwell's kind::mxf8f6f4 /
mxf4 / mxf4nvf4, AMD CDNA4's ``v_mfma_scale``) before anything is accumulated
(``mma(..., scale_a=, scale_b=)``; ``gemm(..., block_scale_a=, block_scale_b=)``). ``gemm``'s
``scale_a``/``scale_b`` are software *dequantisation scales*: float32 numbers per tensor
(cuBLASLt's scale pointers, NVFP4's per-tensor scale, TE's alpha) or per 1×G / G×G block
(DeepSeek-V3), multiplied into FP32 results of the MMA by IEEE FMAs. Both can be given to one
``gemm`` (NVFP4: UE4M3 block scales in the instruction, a float32 per-tensor scale after it).

NaN results are the canonical NaN (0x7FFFFFFF / 0x7FFF) for models whose hardware returns it
(NVIDIA); the other models keep the NaN their arithmetic gives (AMD: an input's payload, see
``mpt.reference.mfma``); a split-K add of two NaNs keeps the first operand's payload (x86's
rule, an assumption for the GPU's adds). Oracles: ``mpt.reference.mma`` and
``mpt.reference.mfma`` (exact rationals) and the vendored hardware samples.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from mpt._checks import check_int
from mpt.engines.model import get_mma_model
from mpt.engines.operands import operands_class, tiles
from mpt.formats import Format, get_format
from mpt.kernels import mma as _mma
from mpt.kernels.fma import fma_array
from mpt.kernels.half import canonical_nan
from mpt.rounding import round as round_format

__all__ = ["mma", "gemm", "Scale"]


def _input_formats(a, b, in_format) -> list[str]:
    """(format of a, format of b) by name, checked against the arrays' dtypes."""
    if in_format is None:
        names = []
        for arg, x in (("a", a), ("b", b)):
            try:
                names.append(get_format(x.dtype).name)
            except ValueError:
                raise TypeError(f"{arg} has dtype {x.dtype}, which stores no mpt format") from None
    elif isinstance(in_format, (tuple, list)) and len(in_format) == 2:
        names = [_named(f) for f in in_format]
    elif isinstance(in_format, (str, Format)):
        names = [_named(in_format)] * 2
    else:
        raise TypeError("in_format must be None, a format (name or Format) or a pair of them; "
                        f"got {in_format!r}")
    for arg, x, name in (("a", a, names[0]), ("b", b, names[1])):
        if x.dtype != get_format(name).dtype:
            raise TypeError(f"{arg} must hold {name} values as {get_format(name).dtype}; "
                            f"got {x.dtype}")
    return names


def _named(fmt) -> str:
    """The name of a format, which :func:`get_format` must find again (a custom format from
    ``mpt.custom_format`` must belong to a registered family: ``mpt.formats.register_format_names``;
    Gaudi's FP8 and Trainium's cFP8 formats do)."""
    found = get_format(fmt)
    try:
        again = get_format(found.name)
    except ValueError:
        again = None
    if again != found:
        raise ValueError(f"in_format {found.name!r} is a custom format that mpt.get_format does "
                         f"not find by name; use a registered family (e.g. "
                         f"mpt.engines.gaudi.fp8_format, mpt.engines.trainium.cfp8_format)")
    return found.name


def _prepare(a, b, c, model, in_format, out_format, variant=None, scales=None, options=None,
             software=False, from_c=True):
    """Validate the arguments shared by mma and gemm; returns (operands, c as (B, M, N), shape).
    ``scales``: None or (scale_a, scale_b) block scales for the instruction (kinds that take
    them check them); ``options``: the model's keyword options; ``software``: whether the
    caller is :func:`gemm`, which alone runs a configuration that composes instructions in
    software (``params`` ``("software", True)``: a TPU f32 dot's bf16 passes); ``out_format``
    None: from c's dtype (``from_c``), else the configuration's first output (fp32; fp64 for
    f64 ones)."""
    model = get_mma_model(model)
    a, b = np.asarray(a), np.asarray(b)
    for arg, x, dims in (("a", a, "(..., M, K)"), ("b", b, "(..., K, N)")):
        if x.ndim < 2:
            raise ValueError(f"{arg} must have shape {dims}; got shape {x.shape}")
    if a.shape[-1] != b.shape[-2]:
        raise ValueError(f"a (..., M, K) and b (..., K, N) disagree on K: {a.shape} and {b.shape}")
    fa, fb = _input_formats(a, b, in_format)
    cfg = model.config(fa, fb, variant, scaled=scales is not None)
    if cfg.param("software") and not software:
        raise ValueError(f"model {model.name!r} runs {fa}/{fb} inputs as software around its "
                         f"instructions ({cfg.instruction}): call mpt.gemm, not mpt.mma")
    if out_format is None:   # from c: fp16, or fp64 where the model has it; else the first
        kind = np.asarray(c).dtype if c is not None and from_c else None
        outputs = [o[0] for o in cfg.outputs]
        out_format = "fp16" if kind == np.float16 else \
            "fp64" if kind == np.float64 and "fp64" in outputs else outputs[0]
    out_name = get_format(out_format).name
    cfg.output(out_name)
    m, n = a.shape[-2], b.shape[-1]
    batch_dims = [a.shape[:-2], b.shape[:-2]]
    if c is not None:
        c = np.asarray(c)
        want = get_format(out_name).dtype
        if c.dtype != want:
            raise TypeError(f"c must be {want} for {out_name} output; got {c.dtype}")
        if c.ndim < 2:
            c = c.reshape((1,) * (2 - c.ndim) + c.shape)
        batch_dims.append(c.shape[:-2])
    try:
        batch = np.broadcast_shapes(*batch_dims)
        if c is not None:
            c = np.broadcast_to(c, batch + (m, n))
    except ValueError:
        shapes = ", ".join(str(s) for s in (a.shape, b.shape) + (() if c is None else (c.shape,)))
        raise ValueError(f"a, b (and c) batch dimensions do not broadcast: {shapes}") from None
    with _mma.threads_for(math.prod(batch) * m * n * a.shape[-1]):
        ops = operands_class(model.kind_of(cfg))(model, cfg, a, b, (fa, fb), out_name, batch,
                                                 scales, options)
    c3 = None if c is None else c.reshape((-1, m, n))
    return ops, c3, batch + (m, n)


def _canonical_nan(x):
    """The float32/16 array x with the canonical NaN (sign 0, all other bits 1) written over
    every NaN (in place when x is C-contiguous, as the engines' fresh outputs are)."""
    x = np.ascontiguousarray(x)
    canonical_nan(x.reshape(-1).view(np.uint32 if x.dtype == np.float32 else np.uint16))
    return x


def _ieee_values(fn):
    """Run fn with numpy's overflow/invalid warnings off: Inf and NaN (signalling ones included)
    are values that the models define, not errors."""
    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        with np.errstate(over="ignore", invalid="ignore"):
            return fn(*args, **kwargs)
    return wrapped


@_ieee_values
def mma(a, b, c=None, *, model, in_format=None, out_format=None, variant=None, scale_a=None,
        scale_b=None, **options):
    """D = A·B + C with one MMA model, the whole K chained in blocks as the hardware does.

    a: (..., M, K), b: (..., K, N) arrays of the input format's dtype — float16, bfloat16,
    float8_e4m3fn / float8_e5m2 (mixable), FNUZ float8_e4m3fnuz / float8_e5m2fnuz (AMD CDNA3),
    fp6/fp4 (Blackwell, CDNA4), float64 (FP64 instructions), or float32 with
    ``in_format="tf32"`` (the low 13 bits are dropped, toward zero: NVIDIA's TF32 and AMD
    CDNA3's xf32) or with an IEEE/exact model or AMD's f32 instructions.
    ``in_format``: None (from the dtypes), a format (a name or a ``Format``: Gaudi's and
    Trainium's FP8 formats are float32 arrays of a registered custom format), or a pair of them
    for (a, b).
    c: (..., M, N) float32 (FP32 output), float16 (FP16 output) or float64 (FP64 output, for
    models that have one), or None for +0; leading batch dimensions broadcast. ``out_format``:
    "fp32", "fp16" or "fp64" (None: c's dtype where the model has that output, else the
    configuration's first: "fp32", or "fp64" for f64 instructions).
    ``model``: a name or alias from ``mpt.mma_models()``, or an :class:`~mpt.MMAModel` (e.g. one
    with assumed rules chosen by ``configure``); ``variant``: an instruction variant of the model
    (None: its default); ``scale_a``/``scale_b``: the instruction's block scales, for models with
    block-scaled instructions (E8M0 ``float8_e8m0fnu`` or UE4M3 ``float8_e4m3fn`` codes, a's
    batch dimensions + (M, K/block) and b's + (K/block, N): ``mpt.engines.blockscaled``,
    ``mpt.engines.amd``; without ``variant``, the model's first block-scaled variant for the
    inputs); ``options``: keyword options of the model's kind (its operand class lists them; an
    unknown one is a TypeError).

    Precision contract: K is consumed in blocks of the model's L — one instruction's K — in
    increasing k; each block is the model's fused dot-product-add (NVIDIA: truncated to F bits
    below the block's largest exponent and rounded to the output — RZ-FP32, RZ-E8M13 for
    Ada/Hopper FP8, RNE-FP16; AMD: ``mpt.engines.amd``) and its result is the next block's c.
    ``ieee_fma`` and ``ieee_mul_add`` round at every k (RNE), ``exact`` once; block-scaled
    instructions apply their scales inside each block; FP64 instructions are one float64 FMA per
    k. Returns float32,
    float16 or float64 D; NaNs are the canonical NaN where the hardware writes one (NVIDIA),
    else the model's own (AMD: the payload of an input NaN). Raises ValueError for input/output
    formats the model does not support, and for a configuration that composes instructions in
    software (a TPU f32 dot: ``mpt.gemm``). Oracles: ``mpt.reference.mma.mma_reference``,
    ``mpt.reference.mfma``; hardware: tests/test_mma_hardware.py.
    """
    scales = None if scale_a is None and scale_b is None else (scale_a, scale_b)
    ops, c3, shape = _prepare(a, b, c, model, in_format, out_format, variant, scales, options)
    with _mma.threads_for(ops.work):
        acc = ops.chain_from(c3, 0, ops.k)
    d = ops.values(acc)
    if ops.out_format == "fp16":
        d = d.astype(np.float16)  # exact: the values are FP16 numbers
    return (_canonical_nan(d) if ops.canonical_nan else d).reshape(shape)


@dataclass(frozen=True)
class Scale:
    """A dequantisation scale of :func:`gemm`: one float32 per tensor (``values`` 0-d), or one
    per block (``values`` (rows, cols), ``per_block=True``)."""

    values: np.ndarray
    per_block: bool = False

    @classmethod
    def parse(cls, s, arg, rows, cols, group):
        """Python numbers are rounded to float32 (RNE); arrays must already be float32."""
        if isinstance(s, (int, float)) and not isinstance(s, bool):
            return cls(np.float32(s))
        if not isinstance(s, (np.ndarray, np.generic)) or s.dtype != np.float32:
            raise TypeError(f"{arg} must be a Python number or float32; got {type(s).__name__} "
                            f"{getattr(s, 'dtype', '')}".rstrip())
        if s.size == 1 and s.ndim <= 1:
            return cls(s.reshape(())[()])
        if s.ndim == 2 and group is not None and s.shape == (rows, cols):
            return cls(s, per_block=True)
        need = "a scalar (per tensor)"
        if group is not None:
            need += f" or an array of shape {(rows, cols)} (per block)"
        else:
            need += "; per-block scales need promote_every (the scale block size along K)"
        raise ValueError(f"{arg} must be {need}; got shape {s.shape}")


@_ieee_values
def gemm(a, b, c=None, *, model, split_k=1, promote_every=None, scale_a=None, scale_b=None,
         out_format=None, in_format=None, accumulate=None, variant=None, block_scale_a=None,
         block_scale_b=None, **options):
    """A GEMM as a GPU library runs it on one MMA model: the software around the Tensor Core.

    a (..., M, K), b (..., K, N), c (..., M, N), ``in_format``, ``model``, ``variant`` and the
    model's keyword ``options`` as in :func:`mma`; batch dimensions broadcast.
    ``block_scale_a``/``block_scale_b``: the instruction's block scales (E8M0 / UE4M3 codes,
    :func:`mma`'s ``scale_a``/``scale_b``), for a block-scaled variant; every MMA of the chain
    uses those of its k. Per output element, in this order:

    1. **split-K**: K is cut into ``split_k`` chunks of ceil(K/split_k) products rounded up to
       a multiple of the block L — the instruction's K on AMD — (of ``promote_every`` when
       given); each chunk runs on its own accumulator starting at +0, and the chunk results are
       added in chunk order with IEEE adds (RNE) of the accumulator's format (FP32; FP64 for
       f64 instructions), as a split-K reduction on CUDA cores / shader cores.
    2. **promotion** (``promote_every=G``, a multiple of L): inside a chunk, every G products the
       MMA partial (started at +0) is added into an FP32 register with an IEEE ``fma(s, partial,
       register)`` — s = 1, or the block scale. DeepSeek-V3 uses G = 128 for Hopper FP8 (whose
       e8m13 partial otherwise keeps ~14 bits); None chains the whole chunk ("fast accumulation").
    3. **scales** (software, float32; module docstring): per tensor (``scale_a``/``scale_b``
       scalars): D = fma(alpha, D, c) with alpha = RN32(scale_a·scale_b), at the end; per block
       (DeepSeek-V3: ``scale_a`` (M, K/G) for 1×G tiles of A, ``scale_b`` (K/G, N/G) for G×G
       tiles of B): s = RN32(sa[i,g]·sb[g,j//G]) multiplies each promoted partial (a per-tensor
       partner is folded into s).
    4. **c**: the MMA's C of the first chunk (no promotion), or the initial FP32 register (with
       promotion); with per-tensor scales it is added by the final fma instead (cuBLASLt's beta·C).
    5. **epilogue**: ``out_format`` "fp32" returns the FP32 accumulator; "fp16"/"bf16" round it
       once, RNE — what cuBLAS does with CUBLAS_COMPUTE_32F and a half output. None: the
       accumulator's format.

    ``accumulate``: None — "fp32", or "fp64" for a configuration whose only output is FP64 (AMD's
    f64 instructions: c float64, output "fp64", no promotion or software scales); "fp16" runs the
    Tensor Core's own FP16-output mode (RNE-FP16 after every block; c must be float16; no
    split-K, promotion or scales): FP16 accumulation, which is NOT the same as FP32 accumulation
    followed by an FP16 epilogue. With the defaults, ``gemm`` returns exactly what :func:`mma`
    returns. Oracle: ``mpt.reference.mma.gemm_reference``.
    """
    if accumulate not in (None, "fp32", "fp16", "fp64"):
        raise ValueError(f"accumulate must be None, 'fp32', 'fp16' or 'fp64'; got {accumulate!r}")
    split_k = check_int("split_k", split_k, min=1)
    promote_every = check_int("promote_every", promote_every, min=1, optional=True)
    for arg, s in (("scale_a", scale_a), ("scale_b", scale_b)):
        if getattr(s, "dtype", None) in _BLOCK_SCALE_DTYPES:
            raise TypeError(f"{arg} is a float32 dequantisation scale; the instruction's "
                            f"{s.dtype} block scales go in block_{arg}")
    block_scales = None if block_scale_a is None and block_scale_b is None else \
        (block_scale_a, block_scale_b)
    scaled = scale_a is not None or scale_b is not None
    if accumulate == "fp16" and (split_k != 1 or promote_every is not None or scaled):
        raise ValueError("accumulate='fp16' models the Tensor Core's FP16 output mode alone: "
                         "split_k, promote_every and scales need accumulate='fp32'")
    ops, c3, shape = _prepare(a, b, c, model, in_format, accumulate, variant, block_scales,
                              options, software=True, from_c=False)
    out_name = _gemm_output(ops.out_format, out_format, promote_every, scaled)
    unit = promote_every or ops.unit
    if promote_every is not None and promote_every % ops.unit:
        raise ValueError(f"promote_every must be a multiple of the model's block of {ops.unit} "
                         f"products; got {promote_every}")
    m, k, n = ops.m, ops.k, ops.n
    if k == 0:
        promote_every = None  # no products: nothing to promote, D = c (or +0)
    kg = tiles(k, promote_every) if promote_every else 0
    sa = None if scale_a is None else Scale.parse(scale_a, "scale_a", m, kg, promote_every)
    sb = None if scale_b is None else Scale.parse(scale_b, "scale_b", kg,
                                                  tiles(n, promote_every or 1), promote_every)
    c_at_end = scaled and not any(s is not None and s.per_block for s in (sa, sb))
    step = max(unit, tiles(tiles(k, split_k), unit) * unit)
    with _mma.threads_for(ops.work):
        d = None
        for k0 in range(0, max(k, 1), step):
            own_c = c3 if (k0 == 0 and not c_at_end) else None
            part = _chunk(ops, k0, min(k0 + step, k), own_c, promote_every, sa, sb)
            d = part if d is None else d + part                     # IEEE adds (RNE)
        if c_at_end:
            alpha = np.float32(1.0)
            for s in (sa, sb):
                alpha = alpha * (np.float32(1.0) if s is None else s.values)
            d = fma_array(alpha, d, np.float32(-0.0) if c3 is None else c3.astype(np.float32))
    nan = _canonical_nan if ops.canonical_nan else (lambda x: x)
    d = nan(d)
    if out_name not in ("fp32", "fp64"):
        d = nan(round_format(d, out_name))                          # RNE, one rounding
    return d.reshape(shape)


#: dtypes of the instruction's block-scale codes (E8M0; UE4M3 stored as float8_e4m3fn)
_BLOCK_SCALE_DTYPES = (get_format("e8m0").dtype, get_format("fp8_e4m3fn").dtype)


def _gemm_output(acc_name, out_format, promote_every, scaled) -> str:
    """The output format of gemm for an accumulator of ``acc_name`` (ValueError naming the
    valid ones)."""
    if acc_name == "fp64":
        out_name = "fp64" if out_format is None else get_format(out_format).name
        if out_name != "fp64" or promote_every is not None or scaled:
            raise ValueError(f"an FP64 accumulator (f64 instructions) takes out_format 'fp64' "
                             f"and no promote_every or software scales; got out_format "
                             f"{out_format!r}, promote_every {promote_every!r}")
        return out_name
    out_name = "fp32" if out_format is None else get_format(out_format).name
    if out_name not in ("fp32", "fp16", "bf16"):
        raise ValueError(f"out_format must be 'fp32', 'fp16' or 'bf16'; got {out_format!r}")
    return out_name


def _chunk(ops, k0, k1, c, promote_every, sa, sb):
    """One split-K chunk [k0, k1) as (B, M, N) float32 (float64 for an FP64 accumulator): the
    MMA chain from c (or +0), or, with
    promotion, MMA partials from +0 fused into an FP32 register that starts at c (or −0, so
    that the first partial enters it unchanged)."""
    if promote_every is None:
        return ops.values(ops.chain_from(c, k0, k1))
    register = np.full((ops.batch_size, ops.m, ops.n), -0.0, np.float32) if c is None \
        else c.astype(np.float32)
    for g0 in range(k0, k1, promote_every):
        acc = ops.chain_from(None, g0, min(g0 + promote_every, k1))
        s = _block_scale(sa, sb, g0 // promote_every, promote_every, ops.m, ops.n)
        register = fma_array(s, ops.values(acc), register)
    return register


def _block_scale(sa, sb, g, group, m, n):
    """The (M, N) float32 scale of K-block g: RN32(sa[i, g]·sb[g, j // group]), or 1."""
    if not any(s is not None and s.per_block for s in (sa, sb)):
        return np.float32(1.0)
    rows = np.float32(1.0) if sa is None else (sa.values[:, g:g + 1] if sa.per_block
                                               else sa.values)
    cols = np.float32(1.0) if sb is None else (
        np.repeat(sb.values[g], group)[:n][None, :] if sb.per_block else sb.values)
    return np.broadcast_to(rows * cols, (m, n)).astype(np.float32)
