"""A training run of a named task, start to finish, and loading a trained model back.

A run directory holds ``checkpoints/`` (see ``checkpoint.py``), ``metrics.jsonl`` (one line
per logged step), ``loss.png`` (the loss curve) and, after a run that was not interrupted,
``metrics.json`` (the held-out figures: ``test_exact_match`` for translate, ``val_bpc`` for lm).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from addnorm.training.checkpoint import CheckpointError, LoadedCheckpoint, load_checkpoint
from addnorm.training.config import TrainConfig
from addnorm.training.lm_task import LMTask
from addnorm.training.metrics import plot_loss_curve
from addnorm.training.schedules import LRSchedule
from addnorm.training.state import seed_everything
from addnorm.training.trainer import Trainer
from addnorm.training.translate_task import TranslateTask

__all__ = [
    "RESUMABLE_FIELDS",
    "TASKS",
    "RunSummary",
    "load_trained",
    "read_run_metrics",
    "resume_configs",
    "train_run",
]

TASKS = {"translate": TranslateTask, "lm": LMTask}
# TrainConfig fields a resumed run may change; any other change would break exact resume.
RESUMABLE_FIELDS = (
    "max_steps",
    "max_minutes",
    "checkpoint_every",
    "keep_checkpoints",
    "log_every",
    "eval_size",
)
_RUN_FILES = ("checkpoints", "metrics.jsonl", "metrics.json", "loss.png")


@dataclass(frozen=True)
class RunSummary:
    """What ``train_run`` did.

    Attributes:
        run_dir, checkpoint: where the run and its last checkpoint are.
        step, stopped_by, elapsed_s: as in ``TrainResult``.
        metrics: the held-out figures (empty if the run was interrupted).
        loss_png: the loss curve, or None if nothing was logged.
    """

    run_dir: Path
    checkpoint: Path
    step: int
    stopped_by: str
    elapsed_s: float
    metrics: dict
    loss_png: Path | None


def schedule_for(train_cfg: TrainConfig, d_model: int) -> LRSchedule:
    """The lr schedule ``train_cfg`` asks for (cosine ends at ``max_steps``)."""
    return LRSchedule(
        train_cfg.schedule,
        train_cfg.lr,
        train_cfg.warmup,
        total_steps=train_cfg.max_steps,
        d_model=d_model,
        final_lr_fraction=train_cfg.final_lr_fraction,
    )


def resume_configs(checkpoint: LoadedCheckpoint, overrides: dict) -> tuple[object, TrainConfig]:
    """The model and train configs of a resumed run: the checkpoint's, with ``overrides``
    (only ``RESUMABLE_FIELDS``) applied. Raises ValueError naming a field that may not change.
    """
    _, model_cfg = _task_and_config(checkpoint)
    saved = TrainConfig.from_dict(checkpoint.state["train_config"])
    for name, value in overrides.items():
        if name not in RESUMABLE_FIELDS and getattr(saved, name) != value:
            raise ValueError(
                f"{name} cannot change when resuming (the checkpoint has "
                f"{getattr(saved, name)!r}, got {value!r}); only "
                f"{', '.join(RESUMABLE_FIELDS)} can"
            )
    return model_cfg, dataclasses.replace(saved, **overrides)


def train_run(
    task_name: str,
    model_cfg,
    train_cfg: TrainConfig,
    run_dir: str | os.PathLike,
    *,
    resume: LoadedCheckpoint | None = None,
    device: torch.device | str = "cpu",
    progress: bool = False,
) -> RunSummary:
    """Train ``task_name`` into ``run_dir``, then evaluate on held-out data.

    A fresh run (``resume`` None) first removes a previous run's files from ``run_dir``.
    With ``resume``, weights, optimizer, schedule, RNG and data order continue from it.
    """
    run_dir = Path(run_dir)
    if resume is None:
        task = TASKS[task_name]()
        model_cfg = task.prepare(model_cfg)
        schedule = schedule_for(train_cfg, model_cfg.d_model)
        _clear_run(run_dir)
    else:
        task, _ = _task_and_config(resume)
        schedule = LRSchedule(**resume.state["schedule"])
    seed_everything(train_cfg.seed)
    model = task.build_model(model_cfg).to(device)
    run_info = {"task": task.name, "model_config": model_cfg.to_dict(), "task_data": task.to_dict()}
    trainer = Trainer(
        model,
        task.loss_fn(train_cfg),
        task.batches(train_cfg, model_cfg),
        train_cfg,
        run_dir=run_dir,
        schedule=schedule,
        run_info=run_info,
        progress=progress,
    )
    if resume is not None:
        trainer.load(resume)
    result = trainer.fit()
    png = None
    if (run_dir / "metrics.jsonl").stat().st_size > 0:
        png = plot_loss_curve(run_dir / "metrics.jsonl", run_dir / "loss.png", title=task.name)
    metrics = {}
    if result.stopped_by != "interrupt":
        metrics = {
            "task": task.name,
            "step": result.step,
            "train_loss": result.loss,
            "stopped_by": result.stopped_by,
            "elapsed_s": result.elapsed_s,
        }
        metrics.update(_evaluate(task, model, train_cfg))
        _write_json_atomic(run_dir / "metrics.json", metrics)
    return RunSummary(
        run_dir, result.checkpoint, result.step, result.stopped_by, result.elapsed_s, metrics, png
    )


def load_trained(path: str | os.PathLike, *, device: torch.device | str = "cpu"):
    """``(task, model in eval mode, checkpoint)`` from a checkpoint or run directory.

    Raises ``CheckpointError`` (naming the file) if the checkpoint is missing or damaged.
    """
    checkpoint = load_checkpoint(path)
    task, cfg = _task_and_config(checkpoint)
    model: nn.Module = task.build_model(cfg)
    try:
        model.load_state_dict(checkpoint.tensors["model"])
    except (KeyError, RuntimeError) as err:
        raise CheckpointError(
            f"{checkpoint.path / 'model.safetensors'} does not fit the model in its config: "
            f"{str(err).splitlines()[0]}"
        ) from None
    return task, model.to(device).eval(), checkpoint


def read_run_metrics(checkpoint: LoadedCheckpoint) -> dict | None:
    """The ``metrics.json`` of the run a checkpoint belongs to, if there is one."""
    path = checkpoint.path.parent.parent / "metrics.json"
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None


def _clear_run(run_dir: Path) -> None:
    """Remove a previous run's checkpoints, metrics and plot (a fresh run replaces them)."""
    for name in _RUN_FILES:
        target = run_dir / name
        if target.is_dir():
            shutil.rmtree(target)
        elif target.exists():
            target.unlink()


def _evaluate(task, model: nn.Module, train_cfg: TrainConfig) -> dict:
    if isinstance(task, LMTask):
        return task.evaluate(model, seq_len=train_cfg.seq_len, max_windows=train_cfg.eval_size)
    return task.evaluate(model, n=train_cfg.eval_size)


def _task_and_config(checkpoint: LoadedCheckpoint):
    """Rebuild the task and model config a checkpoint describes in its ``state.json``."""
    where = checkpoint.path / "state.json"
    info = checkpoint.state.get("run")
    try:
        task_cls = TASKS[info["task"]]
        task = task_cls.from_dict(info["task_data"])
        return task, task_cls.config_class.from_dict(info["model_config"])
    except (KeyError, TypeError, ValueError) as err:
        raise CheckpointError(f"{where} does not describe a trainable model: {err!r}") from None


def _write_json_atomic(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
