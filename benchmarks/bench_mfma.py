"""Throughput of the AMD MFMA kernels against the Hopper preset and numpy's sgemm, same run.

The CDNA3 fp16/bf16 GEMM (``mpt.kernels.mfma.MFMAOperands`` on its register-blocked path,
decoding and packing included) next to ``mpt.gemm(model="hopper")`` fp16, each as a ratio to
numpy's float32 matmul measured alternately with it (``bench_mma.interleaved``). Target (issue
13): cdna3 fp16 at 1024³ at least as fast as hopper fp16.

    python benchmarks/bench_mfma.py [--sizes 512 1024] [--cpu-time]

``--cpu-time``: process CPU time instead of wall-clock time (run it with NUMBA_NUM_THREADS=1
OPENBLAS_NUM_THREADS=1 for per-core figures that other jobs on a shared machine barely disturb).
"""
from __future__ import annotations

import argparse
import pathlib
import sys
import time

import ml_dtypes
import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import bench_mma  # noqa: E402
import mpt  # noqa: E402
from mpt.kernels.mfma import MFMAOperands  # noqa: E402
from mpt.kernels.mfma_variants import default_variant  # noqa: E402


def cdna3(a, b, fmt):
    """D = A·B on the cdna3 model's default instruction for fmt (one batch element)."""
    v = default_variant("cdna3", fmt, fmt)
    zero = np.zeros(1, np.int64)
    ops = MFMAOperands(v, a[None], b[None], zero, zero, fmt, fmt)
    acc = ops.new_acc()
    ops.chain(acc, 0, a.shape[1])
    return ops.values(acc)[0]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[512, 1024])
    parser.add_argument("--cpu-time", action="store_true")
    args = parser.parse_args()
    if args.cpu_time:
        bench_mma.CLOCK = time.process_time
    print(f"{'model':<8}{'input':<7}{'n':>6}{'GFLOP/s':>9}{'x sgemm':>9}")
    for n in args.sizes:
        rng = np.random.default_rng(n)
        x, y = (rng.standard_normal((n, n)).astype(np.float32) for _ in range(2))
        cases = [("hopper", "fp16", lambda a, b: mpt.gemm(a, b, model="hopper"), np.float16),
                 ("cdna3", "fp16", lambda a, b: cdna3(a, b, "fp16"), np.float16),
                 ("cdna3", "bf16", lambda a, b: cdna3(a, b, "bf16"), ml_dtypes.bfloat16)]
        for model, fmt, fn, dtype in cases:
            a, b = x.astype(dtype), y.astype(dtype)
            t, t_np = bench_mma.interleaved(lambda: fn(a, b), n, reps=10)
            print(f"{model:<8}{fmt:<7}{n:>6}{2 * n**3 / t / 1e9:>9.2f}{t_np / t:>9.3f}",
                  flush=True)


if __name__ == "__main__":
    main()
