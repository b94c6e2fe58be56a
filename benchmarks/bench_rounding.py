"""Throughput of mpt.round against ml_dtypes/numpy ``astype``, measured in the same run.

    python benchmarks/bench_rounding.py                 # 10M float32 values, formats x modes
    python benchmarks/bench_rounding.py --sweep fp16    # time RNE over all 2^32 float32 inputs

Both sides allocate their output. Times are the best of ``--repeat`` runs after a warm-up call
(which includes Numba's compilation, or its load from the on-disk cache). Ratios above 1 mean
mpt is faster. Targets (issue 2, two cores): RNE >= 2x ml_dtypes for bf16, >= 5x numpy for fp16,
>= 10x ml_dtypes for e4m3fn/e5m2; stochastic >= 1.5x numpy's fp16 astype; a 2^32 sweep <= 120 s.
"""
import argparse
import sys
import time
from pathlib import Path

import ml_dtypes
import numba
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout
import mpt  # noqa: E402

BASELINE = {"bf16": ml_dtypes.bfloat16, "fp16": np.float16, "fp8_e4m3fn": ml_dtypes.float8_e4m3fn,
            "fp8_e5m2": ml_dtypes.float8_e5m2, "fp8_e4m3fnuz": ml_dtypes.float8_e4m3fnuz,
            "fp8_e5m2fnuz": ml_dtypes.float8_e5m2fnuz, "e8m0": ml_dtypes.float8_e8m0fnu,
            "fp6_e2m3fn": ml_dtypes.float6_e2m3fn, "fp4_e2m1fn": ml_dtypes.float4_e2m1fn}
# (format, mode, baseline format, target ratio or None)
CASES = [
    ("bf16", "nearest_even", "bf16", 2.0), ("fp16", "nearest_even", "fp16", 5.0),
    ("fp8_e4m3fn", "nearest_even", "fp8_e4m3fn", 10.0),
    ("fp8_e5m2", "nearest_even", "fp8_e5m2", 10.0),
    ("fp8_e4m3fnuz", "nearest_even", "fp8_e4m3fnuz", None),
    ("fp8_e5m2fnuz", "nearest_even", "fp8_e5m2fnuz", None), ("e8m0", "nearest_even", "e8m0", None),
    ("fp6_e2m3fn", "nearest_even", "fp6_e2m3fn", None),
    ("fp4_e2m1fn", "nearest_even", "fp4_e2m1fn", None),
    ("tf32", "nearest_even", "fp16", None), ("fp16", "toward_zero", "fp16", None),
    ("fp8_e4m3fn", "up", "fp8_e4m3fn", None),
    ("bf16", "stochastic", "fp16", 1.5), ("fp16", "stochastic", "fp16", 1.5),
    ("fp8_e4m3fn", "stochastic", "fp16", 1.5), ("fp8_e5m2", "stochastic", "fp16", 1.5),
]


def best_ms(fn, repeat):
    fn()  # warm-up: compilation or cache load, page faults
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * min(times)


def run_table(n, repeat, only, spread):
    x = np.random.default_rng(0).standard_normal(n).astype(np.float32)  # (n,)
    if spread:  # exercise subnormal and overflow paths too (numpy's fp16 cast slows down there)
        x *= np.float32(2.0) ** np.random.default_rng(1).integers(-12, 12, n).astype(np.float32)
    print(f"{n / 1e6:.0f}M float32 values (standard normal{' x 2^U[-12,12)' if spread else ''}), "
          f"{numba.get_num_threads()} Numba threads, best of {repeat}")
    print(f"{'format':14s}{'mode':14s}{'mpt ms':>9s}{'M/s':>8s}  {'baseline':22s}{'ms':>8s}"
          f"{'ratio':>8s}{'target':>8s}")
    baselines = {}
    for fmt, mode, base, target in CASES:
        if only and fmt not in only:
            continue
        kw = {"seed": 1} if mode == "stochastic" else {}
        ours = best_ms(lambda: mpt.round(x, fmt, mode, **kw), repeat)
        if base not in baselines:
            with np.errstate(over="ignore"):
                baselines[base] = best_ms(lambda: x.astype(BASELINE[base]), repeat)
        name = ("numpy" if base == "fp16" else "ml_dtypes") + f" {base} RNE"
        ratio = baselines[base] / ours
        verdict = "" if target is None else f"{target:.1f}x {'ok' if ratio >= target else 'MISS'}"
        print(f"{fmt:14s}{mode:14s}{ours:9.2f}{n / ours / 1e3:8.0f}  {name:22s}"
              f"{baselines[base]:8.2f}{ratio:7.1f}x{verdict:>10s}")


def run_sweep(fmt, chunk=1 << 24):
    mpt.round(np.zeros(chunk, np.float32), fmt)  # compile / load outside the timing
    inputs = rounding = 0.0
    for lo in range(0, 1 << 32, chunk):
        start = time.perf_counter()
        x = np.arange(lo, lo + chunk, dtype=np.uint32).view(np.float32)
        mid = time.perf_counter()
        mpt.round(x, fmt)
        inputs, rounding = inputs + mid - start, rounding + time.perf_counter() - mid
    print(f"{fmt}: all 2^32 float32 inputs rounded (RNE) in {rounding:.1f} s "
          f"(+{inputs:.1f} s generating the inputs), {numba.get_num_threads()} Numba threads; "
          f"target <= 120 s")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10_000_000, help="values per run (10M)")
    parser.add_argument("--repeat", type=int, default=7, help="timed runs per case (best kept)")
    parser.add_argument("--formats", nargs="*", default=None, help="only these formats")
    parser.add_argument("--threads", type=int, default=None, help="Numba threads")
    parser.add_argument("--spread", action="store_true", help="scale values by 2^U[-12,12)")
    parser.add_argument("--sweep", metavar="FORMAT", help="time an exhaustive 2^32 sweep instead")
    args = parser.parse_args(argv)
    if args.threads:
        numba.set_num_threads(args.threads)
    if args.sweep:
        run_sweep(args.sweep)
    else:
        run_table(args.n, args.repeat, args.formats, args.spread)


if __name__ == "__main__":
    main()
