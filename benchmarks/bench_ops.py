"""Throughput of the float32 tanh ops of mpt.kernels.ops (tanh, sigmoid, gelu_tanh, silu forward;
gelu_tanh and silu backward) against numpy's float32 ``np.tanh``, measured in the same run.

    python benchmarks/bench_ops.py                  # 1M N(0, 1) values, 1 and 2 Numba threads
    python benchmarks/bench_ops.py --n 4000000 --threads 2

Times are the best of ``--repeat`` runs after a warm-up call (Numba's compilation, or its load
from the on-disk cache). "x np.tanh" is the time of one np.tanh call over the time of the op:
numpy's single-precision tanh is a rounding-free SIMD baseline, so it normalizes the load of a
shared machine. Issue 17: the gelu_tanh kernels at 1M elements (the small GPT step's GELU) were
~6 ns per element on one thread before their vectorized float64 path was rewritten.
"""
import argparse
import sys
import time
from pathlib import Path

import numba
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout
from mpt.kernels import ops  # noqa: E402

OPS = ["tanh", "sigmoid", "gelu_tanh", "silu"]


def best_s(fn, repeat):
    fn()  # warm-up
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def run(n, repeat, threads):
    rng = np.random.default_rng(0)
    x = rng.standard_normal(n).astype(np.float32)  # (n,)
    g = (rng.standard_normal(n) * 1e-3).astype(np.float32)  # (n,)
    numba.set_num_threads(threads)
    base = best_s(lambda: np.tanh(x), repeat)
    print(f"{n / 1e6:g}M float32 N(0, 1) values, {threads} Numba thread(s), best of {repeat}; "
          f"np.tanh {1e9 * base / n:.2f} ns/element")
    print(f"{'op':12s}{'direction':>10s}{'ns/elem':>9s}{'x np.tanh':>11s}")
    for name in OPS:
        code = ops.UNARY_OPS[name]
        cases = [("forward", lambda: ops.unary(x, code))]
        if name in ("gelu_tanh", "silu"):
            cases.append(("backward", lambda: ops.unary_backward(x, g, code)))
        for direction, fn in cases:
            t = best_s(fn, repeat)
            print(f"{name:12s}{direction:>10s}{1e9 * t / n:9.2f}{t / base:10.1f}x")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1 << 20, help="values per run (2^20)")
    parser.add_argument("--repeat", type=int, default=15, help="timed runs per case (best kept)")
    parser.add_argument("--threads", type=int, nargs="*", default=[1, 2], help="Numba threads")
    args = parser.parse_args(argv)
    for threads in args.threads:
        run(args.n, args.repeat, threads)


if __name__ == "__main__":
    main()
