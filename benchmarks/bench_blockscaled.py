"""Throughput of the block-scaled MMA models against numpy's float32 matmul (sgemm), same run.

Operands are quantized once (MXFP8 e4m3 with OCP scales; NVFP4 with UE4M3 scales); the timed
call is ``mpt.mma`` on the blackwell preset's block-scaled variants (decoding, scale folding or
expansion and the chained instructions), best of ``--repeat``, alternating with numpy's
``a @ b`` on float32 copies.

    python benchmarks/bench_blockscaled.py [--n 1024] [--repeat 3]

Target (issue 14, 2 cores): >= 0.05x sgemm at 1024³ for kind::mxf8f6f4 and NVFP4 (mxf4nvf4).
"""
from __future__ import annotations

import argparse
import pathlib
import sys
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import mpt  # noqa: E402
from mpt import microscaling as ms  # noqa: E402


def best(fn, repeat):
    times = []
    for _ in range(repeat):
        time.sleep(0.1)                     # let the other library's worker threads settle
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    n = args.n
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n)).astype(np.float32)
    b = rng.standard_normal((n, n)).astype(np.float32)
    cases = {
        "mxf8f6f4 e4m3/ue8m0": (ms.quantize_mx(a, "e4m3"), ms.quantize_mx(b, "e4m3", axis=0),
                                "mxf8f6f4", 32),
        "mxf4nvf4 nvfp4/ue4m3": (ms.quantize_nvfp4(a), ms.quantize_nvfp4(b, axis=0),
                                 "mxf4nvf4", 16),
    }

    def run(qa, qb, variant, block, size=n):
        return mpt.mma(qa.codes[:size, :size], qb.codes[:size, :size], model="blackwell",
                       variant=variant, scale_a=qa.scales[:size, :size // block],
                       scale_b=qb.scales[:size // block, :size])
    for case in cases.values():                              # compile and warm up
        run(*case, size=128)
    print(f"{'model':<24}{'n':>6}{'GFLOP/s':>9}{'sgemm':>8}{'x sgemm':>9}")
    for name, case in cases.items():
        t_np = best(lambda: a @ b, args.repeat)
        t = best(lambda: run(*case), args.repeat)
        ratio = t_np / t
        print(f"{name:<24}{n:>6}{2 * n**3 / t / 1e9:>9.2f}{2 * n**3 / t_np / 1e9:>8.1f}"
              f"{ratio:>9.3f}  {'ok' if ratio >= 0.05 else 'MISS'} (target 0.05)", flush=True)


if __name__ == "__main__":
    main()
