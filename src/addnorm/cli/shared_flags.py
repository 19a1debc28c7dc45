"""The flags several subcommands share, and the model the inference flags name.

``--device`` and ``--threads`` (every command that runs a model), ``--quiet`` with them for the
commands that train (``train``, ``demo``), ``--weights`` and ``--which`` with them for the
commands that run a trained model (``translate``, ``generate``, ``sample``), whose
``--checkpoint`` is loaded by :func:`load_task_model`: an ``addnorm train`` run (its best
checkpoint when it kept one, saying so on stderr in one line; ``--which last``: its newest) or
checkpoint, or a folder :func:`addnorm.load` opens (``save_pretrained``'s, transformers' or
diffusers'), whose model must be one the task's data fits.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from addnorm.cli.checks import UsageError, apply_runtime_flags

__all__ = [
    "add_device_flags", "add_inference_flags", "add_runtime_flags", "add_weights_flag",
    "add_which_flag", "check_sound_model", "load_task_model",
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
    parser.add_argument(
        "--quiet", action="store_true",
        help="no progress: neither the bar (stderr, a terminal) nor the plain lines written "
        "to stdout when it is no terminal (a log file), every log_every steps or 30 s",
    )


def add_weights_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--weights",
        choices=("ema", "raw"),
        default="ema",
        help="ema (default): a run's moving average of the weights if it has one, else the "
        "trained weights; raw: the trained weights (a pretrained folder holds one set)",
    )


def add_which_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--which",
        choices=("best", "last"),
        default="best",
        help="best (default): a run's best checkpoint by its validation score when it kept "
        "one (train --keep-best; said on stderr), else its newest; last: its newest "
        "checkpoint (a checkpoint folder given is used as it is)",
    )


def add_inference_flags(parser: argparse.ArgumentParser) -> None:
    add_device_flags(parser)
    add_weights_flag(parser)
    add_which_flag(parser)


def load_task_model(args: argparse.Namespace, task_name: str):
    """``(task, model)`` of ``--checkpoint`` on ``--device`` (with ``--threads``) with
    ``--weights``; a ``UsageError`` if it holds another task's model, a ``CheckpointError``
    (exit 1) if its weights are broken (:func:`check_sound_model`).

    A run or checkpoint brings its own task (tokenizers, diffusion); of a run that kept its
    best, the best checkpoint is taken (``--which last``: the newest), and one line on
    stderr says which (:func:`addnorm.training.best_checkpoints.pick_checkpoint`). A folder with a
    ``config.json`` (what :func:`addnorm.load` opens) holds a model only: it gets the task
    that ``addnorm train TASK`` trains by default, and is refused unless its model is of that
    task's family with the fields the task's data sets (vocabulary, special ids, image
    size) equal to the task's."""
    from addnorm.pretrained.files import CONFIG_FILE
    from addnorm.tasks.trained import load_trained
    from addnorm.training.best_checkpoints import pick_checkpoint

    device = apply_runtime_flags(args)
    path = Path(args.checkpoint)
    if os.path.lexists(path / CONFIG_FILE):
        task, model = _folder_task_model(path, task_name, device)
        where = path
    else:
        picked, which = pick_checkpoint(path, getattr(args, "which", "best"))
        task, model, checkpoint = load_trained(picked, device=device, weights=args.weights)
        if task.name != task_name:
            raise UsageError(
                f"{checkpoint.path} holds a {task.name!r} model; this command needs a "
                f"{task_name!r} one"
            )
        where = checkpoint.path
        _say_which(path, which, checkpoint)
    check_sound_model(model, where)
    return task, model


def _say_which(run: Path, which: str, checkpoint: Any) -> None:
    """One line on stderr naming the checkpoint of ``run`` that is used, when the run kept a
    best (else there is no choice to report: the newest, as before best checkpoints)."""
    import sys

    from addnorm.training.best_checkpoints import find_best
    from addnorm.training.checkpoint import find_checkpoint, read_checkpoint_state

    best = find_best(run) if which != "given" else None
    if best is None:
        return
    if which == "best":
        record = checkpoint.state.get("best")
        score = (f", {record['metric']} {record['value']:.4f}" if isinstance(record, dict)
                 and isinstance(record.get("value"), int | float) else "")
        newest = find_checkpoint(run)
        print(f"using the best checkpoint of {run}: step {checkpoint.step}{score} "
              f"(by its validation score; the newest is step "
              f"{int(newest.name.removeprefix('step-'))}: --which last)",
              file=sys.stderr, flush=True)
        return
    record = read_checkpoint_state(best).get("best")
    print(f"using the newest checkpoint of {run}: step {checkpoint.step} (its best is step "
          f"{record.get('step') if isinstance(record, dict) else '?'}: --which best)",
          file=sys.stderr, flush=True)


def _folder_task_model(path: Path, task_name: str, device: Any) -> tuple[Any, Any]:
    """The model of a pretrained folder and the default task of ``task_name`` for it."""
    from addnorm.tasks.loading import load
    from addnorm.tasks.registry import task_class

    task_cls = task_class(task_name)
    config_type = type(task_cls.default_model_config())
    model = load(path, device=device)
    cfg = getattr(model, "cfg", None)
    if not isinstance(cfg, config_type):
        raise UsageError(
            f"{path} holds a {type(model).__name__}; this command needs a {task_name!r} model "
            f"(one whose config is a {config_type.__name__})"
        )
    task = task_cls.from_config(task_cls.default_task_config())
    wanted = task.prepare(cfg)
    differ = sorted(f for f in task_cls.owned_fields if getattr(cfg, f) != getattr(wanted, f))
    if differ:
        has = ", ".join(f"{f} {getattr(cfg, f)!r}" for f in differ)
        needs = ", ".join(f"{f} {getattr(wanted, f)!r}" for f in differ)
        raise UsageError(
            f"{path} holds a {type(model).__name__} with {has}; the {task_name} task's data "
            f"needs {needs} (a model addnorm train {task_name} trained)"
        )
    return task, model


def check_sound_model(model: Any, where: Path) -> None:
    """Refuse (``CheckpointError`` naming ``where``) a model whose weights hold NaN or inf,
    or whose output on a small batch of its family's example inputs (every kind of padding)
    is not finite (weights of 1e30, say): the checkpoint is broken, which no flag can fix.
    One forward of a few tokens; one value read back for each check."""
    import torch

    from addnorm.utils.files import CheckpointError

    named = [(n, t) for n, t in model.state_dict().items() if t.is_floating_point()]
    if named and not bool(torch.stack([t.isfinite().all() for _, t in named]).all()):
        name, tensor = next((n, t) for n, t in named if not bool(t.isfinite().all()))
        what = "NaN" if bool(tensor.isnan().any()) else "inf"
        raise CheckpointError(
            f"{where}: its weights hold {what} ({name}): the checkpoint is broken (its run "
            "had diverged, or the file was altered); use an earlier checkpoint or retrain"
        )
    example = getattr(model, "example_inputs", None)
    if not callable(example) or "forward" not in getattr(model, "export_parts", {}):
        return
    device = next(model.parameters()).device
    inputs = example("forward", batch=3, length=4, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = model(**{k: v.to(device) for k, v in inputs.items()})
    if not bool(out.isfinite().all()):
        name, largest = max(((n, float(t.abs().max())) for n, t in named if t.numel()),
                            key=lambda item: item[1])
        raise CheckpointError(
            f"{where}: its model's output on a probe batch is not finite (largest |weight| "
            f"{largest:.3g}, in {name}): the checkpoint is broken (its run had diverged, or "
            "the file was altered); use an earlier checkpoint or retrain"
        )
