"""AdamW step time: mpt's unfused and fused paths, fp32 and bf16 master weights, against
``torch.optim.AdamW`` on CPU (single-tensor and fused) when torch is installed.

Prints the best of ``--repeat`` timings per configuration (the machine is shared: best-of is the
least noisy) and the ratio to the fastest torch configuration measured in the same run.

    python benchmarks/bench_optim.py [--n 4000000] [--repeat 5]
"""
import argparse
import time

import numpy as np

from mpt.autograd.tensor import Tensor
from mpt.nn import Parameter
from mpt.optim import AdamW


def best_time(step, repeat):
    step()                                          # warm-up (Numba compilation, allocations)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return min(times)


def mpt_case(n, dtype, fused, master):
    rng = np.random.default_rng(0)
    p = Parameter(rng.standard_normal(n).astype(np.float32).astype(dtype))
    p.grad = Tensor(rng.standard_normal(n).astype(np.float32).astype(dtype))
    opt = AdamW([p], fused=fused, master_weights=master)
    return opt.step


def torch_case(torch, n, **options):
    p = torch.nn.Parameter(torch.randn(n))
    p.grad = torch.randn(n)
    opt = torch.optim.AdamW([p], **options)
    return opt.step


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=4_000_000, help="parameters")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    import ml_dtypes
    cases = {
        "mpt fp32 unfused": mpt_case(args.n, np.float32, False, False),
        "mpt fp32 fused": mpt_case(args.n, np.float32, True, False),
        "mpt bf16+master unfused": mpt_case(args.n, ml_dtypes.bfloat16, False, True),
        "mpt bf16+master fused": mpt_case(args.n, ml_dtypes.bfloat16, True, True),
    }
    try:
        import torch
        cases["torch fp32 foreach=False"] = torch_case(torch, args.n, foreach=False)
        cases["torch fp32 fused=True"] = torch_case(torch, args.n, fused=True)
    except ImportError:
        torch = None
    times = {name: best_time(step, args.repeat) for name, step in cases.items()}
    baseline = min((t for k, t in times.items() if k.startswith("torch")), default=None)
    print(f"AdamW step, {args.n} parameters, best of {args.repeat}")
    for name, t in times.items():
        ratio = f"  {t / baseline:5.2f}x torch best" if baseline else ""
        print(f"{name:26s} {t * 1e3:8.2f} ms  {args.n / t / 1e6:7.1f} Mparam/s{ratio}")


if __name__ == "__main__":
    main()
