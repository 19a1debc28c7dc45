"""The flags several subcommands share, and the model the inference flags name.

``--device`` and ``--threads`` (every command that runs a model), ``--quiet`` with them for the
commands that train (``train``, ``demo``), ``--weights`` with them for the commands that run a
trained model (``translate``, ``generate``, ``sample``), whose ``--checkpoint`` is loaded by
:func:`load_task_model`.
"""

from __future__ import annotations

import argparse

from addnorm.cli.checks import UsageError, apply_runtime_flags

__all__ = [
    "add_device_flags", "add_inference_flags", "add_runtime_flags", "add_weights_flag",
    "load_task_model",
]


def add_device_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--device",
        default="auto",
        help="auto (cuda if available, else cpu), cpu, cuda, cuda:N, mps",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=0,
        help="torch CPU threads, 1 to the number of CPUs (default 0: torch's choice)",
    )


def add_runtime_flags(parser: argparse.ArgumentParser) -> None:
    add_device_flags(parser)
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def add_weights_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--weights",
        choices=("ema", "raw"),
        default="ema",
        help="ema (default): a run's moving average of the weights if it has one, else the "
        "trained weights; raw: the trained weights (a pretrained folder holds one set)",
    )


def add_inference_flags(parser: argparse.ArgumentParser) -> None:
    add_device_flags(parser)
    add_weights_flag(parser)


def load_task_model(args: argparse.Namespace, task_name: str):
    """``(task, model)`` of ``--checkpoint`` on ``--device`` (with ``--threads``) with
    ``--weights``; a ``UsageError`` if it holds another task's model."""
    from addnorm.tasks.run import load_trained

    device = apply_runtime_flags(args)
    task, model, checkpoint = load_trained(args.checkpoint, device=device, weights=args.weights)
    if task.name != task_name:
        raise UsageError(
            f"{checkpoint.path} holds a {task.name!r} model; this command needs a {task_name!r} one"
        )
    return task, model
