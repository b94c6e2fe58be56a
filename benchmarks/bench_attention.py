"""FlashAttention and gradient checkpointing: memory (from the ledger) and time, in one run.

1. **Checkpointing** — ``mpt.nn.GPT(vocab=256, d_model=128, n_layers=8, n_heads=4, seq_len=64)``,
   batch 16, fp32, flash attention: the peak bytes of activations saved for backward during one
   forward + backward (``mpt.memory.MemoryLedger``), without and with ``checkpoint=True``
   (round(√8) = 3 segments), and the time of the step (the recomputation overhead).
2. **Attention memory** — one head, N = 4096, d = 64, fp16 inputs, Hopper model, causal: the
   bytes each backend saves for backward beyond q, k, v and the output (naive: P in fp32 and
   round_F(P); flash: the log-sum-exp).
3. **Attention time** — forward + backward of (1, 4, N, 64) fp32 attention (``ieee_fma``),
   flash against naive at N = 512, 1024, 2048.

Timings are the best of ``--repeat`` rounds, the configurations interleaved in each round (the
machine is shared). ``OMP_WAIT_POLICY=PASSIVE`` is set unless given: Numba's OpenMP workers
otherwise spin after each parallel region and steal the main thread's core.

    python benchmarks/bench_attention.py [--repeat 5] [--threads N]
"""
from __future__ import annotations

import argparse
import gc
import os
import pathlib
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import mpt  # noqa: E402
import mpt.functional as F  # noqa: E402
from mpt import nn  # noqa: E402
from mpt.autograd.memory import MemoryLedger  # noqa: E402

GPT_SHAPE = dict(vocab=256, d_model=128, n_layers=8, n_heads=4, seq_len=64)
BATCH = 16
MiB = 2.0**20


def best_of(runs: dict, repeat: int) -> dict:
    """Best wall time of each callable over ``repeat`` interleaved rounds (after a warm-up), with
    the cyclic garbage collector run before and paused during each call (as ``timeit`` does):
    collecting the previous step's graph would otherwise land in a random measurement."""
    for fn in runs.values():
        fn()
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(repeat):
        for name, fn in runs.items():
            gc.collect()
            gc.disable()
            try:
                start = time.perf_counter()
                fn()
                best[name] = min(best[name], time.perf_counter() - start)
            finally:
                gc.enable()
    return best


# ---- 1. checkpointing ----------------------------------------------------------------------------

def gpt_step(model, idx, tgt):
    model.zero_grad()
    model.loss(idx, tgt).backward()


def checkpointing(repeat: int) -> None:
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, GPT_SHAPE["vocab"], (BATCH, GPT_SHAPE["seq_len"] + 1))
    idx, tgt = tokens[:, :-1], tokens[:, 1:]
    models = {name: nn.GPT(**GPT_SHAPE, seed=0, checkpoint=ckpt)
              for name, ckpt in (("plain", False), ("checkpoint", True))}
    peaks = {}
    for name, model in models.items():
        with MemoryLedger() as ledger:
            ledger.track_module(model)
            ledger.reset_peak()
            gpt_step(model, idx, tgt)
            peaks[name] = ledger.peak_by_role["activations"]
    times = best_of({name: (lambda m=m: gpt_step(m, idx, tgt)) for name, m in models.items()},
                    repeat)
    print("1. gradient checkpointing, GPT 8 x 128 (4 heads, T=64), batch 16, fp32, flash")
    for name in models:
        print(f"   {name:<11} peak saved activations {peaks[name] / MiB:8.2f} MiB   "
              f"step {times[name] * 1e3:8.1f} ms")
    cut = 1 - peaks["checkpoint"] / peaks["plain"]
    overhead = times["checkpoint"] / times["plain"] - 1
    print(f"   sqrt(n) checkpointing (3 segments) cuts saved activations by {cut:.1%} "
          f"(target >= 50%); recompute time overhead {overhead:+.1%}")


# ---- 2. attention memory -------------------------------------------------------------------------

def attention_memory() -> None:
    n, d = 4096, 64
    rng = np.random.default_rng(1)
    extra = {}
    for backend in ("naive", "flash"):
        q, k, v = (mpt.tensor(rng.standard_normal((1, 1, n, d)), "fp16", requires_grad=True)
                   for _ in range(3))
        with MemoryLedger() as ledger:
            for t in (q, k, v):
                ledger.track(t, "activations")
            before = ledger.live("activations")
            with mpt.matmul_model("hopper"):
                out = F.scaled_dot_product_attention(q, k, v, is_causal=True, backend=backend)
            ledger.track(out, "activations")    # held by the caller anyway (and saved by flash)
            extra[backend] = ledger.live("activations") - before - out.data.nbytes
            del out
    print(f"2. attention, N={n}, d={d}, fp16, hopper, causal: bytes saved for backward beyond "
          "q, k, v and O")
    for backend in extra:
        print(f"   {backend:<6} {extra[backend]:>12,} B ({extra[backend] / MiB:9.3f} MiB)")
    print(f"   flash / naive = {extra['flash'] / extra['naive']:.4%} (target < 5%)")


# ---- 3. attention time ---------------------------------------------------------------------------

def attention_step(q, k, v, g, backend):
    for t in (q, k, v):
        t.grad = None
    F.scaled_dot_product_attention(q, k, v, backend=backend).backward(g)


def attention_time(repeat: int) -> None:
    print("3. attention forward + backward, (1, 4, N, 64) fp32, ieee_fma, not causal")
    for n in (512, 1024, 2048):
        rng = np.random.default_rng(n)
        q, k, v = (mpt.tensor(rng.standard_normal((1, 4, n, 64)), "fp32", requires_grad=True)
                   for _ in range(3))
        g = mpt.tensor(rng.standard_normal((1, 4, n, 64)), "fp32")
        best = best_of({b: (lambda b=b: attention_step(q, k, v, g, b)) for b in ("naive", "flash")},
                       repeat)
        print(f"   N={n:5d}  naive {best['naive'] * 1e3:8.1f} ms   flash {best['flash'] * 1e3:8.1f}"
              f" ms   flash/naive {best['flash'] / best['naive']:.2f}x"
              + ("  (target <= 2x)" if n in (1024, 2048) else ""))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    if args.threads:
        import numba
        numba.set_num_threads(args.threads)
    print(f"OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']}, best of {args.repeat}")
    checkpointing(args.repeat)
    attention_memory()
    attention_time(args.repeat)


if __name__ == "__main__":
    main()
