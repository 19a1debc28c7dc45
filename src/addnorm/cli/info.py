"""``addnorm info CHECKPOINT``: a checkpoint's configs, step and its run's metrics, as JSON;
for a run trained with ``--watch``, also ``"watch"``: its file, the watched steps and a
summary in sentences (:func:`addnorm.inspection.summary.summarize`: where the gradients grow,
which layers learn least, where the residual stream's scale grows); for a run on a user's
files, also the record of its data (path, size, fingerprint, split, tokenizer:
:class:`addnorm.data.fingerprint.DataRecord`). The report is the command's result: with
stdout closed (``addnorm info RUN >&-``) it is refused before anything is read, one line and
exit 1, as ``translate`` and ``generate`` refuse."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from addnorm.cli.exits import EXIT_OK, require_stdout

__all__ = ["add_parser", "run"]


def add_parser(subparsers) -> None:
    """Register ``addnorm info``."""
    info = subparsers.add_parser("info", help="print a checkpoint's configs, step and metrics")
    info.add_argument("checkpoint", type=Path, help="a checkpoint or run directory")


def run(args: argparse.Namespace) -> int:
    """Handle ``addnorm info``; returns the exit code."""
    from addnorm.tasks.trained import read_run_metrics
    from addnorm.training.checkpoint import load_checkpoint

    require_stdout("the report")
    checkpoint = load_checkpoint(args.checkpoint)
    state = checkpoint.state
    run_info = state.get("run")
    task_data = run_info.get("task_data") if isinstance(run_info, dict) else None
    data = task_data.get("data") if isinstance(task_data, dict) else None
    report = {
        "checkpoint": str(checkpoint.path),
        "task": state.get("run", {}).get("task"),
        "step": checkpoint.step,
        "elapsed_s": state.get("elapsed_s"),
        "model_config": state.get("run", {}).get("model_config"),
        "train_config": state.get("train_config"),
        "metrics": read_run_metrics(checkpoint),
        **({"data": data} if data is not None else {}),
    }
    watched = _watch_report(checkpoint.path.parent.parent)
    if watched is not None:
        report["watch"] = watched
    print(json.dumps(report, indent=2, ensure_ascii=False))
    return EXIT_OK


def _watch_report(run_dir: Path) -> dict | None:
    """The run's watch file, its watched steps and summary; None for a run without one."""
    from addnorm.inspection.summary import summarize
    from addnorm.training.watch import WATCH_FIGURE, WATCH_FILE, grad_norm_basis, read_watch

    records = read_watch(run_dir / WATCH_FILE)
    if not records:
        return None
    figure = run_dir / WATCH_FIGURE
    return {
        "file": str(run_dir / WATCH_FILE),
        "figure": str(figure) if figure.exists() else None,
        "steps": [r["step"] for r in records],
        "grad_norm": grad_norm_basis(records),
        "summary": summarize(records),
    }
