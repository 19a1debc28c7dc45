"""A finished run read back: the task and model a checkpoint describes, its saved settings,
the trained model itself, and what the run wrote of its scores.

``load_trained`` rebuilds a model from a checkpoint with its EMA weights when the checkpoint
has them (``weights="ema"``, the default, the weights a finished run was scored with) or its
raw trained weights (``weights="raw"``). A language model, loaded or scored at the end of its
run, knows the windows it trained on (its ``context``, the run's ``seq_len``), within which it
generates (``with_context``). ``addnorm.tasks.run`` reads a checkpoint back the same way to
resume it.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import torch
from torch import nn

from addnorm.tasks.registry import TASKS
from addnorm.tasks.task import AnyTask, TaskConfig, split_train_settings
from addnorm.training.checkpoint import LoadedCheckpoint, load_checkpoint
from addnorm.training.config import TrainConfig
from addnorm.training.sizes import SizeError, check_model_fits
from addnorm.transformer.lm import TransformerLM
from addnorm.utils.files import CheckpointError, parse_json

__all__ = [
    "WEIGHTS",
    "load_trained",
    "read_run_metrics",
    "saved_train_configs",
    "task_of_checkpoint",
    "with_context",
]

WEIGHTS = ("ema", "raw")


def task_of_checkpoint(checkpoint: LoadedCheckpoint) -> tuple[AnyTask, Any]:
    """The task (``from_dict`` of its saved data: tokenizers, settings) and the model config a
    checkpoint describes in its ``state.json``; ``CheckpointError`` naming the file if it
    describes none, or a model no memory here holds."""
    where = checkpoint.path / "state.json"
    info = checkpoint.state.get("run")
    if not isinstance(info, dict):
        raise CheckpointError(f"{where} does not describe a trainable model: no 'run' object")
    try:
        task_cls = TASKS[info["task"]]
        task = task_cls.from_dict(info["task_data"])
        cfg = task_cls.config_from_dict(info["model_config"])
    except (KeyError, TypeError, ValueError) as err:
        raise CheckpointError(f"{where} does not describe a trainable model: {err!r}") from None
    try:  # before anything is allocated: sizes no machine can hold end in a clear error
        check_model_fits(cfg)
    except SizeError as err:
        raise CheckpointError(f"{where}: {err}") from None
    return task, cfg


def saved_train_configs(
    task_cls: type[AnyTask], checkpoint: LoadedCheckpoint, task: AnyTask | None = None
) -> tuple[TrainConfig, TaskConfig]:
    """The trainer's and the task's configs a checkpoint of ``task_cls`` saved, both in its
    ``train_config`` (a checkpoint written before the task configs existed holds the task's
    fields among ``TrainConfig``'s, and maybe ``FORMER_FIELDS`` the task ignores: read so).
    A task config field the ``train_config`` lacks (written before the field existed) takes
    the value of ``task``'s attribute of that name where it has one (the checkpoint's task,
    which saved it in its own data: the DiT's ``prediction``), else the field's default.
    Raises ``CheckpointError`` naming ``state.json`` if it has no ``train_config`` object or
    one with a field that is unknown or out of range."""
    where = checkpoint.path / "state.json"
    saved = checkpoint.state.get("train_config")
    if not isinstance(saved, dict):
        raise CheckpointError(
            f"{where} has no 'train_config' object (the run's trainer settings), so the run "
            "cannot be continued exactly"
        )
    try:
        trainer, own = split_train_settings(task_cls, saved)
        defaults = task_cls.default_task_config()
        older = {f.name: getattr(task, f.name) for f in dataclasses.fields(defaults)
                 if f.name not in own and hasattr(task, f.name)}
        return (
            TrainConfig.from_dict(trainer),
            dataclasses.replace(defaults, **{**older, **own}),
        )
    except (ValueError, TypeError) as err:
        raise CheckpointError(f"{where}: train_config: {err}") from None


def load_trained(
    path: str | os.PathLike, *, device: torch.device | str = "cpu", weights: str = "ema"
) -> tuple[AnyTask, nn.Module, LoadedCheckpoint]:
    """``(task, model in eval mode, checkpoint)`` from a checkpoint or run directory.

    ``weights="ema"`` loads the EMA of the weights when the checkpoint has one (what a
    finished run was scored with) and the trained weights otherwise; ``"raw"`` always loads
    the trained weights. Raises ``CheckpointError`` (naming the file) if the checkpoint is
    missing or damaged.
    """
    if weights not in WEIGHTS:
        raise ValueError(f"weights must be one of {WEIGHTS}, got {weights!r}")
    checkpoint = load_checkpoint(path)
    task, cfg = task_of_checkpoint(checkpoint)
    try:
        task_cfg: TaskConfig | None = saved_train_configs(type(task), checkpoint, task)[1]
    except CheckpointError:  # no record of the run's settings: the model's own (max_len)
        task_cfg = None
    model: nn.Module = with_context(task.build_model(cfg), task_cfg)
    stem = "ema" if weights == "ema" and "ema" in checkpoint.tensors else "model"
    try:
        model.load_state_dict(checkpoint.tensors[stem])
    except (KeyError, RuntimeError) as err:
        raise CheckpointError(
            f"{checkpoint.path / f'{stem}.safetensors'} does not fit the model in its config: "
            f"{str(err).splitlines()[0]}"
        ) from None
    return task, model.to(device).eval(), checkpoint


def with_context(model: nn.Module, task_cfg: TaskConfig | None) -> nn.Module:
    """``model``, a language model told the length of the windows its run trained on (the
    task's ``seq_len``): it generates within them (``TransformerLM.context``)."""
    seq_len = getattr(task_cfg, "seq_len", None)
    if isinstance(model, TransformerLM) and isinstance(seq_len, int):
        model.context = seq_len
    return model


def read_run_metrics(checkpoint: LoadedCheckpoint) -> dict | None:
    """The ``metrics.json`` of the run a checkpoint belongs to, if there is one (None also for
    one that is not a JSON object, or is nested deeper than ``parse_json`` takes)."""
    path = checkpoint.path.parent.parent / "metrics.json"
    try:
        metrics = parse_json(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        return None
    return metrics if isinstance(metrics, dict) else None
