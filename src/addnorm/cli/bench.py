"""``addnorm bench``: addnorm timed side by side with the reference implementations.

    addnorm bench                       # the CPU suite, about 10-15 minutes on 2 cores
    addnorm bench --quick               # fewer cases and rounds, about 1-2 minutes
    addnorm bench --only decoding dit --compile --json bench.json
    addnorm bench --device cuda --json bench.json --profile prof/   # the GPU suite
    addnorm bench --suite gpu --tiny    # the GPU suite's cases at tiny sizes, on the CPU

Implementations are interleaved (A B C A B C ...), each sample a ``torch.utils.benchmark``
``blocked_autorange``, and each keeps its median; ratios are to the fastest reference of the
same case. References (torch.nn; x-transformers, transformers, diffusers: ``pip install
'addnorm[bench]'``; timm, which needs a torchvision built for the installed torch and so is
left to the user) that are missing are skipped with a note. ``--bf16`` adds bf16-autocast
training steps of the CPU suite's small models (what they measured: :mod:`addnorm.cli.bf16`).

The GPU suite (``--device cuda``, or ``--suite gpu``): GPT-2 small training and greedy
decoding, BERT-base on a padded batch, DiT-XL/2 and DiT-B/2, against Hugging Face and
diffusers with the same weights, in bf16 (``--fp32`` for float32), eager and compiled (
``--no-compile`` for eager only), with TFLOP/s as a share of a same-run matrix multiply, peak
memory and compile times. A group that fails is reported and the run goes on.

A correctness check that fails (addnorm against a reference with the same weights) or a group
that fails makes the exit code 1, after the table.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from pathlib import Path

__all__ = ["add_parser", "run"]

# The most interleaved rounds per case: the default is 7, and each round of the full run costs
# one to two minutes on 2 cores, so 1000 rounds already take a day or more.
MAX_ROUNDS = 1000


def add_parser(subparsers) -> None:
    """Register ``addnorm bench`` on the subcommand parsers ``subparsers``."""
    from addnorm.bench.run import CPU_GROUPS, GPU_GROUPS, GROUPS

    bench = subparsers.add_parser(
        "bench",
        help="time addnorm against torch.nn, x-transformers, timm, transformers, diffusers",
        description="Time addnorm side by side with the reference implementations in one "
        "run, interleaved, and print each rate with its ratio to the fastest reference (the "
        "median of the per-round ratios, with their 25-75% range) and its share of a same-run "
        "torch.mm rate. Two suites: the CPU suite (CPU-sized cases) and the GPU suite (GPT-2 "
        "small, BERT-base, DiT-XL/2 and DiT-B/2 at their real sizes, with peak memory and "
        "compile times; --tiny runs them at tiny sizes on the CPU).",
    )
    bench.add_argument("--quick", action="store_true", help="fewer cases and rounds (1-2 min)")
    bench.add_argument("--json", type=Path, default=None, metavar="FILE",
                       help="also write the results as JSON (after each group)")
    bench.add_argument("--only", nargs="+", choices=list(GROUPS), metavar="GROUP",
                       help=f"run only these case groups: CPU suite {', '.join(CPU_GROUPS)}; "
                       f"GPU suite {', '.join(GPU_GROUPS)}")
    bench.add_argument("--device", default="cpu",
                       help="cpu, cuda or cuda:N: where the models run (the GPU suite's "
                       "groups run on either; the CPU suite's on the CPU only)")
    bench.add_argument("--suite", choices=["cpu", "gpu"], default=None,
                       help="the case groups to run when --only is not given (default: gpu "
                       "on CUDA, cpu on the CPU)")
    bench.add_argument("--tiny", action="store_true",
                       help="tiny models and one round: a smoke run of the harness")
    bench.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                       help="add torch.compile variants (compile time reported); default: on "
                       "for the GPU suite, off for the CPU suite")
    bench.add_argument("--fp32", action="store_true",
                       help="run the GPU suite in float32 instead of bf16")
    bench.add_argument(
        "--bf16", action="store_true",
        help="add bf16-autocast variants of the small-model training steps (on a CPU with bf16 "
        "instructions; the encoder layer is timed in bf16 there anyway). Measured on a Xeon "
        "with avx512_bf16 and AMX: the translator's step 0.2-0.4x, the DiT's 0.4-0.6x of fp32",
    )
    bench.add_argument("--rounds", type=int, default=None,
                       help=f"interleaved rounds per case, 1 to {MAX_ROUNDS} "
                       "(default 7, --quick 3; GPU suite 5, --quick 3; --tiny 1)")
    bench.add_argument("--threads", type=int, default=0,
                       help="torch CPU threads, 1 to the number of CPUs (default 0: torch's)")
    bench.add_argument("--profile", type=Path, default=None, metavar="DIR",
                       help="write torch.profiler summaries (summary.txt: top 30 ops by "
                       "device time and by memory, the memory held) and Chrome traces of the "
                       "GPT-2 training steps and of one decoding call into DIR")
    bench.add_argument("--budget", type=float, default=None, metavar="SECONDS",
                       help="skip the groups not started after this many seconds (a note "
                       "says which)")


def _settings(args: argparse.Namespace):
    """The run's BenchSettings and suite from the checked flags."""
    from addnorm.bench import BenchSettings
    from addnorm.bench.run import GPU_GROUPS

    device = _device(args.device)
    suite = args.suite or ("cpu" if device == "cpu" else "gpu")
    gpu_suite = suite == "gpu" if not args.only else any(g in GPU_GROUPS for g in args.only)
    size = "test" if args.tiny else "quick" if args.quick else "full"
    if args.tiny:
        rounds = args.rounds or 1
    elif gpu_suite:
        rounds = args.rounds or (3 if args.quick else 5)
    else:
        rounds = args.rounds or (3 if args.quick else 7)
    min_seconds = 0.0 if args.tiny else 0.2 if gpu_suite else 0.05
    compile = gpu_suite if args.compile is None else args.compile
    profile = None if args.profile is None else str(args.profile)
    settings = BenchSettings(size=size, rounds=rounds, min_seconds=min_seconds,
                             compile=compile, bf16=args.bf16, device=device,
                             precision="fp32" if args.fp32 else "bf16", profile_dir=profile)
    return settings, suite


def _device(name: str) -> str:
    """--device: cpu, cuda or cuda:N, present."""
    from addnorm.cli.checks import UsageError, resolve_device

    if name == "auto" or name.startswith("mps"):
        raise UsageError(f"--device must be cpu, cuda or cuda:N, got {name!r}")
    return resolve_device(name)


def run(args: argparse.Namespace) -> int:
    """Handle ``addnorm bench``; returns the exit code."""
    import torch

    from addnorm.bench import format_table, run_bench, to_json
    from addnorm.bench.harness import format_compare
    from addnorm.bench.run import CPU_GROUPS
    from addnorm.cli.checks import UsageError, check_out_dir
    from addnorm.cli.exits import EXIT_FAILED, EXIT_OK
    from addnorm.utils.files import write_file_atomic

    limit = os.cpu_count() or 1
    if not 0 <= args.threads <= limit:
        raise UsageError(f"--threads must be between 0 and {limit} (the CPUs), got {args.threads}")
    if args.rounds is not None and not 1 <= args.rounds <= MAX_ROUNDS:
        raise UsageError(f"--rounds must be from 1 to {MAX_ROUNDS}, got {args.rounds}")
    if args.budget is not None and not args.budget > 0:
        raise UsageError(f"--budget must be a number of seconds > 0, got {args.budget}")
    if args.json is not None:
        from addnorm.cli.checks import check_out_file

        check_out_file(args.json, "--json", make_parents=False)
    if args.profile is not None:
        check_out_dir(args.profile, "--profile")
    settings, suite = _settings(args)
    cpu_only = [g for g in (args.only or []) if g in CPU_GROUPS]
    if settings.device != "cpu" and (cpu_only or (not args.only and suite == "cpu")):
        raise UsageError(f"--device {settings.device}: the CPU suite's groups "
                         f"({', '.join(cpu_only or CPU_GROUPS)}) run on the CPU only")
    if args.threads:
        torch.set_num_threads(args.threads)
    started = time.perf_counter()

    def log(line: str) -> None:
        stamp = time.strftime("%H:%M:%S")
        print(f"[{stamp} +{time.perf_counter() - started:.0f}s] {line}", file=sys.stderr,
              flush=True)

    def write_json(report) -> None:
        if args.json is not None:
            text = json.dumps(to_json(report), indent=2) + "\n"
            write_file_atomic(args.json, lambda tmp: tmp.write_text(text, encoding="utf-8"))

    report = run_bench(settings, args.only, suite=suite, command=_command(args), log=log,
                       keep_going=True, budget=args.budget, after_group=write_json)
    print(format_table(report))
    compare = format_compare(report)
    if compare:
        print("### per-call times (torch.utils.benchmark.Compare, all rounds pooled)\n")
        print(compare)
    if args.json is not None:
        write_json(report)
        print(f"wrote {args.json}")
    if args.profile is not None and settings.profile_dir is not None:
        print(f"profiles in {args.profile}")
    failed = [check for check in report.checks if not check.passed]
    for check in failed:
        print(f"addnorm bench: error: check failed: {check.group}: {check.name}", file=sys.stderr)
    for error in report.errors:
        print(f"addnorm bench: error: group failed: {error.splitlines()[0]}", file=sys.stderr)
    return EXIT_FAILED if failed or report.errors else EXIT_OK


def _command(args: argparse.Namespace) -> str:
    """The command line that repeats this run (the JSON file and profile folder left out)."""
    words = ["addnorm", "bench"]
    words += ["--device", args.device] if args.device != "cpu" else []
    words += ["--suite", args.suite] if args.suite else []
    words += [flag for flag, on in (("--tiny", args.tiny), ("--quick", args.quick)) if on]
    words += ["--only", *args.only] if args.only else []
    words += [] if args.compile is None else ["--compile" if args.compile else "--no-compile"]
    words += [flag for flag, on in (("--fp32", args.fp32), ("--bf16", args.bf16)) if on]
    words += ["--rounds", str(args.rounds)] if args.rounds else []
    words += ["--threads", str(args.threads)] if args.threads else []
    words += ["--budget", f"{args.budget:g}"] if args.budget else []
    return shlex.join(words)
