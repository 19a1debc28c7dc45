"""What a training checkpoint holds and how a trainer's objects are put back from it:
:func:`save_training` assembles the parts and writes them (:mod:`~addnorm.training.checkpoint`
writes atomically), :func:`load_training` reads them back into the same objects.

A checkpoint keeps, as safetensors: the weights (``model``), the optimizer's tensors
(``optimizer``), the global random generators' (``rng``, rank 0's; the other ranks' follow from
the seed, step and rank) and the EMA's weights (``ema``); and in ``state.json``: the step, the
training time so far (``elapsed_s``), the run's own record (``run``: what rebuilds the model),
the settings (``train_config``, a task's own among them), the ``ScheduleConfig`` (``schedule``,
None for a caller's scheduler), the lr scheduler's ``state_dict`` (``scheduler``), the
optimizer's JSON skeleton, the data order (``data``), Python's and NumPy's generators
(``rng``), the losses since the last record (``loss_window``), the EMA's ``n_averaged`` and
what the probes keep of the run so far (``ProbeRunner.state_entries``: in a run that
evaluates on its validation split, the best so far, ``best``; :mod:`addnorm.training.best`).

Checkpoints written before some of these existed still load: without ``scheduler`` the
schedule is rebuilt and stepped to the checkpoint's step; without the EMA's count it is
``step + 1``; without ``loss_window`` the window is empty; without ``best`` the evaluations
on the validation split start again. A sharded (FSDP2) model's ranks each
write their part; a replicated one's rank 0 writes, and the others gather with it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch
from torch.optim.lr_scheduler import LRScheduler

from addnorm.training import distributed
from addnorm.training.checkpoint import LoadedCheckpoint, save_checkpoint
from addnorm.training.config import TrainConfig
from addnorm.training.ema import saved_n_averaged
from addnorm.training.metrics import loss_window_from_state
from addnorm.training.probes import ProbeRunner
from addnorm.training.resume import check_checkpoint_fits, refusing
from addnorm.training.schedules import (
    ScheduleConfig,
    SchedulerFactory,
    check_scheduler_state,
    make_scheduler,
    replay_schedule,
)
from addnorm.training.state import (
    capture_rng,
    optimizer_from_parts,
    optimizer_to_parts,
    restore_rng,
)
from addnorm.training.wrapping import WrappedModel
from addnorm.utils.files import CheckpointError

__all__ = [
    "Progress",
    "TrainingParts",
    "checked_extra_config",
    "load_training",
    "save_training",
]


class DataOrder(Protocol):
    """The part of a batch source a checkpoint keeps: its data order, as JSON."""

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


@dataclass(frozen=True)
class TrainingParts:
    """The objects whose state a checkpoint keeps, and the settings it records (``probe``:
    what scores the run along the way, :class:`~addnorm.training.probes.ProbeRunner`)."""

    wrapped: WrappedModel
    optimizer: torch.optim.Optimizer
    scheduler: LRScheduler
    batches: DataOrder
    config: TrainConfig
    schedule: ScheduleConfig | SchedulerFactory
    run_info: dict
    extra_config: dict
    probe: ProbeRunner | None = None


@dataclass(frozen=True)
class Progress:
    """How far training is: the step, the training time of every invocation so far and the
    losses summed since the last metrics record (their sum and count)."""

    step: int
    elapsed_s: float
    loss_window: tuple[float, int]


def checked_extra_config(config: TrainConfig, extra_config: dict) -> dict:
    """A copy of ``extra_config``, the settings a checkpoint's ``train_config`` keeps beside
    ``config``'s (a task's own); ValueError if a name is one of ``config``'s fields (it would
    overwrite the field there)."""
    clash = sorted(set(extra_config) & set(config.to_dict()))
    if clash:
        raise ValueError(f"extra_config must not repeat TrainConfig fields, got {clash}")
    return dict(extra_config)


def save_training(parts: TrainingParts, progress: Progress, run_dir: Path) -> Path:
    """Write a checkpoint of ``parts`` at ``progress`` into ``run_dir`` (keeping
    ``config.keep_checkpoints``). With several processes every rank calls it (gathering a
    replicated model and its optimizer state is a collective); every rank returns the
    path."""
    model, ema = parts.wrapped.model, parts.wrapped.ema
    sharded = distributed.is_fsdp(model)
    opt_tensors, opt_skeleton = optimizer_to_parts(
        parts.optimizer if sharded  # its state as this rank's shards (DTensors)
        else distributed.OptimizerView(model, parts.optimizer)  # type: ignore[arg-type]
    )
    rng_tensors, rng_json = capture_rng()
    tensors = {"model": distributed.model_state(model, whole=not sharded),
               "optimizer": opt_tensors}
    if distributed.is_main():  # the other ranks' generators follow (seed, step, rank)
        tensors["rng"] = rng_tensors
    if ema is not None:
        tensors["ema"] = distributed.model_state(ema.module, whole=not sharded)
    if not distributed.is_main() and not sharded:
        return run_dir / "checkpoints" / f"step-{progress.step:08d}"
    state = {
        "step": progress.step,
        "elapsed_s": progress.elapsed_s,
        "run": parts.run_info,
        "train_config": {**parts.config.to_dict(), **parts.extra_config},
        "schedule": (
            parts.schedule.to_dict() if isinstance(parts.schedule, ScheduleConfig) else None
        ),
        "scheduler": parts.scheduler.state_dict(),
        "optimizer": opt_skeleton,
        "data": parts.batches.state_dict(),
        "rng": rng_json,
        "loss_window": {"sum": progress.loss_window[0], "steps": progress.loss_window[1]},
    }
    if ema is not None:
        state["ema"] = {"n_averaged": int(ema.n_averaged)}
    if parts.probe is not None:
        state.update(parts.probe.state_entries())
    path = save_checkpoint(
        run_dir, progress.step, tensors, state, keep=parts.config.keep_checkpoints,
        sharded=sharded,
    )
    if parts.probe is not None:
        parts.probe.checkpoint_written()
    return path


def load_training(
    parts: TrainingParts, checkpoint: LoadedCheckpoint
) -> tuple[Progress, LRScheduler]:
    """Put ``parts`` back as ``checkpoint`` saved them (weights, optimizer, lr scheduler, EMA,
    data order, random generators and the probes' record; a checkpoint of any world size,
    sharded or whole);
    returns its progress and the scheduler to go on with (``parts.scheduler``, or one rebuilt
    for a checkpoint that kept none).

    Raises ``CheckpointError`` naming the file (and the tensor or entry) whose contents do not
    fit (a tensor of another shape, a missing entry); the shapes are checked before anything
    is loaded."""
    model, ema = parts.wrapped.model, parts.wrapped.ema
    if checkpoint.path.name.startswith("best-") and "optimizer" not in checkpoint.tensors:
        raise CheckpointError(
            f"{checkpoint.path} holds a run's best weights only (no optimizer, data order or "
            "random state); resume from the run's newest step-* checkpoint"
        )
    check_checkpoint_fits(model, parts.config, checkpoint, optimizer=parts.optimizer)
    tensors, state, path = checkpoint.tensors, checkpoint.state, checkpoint.path
    with refusing(path / "model.safetensors"):
        distributed.load_full_model_state(model, tensors["model"])
    with refusing(path / "optimizer.safetensors"):
        optimizer_from_parts(
            distributed.OptimizerView(model, parts.optimizer),  # type: ignore[arg-type]
            tensors["optimizer"],
            state["optimizer"],
        )
    with refusing(path / "state.json"):
        scheduler = _loaded_scheduler(parts, checkpoint)
    if ema is not None:
        with refusing(path / "ema.safetensors"):
            distributed.load_full_model_state(ema.module, tensors["ema"])
        with refusing(path / "state.json"):
            ema.n_averaged.fill_(saved_n_averaged(state, checkpoint.step))
    with refusing(path / "state.json"):
        parts.batches.load_state_dict(state["data"])
    with refusing(path / "rng.safetensors"):
        restore_rng(tensors["rng"], state["rng"])
    with refusing(path / "state.json"):
        window = loss_window_from_state(state.get("loss_window"))
    if parts.probe is not None:  # (last: an evaluation it makes up sees the loaded run)
        parts.probe.resume(state, checkpoint.step, path / "state.json")
    progress = Progress(checkpoint.step, float(state.get("elapsed_s", 0.0)), window)
    return progress, scheduler


def _loaded_scheduler(parts: TrainingParts, checkpoint: LoadedCheckpoint) -> LRScheduler:
    """The scheduler's state from ``checkpoint`` (after the optimizer's: its groups hold the
    lr the scheduler goes on from). A checkpoint written before the schedules were torch's
    has none: its schedule is rebuilt and stepped to the checkpoint's step."""
    saved = checkpoint.state.get("scheduler")
    if saved is None:
        return replay_schedule(
            lambda: make_scheduler(parts.schedule, parts.optimizer), parts.optimizer,
            checkpoint.step,
        )
    check_scheduler_state(parts.scheduler, saved, where="scheduler")
    parts.scheduler.load_state_dict(saved)
    return parts.scheduler
