"""``addnorm bench``: addnorm timed side by side with the reference implementations.

    addnorm bench                       # every case group, about 10-15 minutes on 2 cores
    addnorm bench --quick               # fewer cases and rounds, about 1-2 minutes
    addnorm bench --only decoding dit --compile --json bench.json

Implementations are interleaved (A B C A B C ...) and each keeps its median; ratios are to
the fastest reference of the same case. References (torch.nn; x-transformers, transformers,
diffusers: ``pip install 'addnorm[bench]'``; timm, which needs a torchvision built for the
installed torch and so is left to the user) that are missing are skipped with a note.
``--bf16`` adds bf16-autocast training steps of the small models (what they measured:
:mod:`addnorm.cli.bf16`). A correctness check that fails (addnorm against a reference with
the same weights) makes the exit code 1, after the table.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from pathlib import Path

__all__ = ["add_parser", "run"]

# The most interleaved rounds per case: the default is 7, and each round of the full run costs
# one to two minutes on 2 cores, so 1000 rounds already take a day or more.
MAX_ROUNDS = 1000


def add_parser(subparsers) -> None:
    """Register ``addnorm bench`` on the subcommand parsers ``subparsers``."""
    from addnorm.bench.run import GROUPS

    bench = subparsers.add_parser(
        "bench",
        help="time addnorm against torch.nn, x-transformers, timm, transformers, diffusers",
        description="Time addnorm side by side with the reference implementations in one "
        "run, interleaved, and print each rate with its ratio to the fastest reference (the "
        "median of the per-round ratios, with their 25-75% range) and, for the encoder "
        "layer, its share of a same-run torch.mm rate.",
    )
    bench.add_argument("--quick", action="store_true", help="fewer cases and rounds (1-2 min)")
    bench.add_argument("--json", type=Path, default=None, metavar="FILE",
                       help="also write the results as JSON")
    bench.add_argument("--only", nargs="+", choices=list(GROUPS), metavar="GROUP",
                       help=f"run only these case groups: {', '.join(GROUPS)}")
    bench.add_argument("--compile", action="store_true",
                       help="add torch.compile variants (compile time reported)")
    bench.add_argument(
        "--bf16", action="store_true",
        help="add bf16-autocast variants of the small-model training steps (on a CPU with bf16 "
        "instructions; the encoder layer is timed in bf16 there anyway). Measured on a Xeon "
        "with avx512_bf16 and AMX: the translator's step 0.2-0.4x, the DiT's 0.4-0.6x of fp32",
    )
    bench.add_argument("--rounds", type=int, default=None,
                       help=f"interleaved rounds per case, 1 to {MAX_ROUNDS} "
                       "(default 7, --quick 3)")
    bench.add_argument("--threads", type=int, default=0,
                       help="torch CPU threads, 1 to the number of CPUs (default 0: torch's)")


def run(args: argparse.Namespace) -> int:
    """Handle ``addnorm bench``; returns the exit code."""
    import torch

    from addnorm.bench import BenchSettings, format_table, run_bench, to_json
    from addnorm.bench.harness import format_compare
    from addnorm.cli.checks import UsageError
    from addnorm.cli.exits import EXIT_FAILED, EXIT_OK

    limit = os.cpu_count() or 1
    if not 0 <= args.threads <= limit:
        raise UsageError(f"--threads must be between 0 and {limit} (the CPUs), got {args.threads}")
    if args.rounds is not None and not 1 <= args.rounds <= MAX_ROUNDS:
        raise UsageError(f"--rounds must be from 1 to {MAX_ROUNDS}, got {args.rounds}")
    if args.json is not None:
        from addnorm.cli.checks import check_out_file

        check_out_file(args.json, "--json", make_parents=False)
    if args.threads:
        torch.set_num_threads(args.threads)
    rounds = args.rounds or (3 if args.quick else 7)
    settings = BenchSettings(size="quick" if args.quick else "full", rounds=rounds,
                             compile=args.compile, bf16=args.bf16)
    report = run_bench(settings, args.only, command=_command(args),
                       log=lambda line: print(line, file=sys.stderr, flush=True))
    print(format_table(report))
    compare = format_compare(report)
    if compare:
        print("### per-call times (torch.utils.benchmark.Compare, all rounds pooled)\n")
        print(compare)
    if args.json is not None:
        args.json.write_text(json.dumps(to_json(report), indent=2) + "\n", encoding="utf-8")
        print(f"wrote {args.json}")
    failed = [check for check in report.checks if not check.passed]
    for check in failed:
        print(f"addnorm bench: error: check failed: {check.group}: {check.name}", file=sys.stderr)
    return EXIT_FAILED if failed else EXIT_OK


def _command(args: argparse.Namespace) -> str:
    """The command line that repeats this run (the JSON file left out)."""
    words = ["addnorm", "bench"]
    words += ["--quick"] if args.quick else []
    words += ["--only", *args.only] if args.only else []
    words += [flag for flag, on in (("--compile", args.compile), ("--bf16", args.bf16)) if on]
    words += ["--rounds", str(args.rounds)] if args.rounds else []
    words += ["--threads", str(args.threads)] if args.threads else []
    return shlex.join(words)
