"""`addnorm explain`: run the seed documents' claims as experiments and show them.

    addnorm explain NAME [--quick]   one experiment (names: ``addnorm explain --list``)
    addnorm explain all [--quick]    every experiment, one progress line each
    addnorm explain --list           the names and claims, nothing run
    addnorm explain                  the same as ``addnorm explain all --quick``

Each experiment writes ``OUT/NAME/figure.png`` and ``OUT/NAME/result.json`` (its headline
numbers, the claim in one sentence with the seed posts it comes from, and the verdict the
numbers decide: ``"verdict"`` "supported", "not supported", "mixed" or "undecided", with
``"supported"`` true, false (also for mixed) or null (undecided, with ``"undecided_because"``:
where the run cannot tell, as a quick run's few training steps cannot); ``"conditions"``, the
verdict under each condition where a claim is decided under several (learning rates), which
makes it mixed where they disagree; ``"sensitivity"``, the verdicts the same runs give at
other values of a threshold the verdict rests on) and prints its headline; every run rewrites
``OUT/index.html`` and ``OUT/verdicts.json`` (every verdict in one file) from all results
present, so they show every experiment run so far. Each claim is stated as its seed post
states it; another reading an experiment also tests (a stronger restatement) is printed after
it with its own verdict (``also`` in result.json). The experiments live in
:mod:`addnorm.experiments`.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from addnorm.cli.checks import check_out_dir, out_dir
from addnorm.experiments import CLAIMS, EXPERIMENTS, write_index, write_outcome, write_verdicts
from addnorm.experiments.outcome import MIXED, VERDICT_NAMES, Outcome

__all__ = ["ALL", "add_parser", "list_experiments", "run", "run_explain"]

ALL = "all"
# The claims and readings a quick run leaves undecided (docs/explain-quick.json, the last quick
# run's verdicts, holds them; tests/test_readme.py checks this list against it).
QUICK_UNDECIDED = ("length-extrapolation's stronger reading, bn-learning-rate, loss-landscape "
                   "and its LayerNorm reading, postln-vs-preln")


def add_parser(subparsers) -> None:
    """Register ``addnorm explain``."""
    explain = subparsers.add_parser(
        "explain",
        help=f"run the seed documents' {len(EXPERIMENTS)} claims as experiments: figures, "
        "numbers, a page",
        description="Run one experiment (NAME), or all, writing OUT/NAME/figure.png, "
        "OUT/NAME/result.json and OUT/index.html, a page that stands alone (each claim in "
        "full, with the seed post it comes from), and OUT/verdicts.json. Each verdict is "
        "decided by the numbers: supported, NOT supported, mixed (a claim decided at several "
        "learning rates that holds at some and not others), or undecided where the run "
        "cannot tell (a quick run's few training steps). With no NAME: all --quick.",
    )
    explain.add_argument("name", nargs="?", choices=[*EXPERIMENTS, ALL], metavar="NAME",
                         help="an experiment (see --list) or 'all'; default: all --quick")
    explain.add_argument("--list", action="store_true", help="list the experiments and exit")
    explain.add_argument(
        "--quick", action="store_true",
        help="a reduced run (seconds each; what the tests run): where its few training steps "
        f"cannot decide a claim ({QUICK_UNDECIDED}), it says undecided",
    )
    explain.add_argument("--out", type=out_dir, default=Path("runs/explain"),
                         help="output folder (default: runs/explain)")


def run(args: argparse.Namespace) -> int:
    """Handle ``addnorm explain``; returns the exit code."""
    check_out_dir(args.out)
    return run_explain(args.out, args.name, quick=args.quick, list_only=args.list)


def list_experiments() -> int:
    """Print each experiment's name and claim."""
    width = max(len(name) for name in EXPERIMENTS)
    for name, claim in CLAIMS.items():
        print(f"{name:<{width}}  {claim}")
    return 0


def run_explain(out_dir: Path, name: str | None = None, *, quick: bool = False,
                list_only: bool = False) -> int:
    """Run one experiment or all of them, write their files and the index page.

    ``name`` None means ``all`` in quick mode (see the module docstring). Returns the exit
    code; an unknown name is caught by the parser's choices before this is called.
    """
    if list_only:
        return list_experiments()
    if name is None:
        name, quick = ALL, True
    names = list(EXPERIMENTS) if name == ALL else [name]
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)  # experiments seed their own generators; this covers module inits
    # Tiny models: one thread is several times faster than oversubscribed cores, and the
    # numbers do not depend on a machine's core count.
    torch.set_num_threads(1)
    start = time.perf_counter()
    counts = dict.fromkeys(VERDICT_NAMES, 0)
    for i, current in enumerate(names, start=1):
        began = time.perf_counter()
        outcome = EXPERIMENTS[current](quick=quick)
        folder = write_outcome(outcome, out_dir)
        counts[outcome.verdict] += 1
        shown = outcome.verdict.upper() if outcome.verdict == "not supported" else outcome.verdict
        print(f"[{i}/{len(names)}] {current} ({time.perf_counter() - began:.1f} s): {shown}",
              flush=True)
        _print_outcome(outcome)
        print(f"    -> {folder / 'figure.png'}", flush=True)
    page = write_index(out_dir, list(EXPERIMENTS))
    write_verdicts(out_dir, list(EXPERIMENTS))
    mode = "quick" if quick else "full"
    print(f"{counts['supported']}/{len(names)} claims supported, {counts['not supported']} not "
          f"supported, {counts[MIXED]} mixed, {counts['undecided']} undecided ({mode} run, "
          f"{time.perf_counter() - start:.0f} s); page: {page}")
    return 0


def _print_outcome(outcome: Outcome) -> None:
    """The headline, each condition's verdict, the sensitivity and every other reading."""
    print(f"    {outcome.headline}", flush=True)
    if outcome.supported is None:
        print(f"    undecided: {outcome.undecided_because}", flush=True)
    for condition in outcome.conditions:
        print(f"    {condition.name}: {condition.verdict}", flush=True)
    if outcome.sensitivity is not None:
        sensitivity = outcome.sensitivity
        print(f"    sensitivity, as {sensitivity.setting} varies:", flush=True)
        for label, verdicts in sensitivity.rows:
            print(f"      {label}: " + ", ".join(
                f"{value:.3g} {verdict}" for value, verdict in zip(
                    sensitivity.values, verdicts, strict=True)), flush=True)
    for reading in outcome.also:
        print(f"    also tested ({reading.verdict}): {reading.claim}", flush=True)
        print(f"      {reading.headline}", flush=True)
        for condition in reading.conditions:
            print(f"      {condition.name}: {condition.verdict}", flush=True)
