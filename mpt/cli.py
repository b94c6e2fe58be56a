"""L5: the ``mpt`` command.

    mpt formats [--json]                   the format table
    mpt round X [X ...] [--to F ...] [--mode M] [--saturate] [--seed S] [--json]
                                           round numbers to formats, show values, bits and errors
    mpt demo                               the default workload: the table and a rounding tour
    mpt golden generate [--suite S] [--out DIR] [--seed N] [--force] [--quiet]
                        [--workers N | --scheduler ADDRESS]   one task per case, same bits
    mpt golden run --golden DIR --outputs DIR        recompute the golden cases with mpt
    mpt golden verify --golden DIR --outputs DIR [--report FILE] [--allow-missing]
                      [--expect-digest HEX]
    mpt golden run-torch --golden DIR --outputs DIR [--device cpu|cuda]
                                           the same cases through PyTorch (optional dependency)
    mpt study [--recipes R ...] [--steps N] [--text FILE] [--out DIR] [--seed S] [--no-plots]
              [--no-quant] [--target T] [--compare-targets [T ...]]
                                           train a small GPT under every precision recipe
    mpt study --grid [--recipes R ...] [--seeds S ...] [--sizes SIZE ...] [--lrs LR ...]
              [--baseline R] [--workers N | --scheduler ADDRESS] [--steps N] [--out DIR]
                                           a grid of runs, one task per cell (serial or Dask),
                                           the loss over seeds and the differences beyond it
    mpt plan [--recipe R] [--vocab V] [--d-model D] [--layers L] [--heads H] [--seq S]
             [--batch B] [--checkpoint K] [--backend flash|naive]
                                           training memory per role for a GPT shape and recipe
    mpt characterize --adapter mpt:<model>|torch:cuda|torch:rocm [--pair IN:OUT ...]
                     [--variant V] [--assume NAME=CHOICE ...] [--fault F-1] [--expect MODEL]
                     [--out FILE] [--max-differences N]
                                           what does this matrix unit do? (docs/characterize.md)

``python -m mpt ...`` runs the same command. Numbers may be negative (``mpt round -inf -2.5
-0x1p-3``): an argument that reads as a number is a value, never an option.

Exit status: 0 success; 1 a check ran and failed (``golden verify`` found mismatches,
``characterize --expect`` a model that does not match); 2 bad
input — a usage error (argparse) or a value, file or folder the command cannot use. Errors are
one line on stderr (``mpt COMMAND: error: ...``), never a Python traceback; 130 on Ctrl-C.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from fractions import Fraction

import numpy as np

from mpt._tables import markdown_table, text_table
from mpt.formats import FORMATS, RoundingMode, get_format
from mpt.runtime import retain_freed_memory
from mpt.testing import as_bits

DEMO_VALUES = ("0.1", "1/3", "65519.99", "1e-8", "300", "-2.5e-05")
DEMO_FORMATS = ("fp32", "tf32", "fp16", "bf16", "fp8_e4m3fn", "fp8_e5m2")


def _fmt_float(x: float) -> str:
    return f"{x:.9g}"


def format_table() -> str:
    """The format table as aligned text."""
    head = ("name", "bits", "e", "m", "bias", "max", "min normal", "min subnormal", "eps",
            "inf", "nan", "dtype")
    rows = [head]
    for f in FORMATS.values():
        floaty = f.kind == "float"
        rows.append((
            f.name, str(f.bits), str(f.exponent_bits) if floaty else "-",
            str(f.mantissa_bits) if floaty else "-", str(f.bias) if floaty else "-",
            _fmt_float(f.max), _fmt_float(f.min_normal) if floaty else "-",
            _fmt_float(f.min_subnormal) if floaty else "-", _fmt_float(f.eps) if floaty else "-",
            "yes" if f.has_inf else "no", f.nan if floaty else "-", np.dtype(f.dtype).name,
        ))
    return text_table(rows)


EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130


def _parse_value(text: str) -> float:
    """A decimal, hex float (0x1.8p-3) or fraction (1/3), converted to the nearest float64
    (±inf beyond its range, in all three notations, as ``float("1e999")`` gives)."""
    try:
        if text.lower().lstrip("+-").startswith("0x"):
            return float.fromhex(text)
        return float(Fraction(text)) if "/" in text else float(text)
    except OverflowError:
        return -math.inf if text.lstrip().startswith("-") else math.inf
    except (ValueError, ZeroDivisionError):
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None


def _is_number(text: str) -> bool:
    try:
        _parse_value(text)
    except argparse.ArgumentTypeError:
        return False
    return True


class _Parser(argparse.ArgumentParser):
    """argparse with one change: an argument that reads as a number (``-inf``, ``-2.5``,
    ``-0x1p-3``, ``-1/3``) is a value, never an option (argparse only knows ``-2.5``-like ones).
    No option of mpt looks like a number, so nothing is lost."""

    def _parse_optional(self, arg_string):
        if arg_string.startswith("-") and _is_number(arg_string):
            return None
        return super()._parse_optional(arg_string)


def round_rows(values, formats, mode="nearest_even", *, saturate=False, seed=None):
    """One dict per (value, format): the rounded value, its bits and the relative error."""
    from mpt.rounding import round as round_format  # L1, imported when the command needs it

    x = np.array(values, dtype=np.float64)
    rows = []
    for name in formats:
        fmt = get_format(name)
        with np.errstate(over="ignore", invalid="ignore"):
            y = round_format(x, fmt, mode, saturate=saturate, seed=seed)
            back = y.astype(np.float64)
        bits = as_bits(y, fmt)
        width = max(1, (fmt.bits + 3) // 4)
        for v, r, b in zip(x.tolist(), back.tolist(), bits.tolist()):
            err = ((r - v) / v if r != v else 0.0) if v != 0 and np.isfinite(r) else float("nan")
            rows.append({"input": v, "format": fmt.name, "value": r,
                         "bits": f"0x{int(b):0{width}x}", "relative_error": err})
    return rows


def _print_rows(rows) -> None:
    print(f"{'input':>14}  {'format':<13} {'rounded':>16}  {'bits':<10}  relative error")
    for r in rows:
        err = "" if np.isnan(r["relative_error"]) else f"{r['relative_error']:+.3e}"
        print(f"{_fmt_float(r['input']):>14}  {r['format']:<13} {_fmt_float(r['value']):>16}  "
              f"{r['bits']:<10}  {err}")


def _cmd_formats(args) -> int:
    if args.json:
        print(json.dumps([f.describe() for f in FORMATS.values()], indent=2))
    else:
        print(format_table())
    return 0


def _cmd_models(args) -> int:
    from mpt.engines import mma_models, models_table_rows  # L1, imported when needed

    rows = models_table_rows()
    print(json.dumps([m.describe() for m in mma_models().values()], indent=2) if args.json
          else markdown_table(rows) if args.markdown else text_table(rows))
    return 0


def _cmd_targets(args) -> int:
    from mpt.targets import targets, targets_table_rows  # L1, imported when needed

    rows = targets_table_rows()
    print(json.dumps([t.describe() for t in targets().values()], indent=2) if args.json
          else markdown_table(rows) if args.markdown else text_table(rows))
    return 0


def _cmd_round(args) -> int:
    rows = round_rows(args.values, args.to, args.mode, saturate=args.saturate, seed=args.seed)
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        _print_rows(rows)
    return 0


def _cmd_demo(args) -> int:
    print("mpt: every rounding of mixed-precision training, explicit and bit-exact.\n")
    print("The formats:\n")
    print(format_table())
    print("\nRound to nearest even of a few numbers (what a cast on a GPU does):\n")
    _print_rows(round_rows([_parse_value(v) for v in DEMO_VALUES], DEMO_FORMATS))
    print("\nfp16 cannot hold 1e-8 (it underflows to 0) and e4m3fn has no Inf (300 fits, 65519.99"
          "\noverflows to NaN); bf16 keeps fp32's range with 8 bits of precision.")
    return 0


def _cmd_golden(args) -> int:
    from mpt import golden

    if args.action == "generate":
        golden.check_target(args.out, force=args.force)     # refuse before computing the cases
        cases = golden.generate(args.suite, seed=args.seed, workers=args.workers,
                                scheduler=args.scheduler, progress=not args.quiet)
        out = golden.write_suite(cases, args.out, suite=args.suite, force=args.force)
        print(f"wrote {len(cases)} cases of suite {args.suite!r} to {out}")
        print(f"suite digest: {golden.read_manifest(out)['digest']}")
        return 0
    if args.action == "run":
        out = golden.run_mpt(args.golden, args.outputs)
        print(f"wrote mpt's outputs for {args.golden} to {out}")
        return 0
    if args.action == "run-torch":
        from mpt.golden.torch import run_torch

        try:
            out, written, skipped = run_torch(args.golden, args.outputs, device=args.device)
        except ImportError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        print(f"wrote PyTorch's outputs for {written} cases to {out} ({skipped} cases it cannot "
              "express skipped: verify with --allow-missing)")
        return 0
    rows = golden.verify(args.golden, args.outputs, allow_missing=args.allow_missing,
                         expect_digest=args.expect_digest)
    print(golden.format_report(rows))
    print(f"suite digest: {golden.read_manifest(args.golden)['digest']}"
          + (" (as expected)" if args.expect_digest else ""))
    if args.report:
        golden.write_json_atomic(args.report, rows)
    return 0 if golden.passed(rows) else 1


def _add_golden(sub) -> None:
    p = sub.add_parser("golden", help="generate golden outputs or verify a backend against them")
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    g = actions.add_parser("generate", help="compute a suite of golden cases with mpt")
    g.add_argument("--suite", default="default")
    g.add_argument("--out", default="reference_results/default", metavar="DIR",
                   help="a new or empty folder, or one holding a suite (with --force)")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--force", action="store_true",
                   help="replace the golden suite already in --out (only its own files)")
    g.add_argument("--quiet", action="store_true", help="no progress bar")
    _add_dask_options(g, "compute the cases", "the same bits as serially")
    r = actions.add_parser("run", help="recompute a golden suite's outputs with mpt")
    v = actions.add_parser("verify", help="compare a backend's outputs with a golden suite")
    t = actions.add_parser("run-torch", help="run a golden suite's inputs through PyTorch")
    t.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    for q in (r, v, t):
        q.add_argument("--golden", required=True, metavar="DIR")
        q.add_argument("--outputs", required=True, metavar="DIR")
    v.add_argument("--report", metavar="FILE", help="also write the table as JSON")
    v.add_argument("--allow-missing", action="store_true",
                   help="cases without an output file are skipped, not failed")
    v.add_argument("--expect-digest", metavar="HEX",
                   help="fail unless the suite's digest (printed by verify and generate) is HEX")
    p.set_defaults(func=_cmd_golden)


_GRID_ONLY = ("seeds", "sizes", "lrs", "baseline", "workers", "scheduler")


def _add_dask_options(parser, what: str, note: str) -> None:
    """--workers N (a local Dask cluster) or --scheduler ADDRESS (an existing one)."""
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--workers", type=int, metavar="N",
                       help=f"{what} on a local Dask cluster of N processes "
                            f"(pip install 'mpt[dask]'); {note}")
    where.add_argument("--scheduler", metavar="ADDRESS",
                       help=f"{what} on an existing Dask cluster (tcp://host:8786)")


def _cmd_study(args) -> int:
    from mpt import study

    if args.grid:
        return _cmd_study_grid(args)
    given = [f"--{k}" for k in _GRID_ONLY if getattr(args, k) is not None]
    if given:
        raise ValueError(f"{', '.join(given)} need --grid")
    given = {"recipes": args.recipes, "steps": args.steps, "text": args.text, "seed": args.seed,
             "target": args.target}
    if args.compare_targets is not None:
        from mpt.study.targets import default_targets
        given["compare_targets"] = tuple(args.compare_targets) or default_targets()
    config = study.StudyConfig(quant=not args.no_quant,
                               **{k: v for k, v in given.items() if v is not None})
    os.makedirs(args.out, exist_ok=True)    # an unusable --out fails now, not after the runs
    result = study.run_study(config, progress=not args.quiet)
    print(study.format_table(result))
    if result.targets is not None:
        from mpt.study.targets import format_targets_section
        print("\n" + format_targets_section(result.targets))
    if result.quant is not None:
        print("\n" + study.format_quant_sections(result.quant))
    paths = study.write_report(result, args.out, plots=not args.no_plots)
    print(f"\nreport: {paths['report']}  (data: {paths['json'].name}"
          + "".join(f", {p.name}" for p in paths["plots"]) + ")")
    if paths["plots_skipped"]:
        print(f"plots skipped: {paths['plots_skipped']}")
    return 0


def _cmd_study_grid(args) -> int:
    from mpt import study

    if args.seed is not None:
        raise ValueError("--seed sets one run; a grid takes --seeds S [S ...]")
    workload = {"steps": args.steps, "text": args.text, "target": args.target}
    axes = {"recipes": args.recipes, "seeds": args.seeds, "sizes": args.sizes, "lrs": args.lrs,
            "baseline": args.baseline}
    config = study.GridConfig(
        study=study.StudyConfig(quant=False,
                                **{k: v for k, v in workload.items() if v is not None}),
        **{k: v for k, v in axes.items() if v is not None})
    os.makedirs(args.out, exist_ok=True)
    result = study.run_grid(config, workers=args.workers, scheduler=args.scheduler,
                            progress=not args.quiet)
    print(study.format_grid_table(result))
    paths = study.write_grid_report(result, args.out)
    print(f"\nreport: {paths['report']}  (data: {paths['json'].name})")
    return 0


def _add_study(sub) -> None:
    p = sub.add_parser("study", help="train a small GPT under every precision recipe and "
                                     "compare (the default workload of the README)")
    p.add_argument("--recipes", nargs="+", metavar="RECIPE",
                   help="recipes to run (default: all; an unknown name lists the valid ones)")
    p.add_argument("--target", help="the hardware model to train on (default h100; `mpt targets` "
                                    "lists them)")
    p.add_argument("--compare-targets", nargs="*", metavar="TARGET",
                   help="also train the network on these chips' models side by side (bf16-amp "
                        "and each chip's own recipes; no names: h100, mi300x or a100, tpu, "
                        "gaudi3, trn2)")
    p.add_argument("--steps", type=int, help="optimizer steps per recipe (default 400)")
    p.add_argument("--text", metavar="FILE", help="train on this file's bytes instead of the "
                                                  "synthetic Markov corpus")
    p.add_argument("--seed", type=int, help="seed of the initialisation, the batch order and "
                                            "stochastic rounding (default 0)")
    p.add_argument("--out", default="mpt-study", metavar="DIR",
                   help="report folder (default: mpt-study)")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument("--no-quant", action="store_true", help="skip the quantization sections (QAT "
                                                         "vs PTQ, LoRA over low-precision bases)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    g = p.add_argument_group("grid", "recipes x seeds x model sizes x learning rates, one task "
                                     "per cell; the final loss over the seeds (mean, spread) and "
                                     "the recipe differences beyond the spread")
    g.add_argument("--grid", action="store_true", help="run a grid (no quantization sections)")
    g.add_argument("--seeds", nargs="+", type=int, metavar="S",
                   help="seed coordinates; each cell's run seed is derived from its own "
                        "(default 0 1 2)")
    g.add_argument("--sizes", nargs="+", metavar="SIZE",
                   help="model sizes: tiny (16:1:2), small (32:1:2), base (64:2:4, the study's), "
                        "large (128:4:8), or D_MODEL:LAYERS:HEADS (default small)")
    g.add_argument("--lrs", nargs="+", type=float, metavar="LR",
                   help="peak learning rates; min_lr = lr/10 (default 3e-3)")
    g.add_argument("--baseline", metavar="RECIPE", help="the recipe the others are compared "
                                                        "with (default fp32, else the first)")
    _add_dask_options(g, "run the cells", "default: serially in this process")
    p.set_defaults(func=_cmd_study)


def _cmd_plan(args) -> int:
    from mpt import planning  # L5, imported when the command needs it

    shape = planning.GPTShape(args.vocab, args.d_model, args.layers, args.heads, args.seq,
                              args.mlp_ratio)
    est = planning.training_memory(shape, args.recipe, args.batch, checkpoint=args.checkpoint,
                                   backend=args.backend)
    print(planning.format_memory_table(est))
    return 0


def _add_plan(sub) -> None:
    p = sub.add_parser("plan", help="training memory per role (weights, grads, master, optimizer, "
                                    "activations) of a GPT shape under a recipe")
    p.add_argument("--recipe", default="bf16-o2", help="precision recipe (default bf16-o2)")
    for flag, default, what in (("--vocab", 50304, "vocabulary"), ("--d-model", 768, "width"),
                                ("--layers", 12, "blocks"), ("--heads", 12, "attention heads"),
                                ("--seq", 1024, "sequence length"),
                                ("--mlp-ratio", 4, "MLP hidden / width"),
                                ("--batch", 8, "sequences per micro-batch"),
                                ("--checkpoint", 0, "checkpoint segments (0: none)")):
        p.add_argument(flag, type=int, default=default, help=f"{what} (default {default})")
    p.add_argument("--backend", default="flash", choices=("flash", "naive"),
                   help="attention backend (default flash)")
    p.set_defaults(func=_cmd_plan)


def _cmd_characterize(args) -> int:
    from mpt.characterize import characterize, get_adapter  # L5, imported when needed

    assume = {}
    for item in args.assume or ():
        name, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--assume must be NAME=CHOICE; got {item!r}")
        assume[name] = value
    fault = None
    if args.fault is not None:
        if not re.fullmatch(r"F[+-]\d+", args.fault):
            raise ValueError(f"--fault must be F-1, F+2, ... (a change of the alignment width F); "
                             f"got {args.fault!r}")
        fault = int(args.fault[1:])
    pairs = None
    if args.pair:
        pairs = []
        for item in args.pair:
            fin, sep, fout = item.partition(":")
            if not sep:
                raise ValueError(f"--pair must be INPUT:OUTPUT (e.g. fp16:fp32); got {item!r}")
            pairs.append((get_format(fin).name, get_format(fout).name))
    try:
        adapter = get_adapter(args.adapter, variant=args.variant, assume=assume, fault=fault)
    except ImportError as exc:          # torch:... without PyTorch
        print(f"mpt characterize: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    result = characterize(adapter, pairs, expect=args.expect)
    print(result.text(max_differences=args.max_differences))
    if args.out:
        result.write(args.out)
        print(f"\nwrote {args.out}: mpt.engines.load_model({args.out!r}) gives "
              + ("the model above" if result.model is not None else "an error (no model)"))
    if args.expect is not None and not result.matches(args.expect):
        return EXIT_FAILED
    return 0


def _add_characterize(sub) -> None:
    p = sub.add_parser("characterize", help="probe a matrix unit (a GPU through torch, or an mpt "
                                            "model) and name the MMA model that matches")
    p.add_argument("--adapter", required=True, metavar="SPEC",
                   help="mpt:<model> (the CPU reference of a registered model), torch:cuda[:N] "
                        "or torch:rocm[:N] (PyTorch on the GPU; never run by mpt's tests)")
    p.add_argument("--pair", nargs="+", metavar="IN:OUT",
                   help="format pairs to probe (default: every pair the adapter computes)")
    p.add_argument("--variant", help="instruction variant of an mpt model (default: the one "
                                     "mpt.mma picks per input format; the others are listed as "
                                     "not probed); block-scaled ones run with unit scales")
    p.add_argument("--assume", nargs="+", metavar="NAME=CHOICE",
                   help="choices of an mpt model's assumed rules (the report says which the "
                        "probes settle)")
    p.add_argument("--fault", metavar="F-1", help="inject a fault into an mpt model: its "
                                                  "alignment width F changed by this much "
                                                  "(block models, Gaudi 2)")
    p.add_argument("--expect", metavar="MODEL", help="also list every difference from this "
                                                     "registered model; exit 1 unless it matches")
    p.add_argument("--out", metavar="FILE", help="write the result as JSON (mpt.engines."
                                                 "load_model reads the model back)")
    p.add_argument("--max-differences", type=int, metavar="N",
                   help="print at most N differing probes per model (default: all)")
    p.set_defaults(func=_cmd_characterize)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="mpt", description=__doc__.split("\n")[0],
                     epilog="Exit status: 0 success, 1 a check failed (golden verify), 2 bad "
                            "input (one line on stderr, no traceback), 130 interrupted.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    p = sub.add_parser("formats", help="print the format table")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_cmd_formats)
    p = sub.add_parser("round", help="round numbers to formats and show the bits")
    p.add_argument("values", nargs="+", type=_parse_value, metavar="X",
                   help="decimal, hex float (0x1p-24) or fraction (1/3)")
    p.add_argument("--to", nargs="+", default=["fp16", "bf16", "fp8_e4m3fn", "fp8_e5m2"],
                   metavar="FORMAT", help="target formats (default: fp16 bf16 e4m3 e5m2)")
    p.add_argument("--mode", default="nearest_even", choices=[m.value for m in RoundingMode])
    p.add_argument("--saturate", action="store_true", help="overflow to ±max instead of Inf/NaN")
    p.add_argument("--seed", type=int, default=None, help="seed of stochastic rounding")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_cmd_round)
    for name, func, text in (
            ("models", _cmd_models, "the MMA models (matrix engines) and their evidence"),
            ("targets", _cmd_targets, "the hardware targets: MMA model per format, evidence")):
        p = sub.add_parser(name, help=text)
        out = p.add_mutually_exclusive_group()
        out.add_argument("--json", action="store_true", help="machine-readable output")
        out.add_argument("--markdown", action="store_true", help="a Markdown table "
                                                                 "(docs/targets.md)")
        p.set_defaults(func=func)
    p = sub.add_parser("demo", help="the format table and a rounding tour")
    p.set_defaults(func=_cmd_demo)
    _add_golden(sub)
    _add_study(sub)
    _add_plan(sub)
    _add_characterize(sub)
    return parser


def main(argv=None) -> int:
    # Numba's OpenMP workers spin after each parallel kernel and steal the main thread's core
    # on a small machine; read when the OpenMP runtime starts (the first parallel kernel).
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    retain_freed_memory()   # temporaries reuse mapped heap pages (mpt.runtime): time, not bits
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    try:
        return args.func(args)
    except BrokenPipeError:   # the reader stopped (``mpt models | head``): not an error
        sys.stderr.close()
        return EXIT_OK
    except (ValueError, TypeError, OSError, ArithmeticError, ImportError) as exc:  # one line
        print(f"mpt {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print(f"mpt {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
