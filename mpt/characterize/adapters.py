"""L5: adapters — anything that computes one output element of an MMA, D = A·B + C.

The probing method talks to the hardware (or to a model) only through this small protocol:

``name``
    what is being characterized (printed in the report and the JSON).
``pairs() -> tuple[(in_format, out_format), ...]``
    the format pairs it computes (A and B in the same input format).
``instruction_k(in_format, out_format) -> int``
    the K of one instruction; the probes use K = 64 (16 for the spec vectors) rounded up to a
    multiple of it, and ``run`` chains K / instruction_k instructions along K (each result the
    next C), as the hardware does.
``run(a, b, c, in_format, out_format) -> d``
    a, b: (P, K) arrays of the input format's storage dtype (float32 for tf32), c: (P,) of the
    output format's; returns d: (P,) of the output format's dtype — one probe per row.
``evidence(in_format, out_format) -> str``
    the evidence label a model fitted to its results earns (``mpt.engines.EVIDENCE``).
``accepts(a, b, c, in_format, out_format) -> (P,) bool`` (optional)
    rows it can compute; the others are reported as not run.

:class:`MptAdapter` computes with a registered (or any) mpt model — the CPU reference, used to
test the method on every preset; :func:`with_fraction_bits` injects a fault (one bit of alignment
less). :class:`TorchAdapter` runs the probes through PyTorch on a CUDA or ROCm device. It has
**never run**: mpt's tests run on a CPU, and no GPU was available when it was written.
"""
from __future__ import annotations

import math
import re
from dataclasses import replace

import numpy as np

from mpt.characterize import runner
from mpt.characterize.probes import factor
from mpt.engines import MMAModel, get_mma_model
from mpt.formats import get_format
from mpt.rounding import round as _round

__all__ = ["MptAdapter", "TorchAdapter", "get_adapter", "with_fraction_bits", "c_prefix"]


class MptAdapter:
    """Probes computed by one mpt model, as :mod:`mpt.characterize.runner` computes a
    configuration (block-scaled instructions with unit scales, software configurations through
    ``mpt.gemm``) — the instruction variant ``variant`` (None: the variant ``mpt.mma`` picks by
    default for each input format) and ``options`` (the kind's keyword options). Its pairs are
    every (input, output) format pair of those configurations; :meth:`not_probed` lists the
    model's other instruction variants, which another adapter (``variant=``) probes."""

    def __init__(self, model, variant: str | None = None, name: str | None = None, **options):
        self.model = get_mma_model(model)
        self.variant, self.options = variant, options
        self.name = name or f"mpt:{self.model.name}" + (f"[{variant}]" if variant else "") + \
            "".join(f",{k}={v}" for k, v in self.model.choices)
        formats = dict.fromkeys(f for cfg in self.model.configs for f in cfg.inputs
                                if variant is None or cfg.variant == variant)
        if not formats:
            raise ValueError(f"variant must be one of {', '.join(map(repr, self.model.variants))}"
                             f" for model {self.model.name!r}; got {variant!r}")
        self._configs = {fin: self.model.config(fin, fin, variant) for fin in formats}

    def pairs(self) -> tuple[tuple[str, str], ...]:
        return tuple((fin, out) for fin, cfg in self._configs.items() for out, _, _ in cfg.outputs)

    def instruction_k(self, in_format: str, out_format: str) -> int:
        return runner.instruction_k(self.model, self._configs[in_format])

    def evidence(self, in_format: str, out_format: str) -> str:
        return self._configs[in_format].evidence

    def note(self, in_format: str, out_format: str) -> str:
        cfg = self._configs[in_format]
        text = f"variant {cfg.variant}: {cfg.instruction}"
        extra = runner.how(self.model, cfg)
        return text + (f"; {extra}" if extra else "")

    def not_probed(self) -> list[str]:
        """The model's instruction variants this adapter does not compute, with the reason."""
        used = {cfg.variant for cfg in self._configs.values()}
        others = [v for v in self.model.variants if v not in used]
        if not others:
            return []
        return [f"{self.model.name}: {len(others)} other instruction variant"
                f"{'s' if len(others) > 1 else ''}, each probed on its own (--variant NAME): "
                + ", ".join(others)]

    def run(self, a, b, c, in_format: str, out_format: str) -> np.ndarray:
        return runner.compute(self.model, a, b, c, in_format, out_format,
                              self._configs[in_format].variant, self.options)


def with_fraction_bits(model, delta: int = -1) -> MMAModel:
    """A fault-injected copy of a model: every configuration with an alignment width F gets
    F + ``delta`` (−1: one bit of alignment less). ValueError if its kind refuses the value."""
    model = get_mma_model(model)
    if not any(cfg.fraction_bits is not None for cfg in model.configs):
        raise ValueError(f"model {model.name!r} has no alignment width F to change")
    configs = tuple(replace(cfg, fraction_bits=cfg.fraction_bits + delta)
                    if cfg.fraction_bits is not None else cfg for cfg in model.configs)
    return replace(model, name=f"{model.name} (F{delta:+d})", configs=configs, aliases=())


class TorchAdapter:
    """Probes computed by PyTorch on a CUDA or ROCm device, with the settings that route GEMMs to
    the Tensor Cores / Matrix Cores. **Never run**: written without a GPU; its first user is
    asked to send the result (docs/characterize.md).

    Each probe row is row 0 of A and column 0 of B in a 64×(W+K) by (W+K)×64 tile of a batched
    GEMM (large enough for cuBLAS/hipBLASLt to pick a Tensor Core kernel), and d is D[0, 0]:

    * fp16, bf16: ``torch.bmm(A, B, out_dtype=torch.float32)`` (PyTorch 2.8 or later), with the
      reduced-precision split-K reductions switched off;
    * tf32: float32 tensors with ``torch.backends.cuda.matmul.allow_tf32 = True`` (on ROCm,
      MI300's xf32 also needs ``HIPBLASLT_ALLOW_TF32=1`` in the environment);
    * fp8 (e4m3fn/e5m2 on CUDA sm_89+ and MI350; e4m3fnuz/e5m2fnuz on MI300):
      ``torch._scaled_mm`` with unit scales, an FP32 output and ``use_fast_accum=True`` (no
      promotion inside K = 128), one probe at a time.

    A library GEMM adds C only in its epilogue, after the Tensor Core is done, so C is given to
    the Tensor Core the way a chained instruction receives it: as the result of a *prefix* of
    W = 64 products in front of the probe, one power of two per bit of c, largest first. W is a
    multiple of every block size up to 64, so the probe starts on a block boundary. Rows whose c
    the input format cannot form, or whose prefix alone does not give c exactly on the device
    (:meth:`accepts` checks it there), are left out and reported as not run. Only FP32 outputs:
    a half-precision output of these calls is an epilogue rounding, not the Tensor Core's.
    """

    WIDTH = 64
    TILE = 64

    def __init__(self, platform: str = "cuda", device: str | None = None):
        try:
            import torch
        except ImportError:
            raise ImportError("the torch adapter needs PyTorch (pip install torch) with a CUDA "
                              "or ROCm build") from None
        if platform not in ("cuda", "rocm"):
            raise ValueError(f"platform must be 'cuda' or 'rocm'; got {platform!r}")
        if not torch.cuda.is_available():
            raise ValueError("torch sees no GPU (torch.cuda.is_available() is False)")
        hip = getattr(torch.version, "hip", None) is not None
        if hip != (platform == "rocm"):
            raise ValueError(f"this PyTorch is a {'ROCm' if hip else 'CUDA'} build; use "
                             f"torch:{'rocm' if hip else 'cuda'}")
        self.torch, self.platform = torch, platform
        self.device = torch.device(device or "cuda")
        props = torch.cuda.get_device_properties(self.device)
        self.arch = getattr(props, "gcnArchName", "") or f"sm_{props.major}{props.minor}"
        self.name = f"torch:{platform} ({props.name}, {self.arch})"

    # ---- protocol --------------------------------------------------------------------------
    def pairs(self):
        pairs = [("fp16", "fp32"), ("bf16", "fp32"), ("tf32", "fp32")]
        return tuple(pairs + [(f, "fp32") for f in self._fp8_formats()])

    def instruction_k(self, in_format, out_format):
        return 1

    def evidence(self, in_format, out_format):
        return "hardware-verified"

    def accepts(self, a, b, c, in_format, out_format):
        """Rows whose c the prefix forms exactly on the device."""
        prefixes = [c_prefix(float(x), in_format, self.WIDTH) for x in np.asarray(c, np.float64)]
        ok = np.array([p is not None for p in prefixes])
        if ok.any():
            rows = np.flatnonzero(ok)
            zeros = np.zeros((rows.size, 0), a.dtype)
            got = self._gemm(zeros, zeros, [prefixes[i] for i in rows], in_format)
            ok[rows] = got.view(np.uint32) == np.asarray(c)[rows].view(np.uint32)
        return ok

    def run(self, a, b, c, in_format, out_format):
        if out_format != "fp32":
            raise ValueError("the torch adapter computes FP32 outputs only")
        prefixes = [c_prefix(float(x), in_format, self.WIDTH) for x in np.asarray(c, np.float64)]
        if any(p is None for p in prefixes):
            raise ValueError("a probe's c cannot be formed by the prefix (check accepts first)")
        return self._gemm(a, b, prefixes, in_format)

    # ---- helpers ---------------------------------------------------------------------------
    def _fp8_formats(self):
        if self.platform == "cuda":
            major, minor = self.torch.cuda.get_device_capability(self.device)
            return ("fp8_e4m3fn", "fp8_e5m2") if (major, minor) >= (8, 9) else ()
        if "gfx942" in self.arch:
            return ("fp8_e4m3fnuz", "fp8_e5m2fnuz")
        if "gfx950" in self.arch:
            return ("fp8_e4m3fn", "fp8_e5m2")
        return ()

    def _dtype(self, in_format):
        t = self.torch
        return {"fp16": t.float16, "bf16": t.bfloat16, "tf32": t.float32,
                "fp8_e4m3fn": getattr(t, "float8_e4m3fn", None),
                "fp8_e5m2": getattr(t, "float8_e5m2", None),
                "fp8_e4m3fnuz": getattr(t, "float8_e4m3fnuz", None),
                "fp8_e5m2fnuz": getattr(t, "float8_e5m2fnuz", None)}[in_format]

    def _tiles(self, a, b, prefixes, in_format):
        """A (P, TILE, W+K) and B (P, W+K, TILE) as torch tensors of the input format: the
        probe's own bit patterns (a tf32 probe keeps the low bits the hardware must drop)."""
        p, k = a.shape
        width, tile = self.WIDTH, self.TILE
        store = np.asarray(a).dtype
        ta = np.zeros((p, tile, width + k), store)                                 # (P, T, W+K)
        tb = np.zeros((p, width + k, tile), store)                                 # (P, W+K, T)
        for i, (pa, pb) in enumerate(prefixes):
            if pa:
                ta[i, 0, :len(pa)] = _round(np.array(pa, np.float64), in_format)
                tb[i, :len(pb), 0] = _round(np.array(pb, np.float64), in_format)
        ta[:, 0, width:] = a
        tb[:, width:, 0] = b
        dtype = self._dtype(in_format)
        return [self.torch.from_numpy(x.view(np.dtype(f"i{store.itemsize}"))).to(self.device)
                .view(dtype) for x in (ta, tb)]

    def _gemm(self, a, b, prefixes, in_format):
        t = self.torch
        ta, tb = self._tiles(a, b, prefixes, in_format)
        flags = t.backends.cuda.matmul
        saved = (flags.allow_tf32, flags.allow_fp16_reduced_precision_reduction,
                 flags.allow_bf16_reduced_precision_reduction)
        try:
            flags.allow_tf32 = in_format == "tf32"
            flags.allow_fp16_reduced_precision_reduction = False
            flags.allow_bf16_reduced_precision_reduction = False
            if in_format in ("fp16", "bf16"):
                try:
                    d = t.bmm(ta, tb, out_dtype=t.float32)
                except TypeError:
                    raise RuntimeError("the torch adapter needs torch.bmm(..., out_dtype="
                                       "torch.float32): PyTorch 2.8 or later") from None
            elif in_format == "tf32":
                d = t.bmm(ta, tb)
            else:
                one = t.ones((), dtype=t.float32, device=self.device)
                d = t.stack([t._scaled_mm(ta[i], tb[i].t().contiguous().t(), scale_a=one,
                                          scale_b=one, out_dtype=t.float32, use_fast_accum=True)
                             for i in range(ta.shape[0])])
            t.cuda.synchronize(self.device)
        finally:
            (flags.allow_tf32, flags.allow_fp16_reduced_precision_reduction,
             flags.allow_bf16_reduced_precision_reduction) = saved
        return d[:, 0, 0].cpu().numpy().astype(np.float32)


def c_prefix(c: float, in_format: str, width: int = TorchAdapter.WIDTH):
    """C as products for a prefix of the probe: (a, b) value lists, one power of two per bit of
    c, largest first, at most ``width`` of them, whose exact sum is c; ``([], [])`` for +0;
    None if the input format cannot form them (or c is −0, Inf or NaN)."""
    if c == 0 and math.copysign(1.0, c) > 0:
        return [], []
    if not math.isfinite(c) or c == 0:
        return None
    num, den = abs(c).as_integer_ratio()
    e0 = -(den.bit_length() - 1)
    exponents = [e0 + i for i in range(num.bit_length()) if num >> i & 1][::-1]
    pairs = [factor(1 if c > 0 else -1, e, get_format(in_format).name) for e in exponents]
    if len(pairs) > width or any(p is None for p in pairs):
        return None
    return [p[0] for p in pairs], [p[1] for p in pairs]


def get_adapter(spec: str, *, variant: str | None = None, assume: dict | None = None,
                fault: int | None = None):
    """An adapter from its command-line name: ``mpt:<model>`` (any registered model or alias;
    ``variant``, assumed-rule choices ``assume`` and an alignment ``fault`` (ΔF) apply to it),
    ``torch:cuda[:N]`` or ``torch:rocm[:N]``. ValueError listing the forms otherwise."""
    match = re.fullmatch(r"(mpt|torch):(.+)", spec or "")
    if match is None:
        raise ValueError(f"adapter must be 'mpt:<model>', 'torch:cuda[:N]' or 'torch:rocm[:N]'; "
                         f"got {spec!r}")
    kind, rest = match.groups()
    if kind == "torch":
        if variant or assume or fault:
            raise ValueError("variant, assumption choices and faults apply to mpt:<model> "
                             "adapters only")
        platform, _, index = rest.partition(":")
        return TorchAdapter(platform, f"cuda:{index}" if index else None)
    model = get_mma_model(rest)
    if assume:
        model = model.configure(**assume)
    if fault:
        model = with_fraction_bits(model, fault)
    return MptAdapter(model, variant, name=f"mpt:{rest}" + (f"[{variant}]" if variant else "")
                      + "".join(f",{k}={v}" for k, v in (assume or {}).items())
                      + (f" (F{fault:+d})" if fault else ""))
