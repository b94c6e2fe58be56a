"""L5: run a golden suite's inputs through PyTorch and write its outputs for ``mpt golden verify``.

torch is optional: :func:`run_torch` raises ImportError with an install hint when it is missing.
Each case kind maps to one PyTorch operation (cases it cannot express write no file, and
``verify --allow-missing`` reports them "skipped"):

==============  ===========================================================================
kind            PyTorch operation
==============  ===========================================================================
round           ``x.to(dtype)`` from float32 for ``nearest_even`` into fp16, bf16 and the four
                fp8 dtypes, written for both the saturating and the non-saturating case (torch
                has one conversion: verify tells which it is); other modes/formats: skipped
mma             fp32 output: on CUDA, fp16/bf16 2-D inputs go to the Tensor Cores as
                ``torch.mm(a, b, out_dtype=torch.float32) + c`` (untested on hardware here);
                otherwise ``torch.matmul(a.float(), b.float()) + c`` — a float32 GEMM of the
                exactly widened inputs (on CUDA with TF32 off); tf32 inputs: the same with
                ``allow_tf32=True`` on CUDA (plain float32 on CPU); fp16 output:
                ``c + torch.matmul(a, b)`` all in fp16 (fp16 inputs); fp64 (FP64 cases):
                ``torch.matmul(a, b) + c`` in float64. c is added after the product, where an
                MMA starts from it: compare cases with c = 0, or read the differences in that
                light. fp8/fp6/fp4 inputs (FNUZ and OCP): skipped (no portable matmul).
                Block-scaled variants, on CUDA with ``torch._scaled_mm`` (PyTorch's MX/NVFP4
                GEMM on sm_100): ``mxf8f6f4`` with fp8 elements and UE8M0 scales per 32, and
                ``mxf4nvf4`` with UE4M3 scales per 16 (e2m1 packed two per byte, low nibble
                first, as ``float4_e2m1fn_x2``), scales in cuBLAS's 128x4 blocked layout,
                ``+ c`` after the product (untested on hardware here); fp6 elements, the other
                scale formats, ``mxf4``, the MMA-Sim zero rule, AMD CDNA4's E8M0 instructions and
                CPU devices: skipped (torch has no such GEMM)
gemm            as mma's fp32 (fp64) output, then ``.to(out dtype)``; per-tensor scales multiply
                the float32 product first (``alpha·(a@b) + c``, alpha = f32(sa·sb)); split-K and
                promotion are not controllable; FP8, FP4 and block-scaled gemm cases are skipped
fake_quant      ``torch.fake_quantize_per_tensor_affine`` / ``..._per_channel_affine`` via their
                ``_cachemask`` aten variants (y and the straight-through mask)
optim           ``torch.optim.SGD`` / ``AdamW`` with ``foreach=False, fused=False`` (the
                single-tensor loop), the same hyper-parameters, one ``step()`` per stored grad
grad_scaler     ``torch.amp.GradScaler(device)`` driving an SGD(lr=0) step per found_inf entry
attention       ``torch.nn.functional.scaled_dot_product_attention`` in the input dtype,
                forward and ``backward(grad_out)`` (PyTorch picks its own backend)
==============  ===========================================================================

**AMD (ROCm builds of torch).** ``--device cuda`` is the GPU of whichever build of torch is
installed: on a ROCm build (``torch.version.hip`` set) it is an AMD Instinct GPU, and the same
calls run on its Matrix Cores through hipBLASLt — fp16/bf16 ``torch.mm(..., out_dtype=float32)``,
fp64 DGEMMs, and tf32 as xf32 where hipBLASLt honours ``allow_tf32`` (MI300). The cases of the
``cdna*`` models are the ones such a run should verify bit-exact (on the instruction hipBLASLt
picks; mpt's default is Triton's, see ``mpt.engines.amd``). mpt's own tests never run on a GPU:
this mapping is untested on hardware. On the CPU, torch computes every matmul case with its own
BLAS; the AMD cases then run and differ like the others, and their FNUZ/OCP fp8, fp4 and E8M0
cases are skipped.

Outputs of 8/16-bit float dtypes are written as their bit patterns (NaN payloads kept); the rest
in their own dtype.
"""
from __future__ import annotations

import importlib
from pathlib import Path

import ml_dtypes
import numpy as np

from mpt.golden.suite import compute_outputs, load_suite, outputs_folder, save_npz

__all__ = ["run_torch", "TORCH_DTYPES"]

#: mpt format name -> torch dtype attribute
TORCH_DTYPES = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32", "tf32": "float32",
                "fp64": "float64",
                "fp8_e4m3fn": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2",
                "fp8_e4m3fnuz": "float8_e4m3fnuz", "fp8_e5m2fnuz": "float8_e5m2fnuz",
                "e8m0": "float8_e8m0fnu"}
_MATMUL_FORMATS = ("fp16", "bf16", "fp32", "tf32", "fp64")


def _import_torch():
    try:
        return importlib.import_module("torch")
    except ImportError as exc:
        raise ImportError("mpt golden run-torch needs PyTorch: pip install 'mpt[torch]' "
                          f"(import failed: {exc})") from None


class _Adapter:
    """The case kinds as PyTorch calls on one device; each returns outputs or None (skipped)."""

    def __init__(self, torch, device: str):
        self.torch, self.device = torch, device

    def t(self, x, fmt=None):
        """A numpy input as a torch tensor on the device (ml_dtypes arrays via their bits)."""
        torch = self.torch
        if fmt in ("bf16", "e8m0") or (fmt or "").startswith("fp8"):
            bits = np.ascontiguousarray(x).view(f"u{x.dtype.itemsize}")
            signed = bits.view(f"i{x.dtype.itemsize}")
            t = torch.from_numpy(signed.copy()).view(getattr(torch, TORCH_DTYPES[fmt]))
        else:
            t = torch.from_numpy(np.ascontiguousarray(x).copy())
        return t.to(self.device)

    def out(self, t) -> np.ndarray:
        t = t.detach().cpu().contiguous()
        if t.is_floating_point() and t.element_size() < 4:
            size = t.element_size()
            ints = self.torch.int8 if size == 1 else self.torch.int16
            return t.view(ints).numpy().view(f"u{size}").copy()
        return t.numpy().copy()                          # not a view of a tensor that changes

    # ---- kinds -------------------------------------------------------------------------------
    def round(self, inputs, params):
        fmt = params["format"]
        if params["mode"] != "nearest_even" or fmt not in TORCH_DTYPES \
                or fmt in ("fp32", "tf32") or not params["subnormals"]:
            return None
        return {"y": self.out(self.t(inputs["x"]).to(getattr(self.torch, TORCH_DTYPES[fmt])))}

    def _addmm(self, a, b, c, fmt, alpha=None):
        torch = self.torch
        cuda = self.device.startswith("cuda")             # NVIDIA, or AMD on a ROCm build
        if fmt == "fp64":                                 # DGEMM (AMD: the f64 MFMA instructions)
            d = torch.matmul(self.t(a), self.t(b))
            return d if c is None else d + self.t(c)
        tc = self.t(c).float() if c is not None else None
        if cuda and fmt in ("fp16", "bf16") and a.ndim == 2:
            # The Tensor Core (Matrix Core) path: cuBLAS/hipBLASLt fp16/bf16 GEMM with an FP32
            # result (what the hopper/ampere/cdna presets model; c is added after the product).
            d = torch.mm(self.t(a, fmt), self.t(b, fmt), out_dtype=torch.float32)
            d = d if alpha is None else d * alpha
            return d if tc is None else d + tc
        ta, tb = self.t(a, fmt).float(), self.t(b, fmt).float()
        old = torch.backends.cuda.matmul.allow_tf32 if cuda else None
        if cuda:
            torch.backends.cuda.matmul.allow_tf32 = fmt == "tf32"
        try:
            d = torch.matmul(ta, tb)
            if alpha is not None:
                d = d * alpha
            return d if tc is None else d + tc
        finally:
            if cuda:
                torch.backends.cuda.matmul.allow_tf32 = old

    def _blocked(self, scales, fmt):
        """Scale codes (rows, k-blocks) in cuBLAS's block-scaling layout: zero-padded to 128-row
        by 4-column tiles, each tile stored as 32 rows of (4 row groups × 4 columns)."""
        rows, cols = scales.shape
        padded = np.zeros((-(-rows // 128) * 128, -(-cols // 4) * 4), np.uint8)
        padded[:rows, :cols] = np.ascontiguousarray(scales).view(np.uint8)
        tiles = padded.reshape(-1, 128, padded.shape[1] // 4, 4).transpose(0, 2, 1, 3)
        blocked = tiles.reshape(-1, 4, 32, 4).transpose(0, 2, 1, 3).reshape(-1)
        return self.t(blocked.view(getattr(ml_dtypes, TORCH_DTYPES[fmt])), fmt)

    def _fp4(self, codes):
        """E2M1 codes (rows, K) packed two per byte, the even k in the low nibble."""
        nibbles = np.ascontiguousarray(codes).view(np.uint8) & 0x0F
        packed = (nibbles[:, 0::2] | (nibbles[:, 1::2] << 4)).astype(np.uint8)
        return self.torch.from_numpy(packed.copy()).view(self.torch.float4_e2m1fn_x2) \
            .to(self.device)

    def _block_scaled(self, inputs, params):
        torch = self.torch
        a, b, sa, sb = (inputs[n] for n in ("a", "b", "scale_a", "scale_b"))
        names = [str(x.dtype) for x in (a, b)]
        fp8 = all(n.startswith("float8_e") and "fnu" not in n for n in names)
        mx = params["variant"] == "mxf8f6f4" and fp8 and sa.dtype.name == "float8_e8m0fnu" \
            and a.shape[1] == 32 * sa.shape[1]
        nv = params["variant"] == "mxf4nvf4" and names == ["float4_e2m1fn"] * 2 and \
            sa.dtype.name == "float8_e4m3fn" and a.shape[1] == 16 * sa.shape[1]
        if not self.device.startswith("cuda") or not hasattr(torch, "_scaled_mm") or \
                params.get("choices") or not (mx or nv):
            return None
        if mx:
            fmts = [n.replace("float8_", "fp8_") for n in names]
            ta, tb = self.t(a, fmts[0]), self.t(np.ascontiguousarray(b.T), fmts[1]).t()
            scales = [self._blocked(sa, "e8m0"), self._blocked(sb.T, "e8m0")]
        else:
            ta, tb = self._fp4(a), self._fp4(np.ascontiguousarray(b.T)).t()
            scales = [self._blocked(sa, "fp8_e4m3fn"), self._blocked(sb.T, "fp8_e4m3fn")]
        d = torch._scaled_mm(ta, tb, *scales, out_dtype=torch.float32)
        return {"d": self.out(d + self.t(inputs["c"]).float())}

    def mma(self, inputs, params):
        if "scale_a" in inputs:
            return self._block_scaled(inputs, params)
        fmt, out = params["in_format"], params["out_format"]
        if fmt not in _MATMUL_FORMATS:
            return None
        if out == "fp16":
            if fmt != "fp16":
                return None
            ta, tb, tc = (self.t(inputs[n]) for n in ("a", "b", "c"))
            return {"d": self.out(tc + self.torch.matmul(ta, tb))}
        return {"d": self.out(self._addmm(inputs["a"], inputs["b"], inputs["c"], fmt))}

    def gemm(self, inputs, params):
        fmt = params["in_format"]
        sa, sb = inputs.get("scale_a"), inputs.get("scale_b")
        if fmt not in _MATMUL_FORMATS or "block_scale_a" in inputs or \
                any(s is not None and s.size > 1 for s in (sa, sb)):
            return None
        alpha = None if sa is None and sb is None else \
            float(np.float32(1 if sa is None else sa) * np.float32(1 if sb is None else sb))
        d = self._addmm(inputs["a"], inputs["b"], inputs.get("c"), fmt, alpha)
        return {"d": self.out(d.to(getattr(self.torch, TORCH_DTYPES[params["out_format"]])))}

    def fake_quant(self, inputs, params):
        aten = self.torch.ops.aten
        x, qmin, qmax = self.t(inputs["x"]), params["quant_min"], params["quant_max"]
        if params["axis"] is None:
            y, mask = aten.fake_quantize_per_tensor_affine_cachemask(
                x, float(inputs["scale"]), int(inputs["zero_point"]), qmin, qmax)
        else:
            zp = self.t(inputs["zero_point"].astype(np.int32))
            y, mask = aten.fake_quantize_per_channel_affine_cachemask(
                x, self.t(inputs["scale"]), zp, params["axis"], qmin, qmax)
        return {"y": self.out(y), "mask": self.out(mask)}

    def optim(self, inputs, params):
        torch = self.torch
        cls = {"sgd": torch.optim.SGD, "adamw": torch.optim.AdamW}[params["optimizer"]]
        hyper = dict(params["hyper"])
        if "betas" in hyper:
            hyper["betas"] = tuple(hyper["betas"])
        p = torch.nn.Parameter(self.t(inputs["p0"]))
        opt = cls([p], foreach=False, fused=False, **hyper)
        after = []
        for g in inputs["grads"]:
            p.grad = self.t(g)
            opt.step()
            after.append(self.out(p))
        state = opt.state[p]
        return {"p": np.stack(after), **{k: self.out(v) for k, v in state.items()
                                          if k in ("exp_avg", "exp_avg_sq", "momentum_buffer")}}

    def grad_scaler(self, inputs, params):
        torch = self.torch
        scaler = torch.amp.GradScaler(self.device.split(":")[0], **params)
        p = torch.nn.Parameter(torch.zeros(1, device=self.device))
        opt = torch.optim.SGD([p], lr=0.0)
        scales, trackers = [], []
        for found in inputs["found_inf"]:
            scaler.scale(torch.ones((), device=self.device))
            p.grad = torch.full((1,), float("inf") if found else 1.0, device=self.device)
            scaler.step(opt)
            scaler.update()
            state = scaler.state_dict()
            scales.append(state["scale"])
            trackers.append(state["_growth_tracker"])
        return {"scale": np.array(scales, np.float32),
                "growth_tracker": np.array(trackers, np.int32)}

    def attention(self, inputs, params):
        fmt = params["format"]
        q, k, v = (self.t(inputs[n], fmt).requires_grad_() for n in ("q", "k", "v"))
        out = self.torch.nn.functional.scaled_dot_product_attention(
            q, k, v, is_causal=params["is_causal"])
        out.backward(self.t(inputs["grad_out"], fmt))
        return {"out": self.out(out), "dq": self.out(q.grad), "dk": self.out(k.grad),
                "dv": self.out(v.grad)}


def run_torch(golden_dir, outputs_dir, *, device: str = "cpu") -> tuple[Path, int, int]:
    """Feed every golden case to PyTorch on ``device``; write ``<case>.npz`` for the cases it
    can express. Returns (outputs folder, cases written, cases skipped)."""
    torch = _import_torch()
    if not isinstance(device, str) or device.split(":")[0] not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda[:N]'; got {device!r}")
    adapter = _Adapter(torch, device)
    cases = load_suite(golden_dir)                      # the whole suite checked before writing
    outputs = [compute_outputs(getattr(adapter, case.kind), case)
               if hasattr(adapter, case.kind) else None for case in cases]
    outputs_dir = outputs_folder(golden_dir, outputs_dir)
    for case, arrays in zip(cases, outputs):
        if arrays is not None:
            save_npz(outputs_dir / f"{case.name}.npz", arrays)
    written = sum(a is not None for a in outputs)
    return outputs_dir, written, len(cases) - written
