"""Throughput of every MMA preset through mpt.gemm, against numpy's float32 matmul (sgemm); and
many small products in one call against one GEMM of the same multiply-adds.

Prints GFLOP/s (2·M·N·K per second, decoding and packing included) of each preset and its
ratio to numpy sgemm measured in the same run, for 512³ and 1024³:

1. in the machine's default environment, all cores, wall-clock time: mpt.gemm and numpy's
   a @ b run alternately (a 0.1 s pause before each run lets the other library's worker
   threads stop spinning), best of several;
2. the presets with a target again, with OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE removed from
   the environment (a subprocess); threadpoolctl's view of the BLAS when it is installed;
3. the same, one thread each (NUMBA_NUM_THREADS=1, OPENBLAS_NUM_THREADS=1, a subprocess), CPU
   time of the process: per-core throughput that other jobs on a shared machine barely disturb.

Then (``--small``, also part of the default run) the small-problems table: 2,048 independent
1×16 · 16×1 products in one ``mpt.mma`` call against one 32×16 · 16×64 product (the same
32,768 multiply-adds), best of several, 2 threads and 1: the ratio of the times.

    python benchmarks/bench_mma.py [--sizes 512 1024] [--quick] [--small]

Targets (issue 17, 2 cores, at 1024³): hopper and blackwell fp16/bf16 >= 0.2x sgemm, ampere and
ada fp16 >= 0.15x, ieee_fma >= 0.5x; many small products <= 2x the one GEMM. Issue 13: cdna3
fp16 at least as fast as hopper fp16 (the last lines of each table compare their ratios, then
their times in alternating runs: a load that changes between the two presets' turns in the table
skews the first, which a shared VM shows; the median of per-round ratios resists it).
"""
from __future__ import annotations

import argparse
import os
import pathlib
import subprocess
import sys
import time

import ml_dtypes
import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import mpt  # noqa: E402

# (preset, input dtype, in_format, target ratio at 1024³ or None)
CASES = [
    ("ieee_fma", np.float32, None, 0.5),
    ("hopper", np.float16, None, 0.2),
    ("hopper", ml_dtypes.bfloat16, None, 0.2),
    ("blackwell", np.float16, None, 0.2),
    ("blackwell", ml_dtypes.bfloat16, None, 0.2),
    ("ampere", np.float16, None, 0.15),
    ("ada", np.float16, None, 0.15),
    ("hopper", ml_dtypes.float8_e4m3fn, None, None),
    ("cdna3", np.float16, None, None),
    ("volta", np.float16, None, None),
    ("turing", np.float16, None, None),
    ("ampere", np.float32, "tf32", None),
    ("ada", ml_dtypes.float8_e4m3fn, None, None),
    ("blackwell", ml_dtypes.float8_e4m3fn, None, None),
    ("ieee_mul_add", np.float32, None, None),
    ("exact", ml_dtypes.bfloat16, None, None),
    ("cdna3", ml_dtypes.bfloat16, None, None),
    ("cdna3", np.float32, "tf32", None),
    ("cdna3", ml_dtypes.float8_e4m3fnuz, None, None),
    ("cdna2", ml_dtypes.bfloat16, None, None),
    ("cdna1", np.float16, None, None),
    ("cdna4", ml_dtypes.float8_e4m3fn, None, None),
]
#: issue 13: cdna3 fp16 at least as fast as hopper fp16 (a target relative to another preset)
RELATIVE = (("cdna3", "float16"), ("hopper", "float16"))
SMALL_TARGET = 2.0   # many small products / one GEMM of the same multiply-adds
CLOCK = time.perf_counter


def timed(fn):
    """Time of fn() on CLOCK, after a pause that lets the other library's worker threads
    (Numba's OpenMP pool, OpenBLAS's) stop spinning: a spinning pool slows the other down."""
    time.sleep(0.1)
    t = CLOCK()
    fn()
    return CLOCK() - t


def alternating(fns, rounds, budget):
    """Times of each of fns, run in turn for up to ``rounds`` rounds (fewer once ``budget``
    seconds have passed), after one warm-up run each (which also compiles), so that all see the
    same load: one array per function, a time per round."""
    for fn in fns:
        fn()
    times = [[] for _ in fns]
    start = time.perf_counter()
    for _ in range(rounds):
        for runs, fn in zip(times, fns):
            runs.append(timed(fn))
        if time.perf_counter() - start > budget:
            break
    return [np.array(t) for t in times]


def interleaved(fn, n, reps, budget=4.0):
    """Best times of fn() and of numpy's a @ b (float32, n x n), run alternately
    (:func:`alternating`)."""
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((n, n)).astype(np.float32) for _ in range(2))
    t_np, t_fn = alternating([lambda: a @ b, fn], reps, budget)
    return t_fn.min(), t_np.min()


def table(sizes, cases):
    print(f"{'preset':<13}{'input':<15}{'n':>5}{'GFLOP/s':>9}{'sgemm':>8}{'x sgemm':>9}"
          f"{'target':>8}")
    for n in sizes:
        rng = np.random.default_rng(n)
        x, y = (rng.standard_normal((n, n)).astype(np.float32) for _ in range(2))
        ratios = {}
        for model, dtype, in_format, target in cases:
            a, b = x.astype(dtype), y.astype(dtype)
            t, t_np = interleaved(lambda: mpt.gemm(a, b, model=model, in_format=in_format), n,
                                  reps=1 if model == "exact" else 10)
            ratio = ratios[model, in_format or np.dtype(dtype).name] = t_np / t
            mark = "" if target is None or n < 1024 else \
                f"{target:>5.2f} {'ok' if ratio >= target else 'MISS'}"
            label = in_format or np.dtype(dtype).name
            print(f"{model:<13}{label:<15}{n:>5}{2 * n**3 / t / 1e9:>9.2f}"
                  f"{2 * n**3 / t_np / 1e9:>8.1f}{ratio:>9.3f}  {mark}", flush=True)
        amd, nvidia = (ratios.get(key) for key in RELATIVE)
        if amd and nvidia:
            print(f"cdna3 fp16 / hopper fp16 at n={n}: {amd / nvidia:.2f} (issue 13: >= 1) "
                  f"{'ok' if amd >= nvidia else 'MISS'}", flush=True)
            best, median = paired(relative_gemms(x, y))
            print(f"  the same, the two run alternately: {best:.2f} (best of each), "
                  f"{median:.2f} (median of the rounds' ratios)", flush=True)


def relative_gemms(x, y):
    """mpt.gemm of float32 x and y, cast to its input, for each preset that RELATIVE compares."""
    def gemm(model, dtype):
        a, b = x.astype(dtype), y.astype(dtype)
        return lambda: mpt.gemm(a, b, model=model)
    return [gemm(model, np.dtype(name)) for model, name in RELATIVE]


def paired(fns, rounds=12, budget=8.0):
    """Speed of fns[0] relative to fns[1] (time of fns[1] / time of fns[0]) from alternating runs
    (:func:`alternating`): the ratio of their best times, and the median of the per-round ratios
    (a load that comes and goes between the runs of one round cancels out there)."""
    first, second = alternating(fns, rounds, budget)
    return second.min() / first.min(), float(np.median(second / first))


def small_table():
    """2,048 independent 1x16 · 16x1 products in one call against one 32x16 · 16x64 product (the
    same multiply-adds), alternately, best of 30: the ratio of the times."""
    rng = np.random.default_rng(0)
    print(f"{'preset':<13}{'input':<10}{'batched ms':>11}{'one GEMM ms':>12}{'ratio':>7}"
          f"{'target':>8}")
    for model, dtype in (("hopper", np.float16), ("hopper", ml_dtypes.bfloat16),
                         ("ampere", np.float16), ("ieee_fma", np.float32)):
        a = rng.standard_normal((2048, 1, 16)).astype(np.float32).astype(dtype)
        b = rng.standard_normal((2048, 16, 1)).astype(np.float32).astype(dtype)
        x = rng.standard_normal((32, 16)).astype(np.float32).astype(dtype)
        y = rng.standard_normal((16, 64)).astype(np.float32).astype(dtype)
        runs = {"batched": lambda: mpt.mma(a, b, model=model),
                "one": lambda: mpt.mma(x, y, model=model)}
        best = {name: float("inf") for name in runs}
        for fn in runs.values():
            fn()
        for _ in range(30):
            for name, fn in runs.items():
                t = CLOCK()
                fn()
                best[name] = min(best[name], CLOCK() - t)
        ratio = best["batched"] / best["one"]
        print(f"{model:<13}{np.dtype(dtype).name:<10}{best['batched'] * 1e3:>11.3f}"
              f"{best['one'] * 1e3:>12.3f}{ratio:>7.2f}  {SMALL_TARGET:>4.1f} "
              f"{'ok' if ratio <= SMALL_TARGET else 'MISS'}", flush=True)


def blas_info():
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        print("threadpoolctl: not installed")
        return
    for pool in threadpool_info():
        print(f"threadpoolctl: {pool.get('internal_api')} {pool.get('version')} "
              f"threads={pool.get('num_threads')} architecture={pool.get('architecture')}")


def subprocess_table(args, note, env, extra=()):
    print(f"\n{note}", flush=True)
    cmd = [sys.executable, __file__, "--child", "--quick", "--sizes", *map(str, args.sizes), *extra]
    subprocess.run(cmd, env=env, check=True)


def main():
    global CLOCK
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[512, 1024])
    parser.add_argument("--quick", action="store_true",
                        help="only the presets with a target (absolute or relative)")
    parser.add_argument("--small", action="store_true",
                        help="only the many-small-products table (2 threads and 1)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--cpu-time", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    cases = ([c for c in CASES if c[3] is not None or (c[0], np.dtype(c[1]).name) in RELATIVE]
             if args.quick else CASES)
    if args.cpu_time:
        CLOCK = time.process_time
    keys = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "OPENBLAS_NUM_THREADS", "NUMBA_NUM_THREADS")
    print(f"cpus {os.cpu_count()}, numpy {np.__version__}, "
          + ", ".join(f"{k}={os.environ.get(k, '<unset>')}" for k in keys))
    blas_info()
    if args.small:
        small_table()
        if not args.child:
            one = dict(os.environ, NUMBA_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
            subprocess_table(args, "one thread:", one, ["--small"])
        return
    table(args.sizes, cases)
    if args.child:
        return
    unset = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
    env = {k: v for k, v in os.environ.items() if k not in unset}
    subprocess_table(args, "with OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset:", env)
    one = dict(env, NUMBA_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    subprocess_table(args, "one thread each, process CPU time (robust to other load):", one,
                     ["--cpu-time"])
    print("\nmany small products in one call:", flush=True)
    small_table()
    subprocess_table(args, "many small products, one thread:", one, ["--small"])


if __name__ == "__main__":
    main()
