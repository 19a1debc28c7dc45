"""A training run of a named task, start to finish.

A run directory holds ``addnorm-run.json`` (the marker that proves addnorm started the run;
see ``addnorm.training.run_dir``), ``checkpoints/`` (see ``addnorm.training.checkpoint``),
``metrics.jsonl`` (one line per logged step), ``loss.png`` (the loss curve), with
``report_to="tensorboard"`` ``tensorboard/`` (TensorBoard event files: every record's scalars,
the held-out figures and pictures of the loss curve, the quality figure and the samples), with
``--watch`` ``watch.jsonl`` and ``watch.png`` (per-layer measurements,
:mod:`addnorm.training.watch`) and, after a run that was not stopped by a signal,
``metrics.json`` (the held-out figures; :mod:`addnorm.tasks.run_finish` says what it holds).
A run keeps its best
(``checkpoints/best-N``) with ``keep_best``, which None decides by the task: on for a user's
data (:func:`~addnorm.training.best.keeps_best`). A run on a user's files also
holds what its task writes of them (``WritesRunFiles``): ``data.json`` (the record of the
data, :class:`addnorm.data.fingerprint.DataRecord`) and its tokenizer files.

``train_run`` is the run-orchestration entry (the CLI's ``addnorm train`` and ``addnorm demo``
call it): unlike the library, it owns the global random state (it seeds every global generator
with ``train_cfg.seed``). It holds the run directory's lock from start to end, so two runs
never write one directory at once, and deletes only files a previous run's marker proves
addnorm wrote. The torch thread count and the device are its caller's choice (the
CLI's ``--threads`` and ``--device``).

Started by ``torchrun`` (a process group exists; see ``addnorm.training.distributed``), every
rank trains and only rank 0 takes the lock, writes the marker, the loss curve and
``metrics.json`` and evaluates; the other ranks return a summary without metrics.

A finished run is read back by :mod:`addnorm.tasks.trained` (``load_trained``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from pathlib import Path
from typing import Any

import torch

from addnorm.tasks.registry import TASKS, task_class
from addnorm.tasks.run_finish import RunSummary, best_checkpoint, finish_run, log_finish
from addnorm.tasks.task import (
    AnyTask,
    TaskConfig,
    Validates,
    WritesRunFiles,
    split_train_settings,
)
from addnorm.tasks.trained import saved_train_configs, task_of_checkpoint, with_context
from addnorm.training import distributed
from addnorm.training.best import Validation, keeps_best, validates
from addnorm.training.callbacks import ProgressLines
from addnorm.training.checkpoint import LoadedCheckpoint, load_checkpoint
from addnorm.training.config import TrainConfig
from addnorm.training.logger import REPORT_TO, Logger, TensorBoardLogger
from addnorm.training.run_dir import (
    RUN_FILES,
    TENSORBOARD_DIR,
    RunLock,
    check_fresh_run_dir,
    clear_run,
    read_marker,
    write_marker,
)
from addnorm.training.schedules import ScheduleConfig
from addnorm.training.state import seed_everything
from addnorm.training.trainer import Trainer
from addnorm.training.watch import WATCH_FILE, keep_records
from addnorm.utils.checks import check_known_fields
from addnorm.utils.files import CheckpointError, write_file_atomic

__all__ = [
    "RESUMABLE_FIELDS",
    "TASKS",
    "has_run",
    "resume_configs",
    "schedule_for",
    "train_run",
]

# TrainConfig fields a resumed run may change (and a task config's ``resumable`` ones); any
# other change would break exact resume.
RESUMABLE_FIELDS = (
    "max_steps",
    "max_minutes",
    "checkpoint_every",
    "keep_checkpoints",
    "log_every",
    "activation_checkpointing",
    "fsdp",
    "compile",
    "eval_every",
    "patience",
)


def schedule_for(train_cfg: TrainConfig) -> ScheduleConfig:
    """The lr schedule ``train_cfg`` asks for (cosine ends at ``max_steps``)."""
    return ScheduleConfig(
        train_cfg.schedule,
        train_cfg.lr,
        train_cfg.warmup,
        total_steps=train_cfg.max_steps,
        final_lr_fraction=train_cfg.final_lr_fraction,
    )


def _saved_schedule(checkpoint: LoadedCheckpoint) -> ScheduleConfig:
    """The lr schedule a checkpoint saved (a resumed run keeps it, even if ``max_steps``
    changes). Checkpoints written while the schedule (then ``LRSchedule``) had an unused
    ``d_model`` field store it; it is dropped here."""
    where = checkpoint.path / "state.json"
    saved = checkpoint.state.get("schedule")
    if isinstance(saved, dict):
        saved = {k: v for k, v in saved.items() if k != "d_model"}
    try:
        return ScheduleConfig(**check_known_fields(ScheduleConfig, saved, "schedule"))
    except (TypeError, ValueError) as err:
        raise CheckpointError(f"{where} does not describe an lr schedule: {err}") from None


def resume_configs(
    checkpoint: LoadedCheckpoint, overrides: dict, *, task_name: str
) -> tuple[Any, TrainConfig, TaskConfig]:
    """The model, train and task configs of a resumed run of ``task_name``: the checkpoint's,
    with ``overrides`` (train or task settings; only ``RESUMABLE_FIELDS`` and the task
    config's ``resumable`` ones may differ) applied. Raises ValueError if the checkpoint is
    another task's or an override changes a field that may not change.
    """
    task, model_cfg = task_of_checkpoint(checkpoint)
    _check_same_task(checkpoint, task, task_name)
    train_cfg, task_cfg = saved_train_configs(type(task), checkpoint, task)
    saved = {**train_cfg.to_dict(), **task_cfg.to_dict()}
    allowed = (*RESUMABLE_FIELDS, *task_cfg.resumable)
    trainer_changes, task_changes = split_train_settings(type(task), overrides)
    # A task field as its config keeps it (a data path made absolute), so that the same value
    # spelt another way is no change.
    kept = dataclasses.replace(task_cfg, **task_changes).to_dict()
    for name, value in {**trainer_changes, **{k: kept[k] for k in task_changes}}.items():
        if name not in allowed and saved[name] != value:
            raise ValueError(
                f"{name} cannot change when resuming (the checkpoint has "
                f"{saved[name]!r}, got {value!r}); only {', '.join(allowed)} can"
            )
    return (
        model_cfg,
        dataclasses.replace(train_cfg, **trainer_changes),
        dataclasses.replace(task_cfg, **task_changes),
    )


def train_run(
    task_name: str,
    model_cfg: Any,
    train_cfg: TrainConfig,
    run_dir: str | os.PathLike,
    *,
    task_cfg: TaskConfig | None = None,
    resume: LoadedCheckpoint | None = None,
    overwrite: bool = False,
    device: torch.device | str = "cpu",
    progress: bool = False,
    watch: int | None = None,
    report_to: str = "jsonl",
    progress_lines: bool = False,
    task: AnyTask | None = None,
) -> RunSummary:
    """Train ``task_name`` into ``run_dir``, then evaluate on held-out data (with the EMA
    weights when ``train_cfg.ema_decay > 0``) and store a few samples.

    ``task_cfg``: the task's own settings; None takes the task's defaults for a fresh run and
    the checkpoint's for a resumed one. ``task``: the task these configs were planned with
    (``RunPlan.task``, its data already read); None builds it from ``task_cfg`` (or the
    checkpoint). ``progress``: a bar on stderr; ``progress_lines``:
    plain lines on stdout instead, every ``log_every`` steps or 30 seconds (for a log file).
    ``watch``: measure inside the model every ``watch`` steps into ``watch.jsonl``, drawn as
    ``watch.png`` at the end (:mod:`addnorm.training.watch`); None watches nothing.

    A fresh run (``resume`` None) needs ``run_dir`` missing or empty, or holding an addnorm
    run and ``overwrite``: that run's own files are removed once the new model is built and on
    its device (other files stay), and the new run's marker is written. With ``resume`` (a
    checkpoint of ``task_name``), weights, optimizer, schedule, RNG and data order continue
    from it. ``run_dir`` is locked throughout.

    ``report_to`` (``REPORT_TO``): ``"jsonl"`` writes ``metrics.jsonl`` and the figures drawn
    from it, ``"tensorboard"`` also TensorBoard event files (``TensorBoardMissingError``
    without the ``tensorboard`` package), ``"none"`` neither (checkpoints and
    ``metrics.json`` only).
    Raises ValueError if the configs cannot train the task or ``resume`` is another task's;
    ``RunDirError`` if ``run_dir`` holds other files or runs, or another process writes it.
    """
    run_dir = Path(run_dir)
    if report_to not in REPORT_TO:
        raise ValueError(f"report_to must be one of {REPORT_TO}, got {report_to!r}")
    if resume is None:
        task_cls = task_class(task_name)
        task_cfg = task_cls.default_task_config() if task_cfg is None else task_cfg
        _check_task_config(task_cls, task_cfg)
        if task is not None and not isinstance(task, task_cls):
            raise TypeError(f"task must be a {task_cls.__name__}, got {type(task).__name__}")
        task = task_cls.from_config(task_cfg) if task is None else task
        model_cfg = task.prepare(model_cfg)
        schedule = schedule_for(train_cfg)
    else:
        task = task_of_checkpoint(resume)[0] if task is None else task
        _check_same_task(resume, task, task_name)
        schedule = _saved_schedule(resume)
        if task_cfg is None:
            task_cfg = saved_train_configs(type(task), resume, task)[1]
        _check_task_config(type(task), task_cfg)
    task.check(model_cfg, train_cfg, task_cfg)
    validation = task.validation(task_cfg) if isinstance(task, Validates) else None
    train_cfg = _with_keep_best(train_cfg, validation)
    main = distributed.is_main()
    with RunLock(run_dir) if main else contextlib.nullcontext():
        if resume is None and main:
            check_fresh_run_dir(run_dir, overwrite=overwrite)
        seed_everything(train_cfg.seed)
        model = task.build_model(model_cfg).to(device)
        if main and resume is None and read_marker(run_dir) is not None:
            clear_run(run_dir)
        if main and read_marker(run_dir) is None:  # a fresh run, or one from before markers
            write_marker(run_dir, task.name)
        if main and isinstance(task, WritesRunFiles):
            _write_run_files(run_dir, task.run_files())
        run_info = {
            "task": task.name, "model_config": model_cfg.to_dict(), "task_data": task.to_dict()
        }
        loggers: list[Logger] = (
            [TensorBoardLogger(run_dir / TENSORBOARD_DIR)] if main and report_to == "tensorboard"
            else []
        )
        trainer = Trainer(
            model,
            task.loss_fn(task_cfg),
            task.batches(model_cfg, train_cfg, task_cfg),
            train_cfg,
            run_dir=run_dir,
            schedule=schedule,
            run_info=run_info,
            extra_config=task_cfg.to_dict(),
            progress=progress,
            probe=task.probe(task_cfg),
            watch=watch,
            loggers=loggers,
            metrics_file=report_to != "none",
            callbacks=[ProgressLines(every_steps=train_cfg.log_every)] if progress_lines else [],
            validation=validation if validates(train_cfg, validation) else None,
        )
        try:
            if resume is not None:
                trainer.load(resume)
                if watch is None and main and (run_dir / WATCH_FILE).exists():
                    keep_records(run_dir / WATCH_FILE, resume.step)  # as a watched resume would
            result = trainer.fit()
            weights = trainer.scored_weights()  # every rank takes part in gathering them
            best = best_checkpoint(trainer)
            if best is not None:  # (one process) the best's, read back verified
                weights = load_checkpoint(best).tensors["model" if trainer.ema is None else "ema"]
            if not main:
                return RunSummary(
                    run_dir, result.checkpoint, result.step, result.stopped_by,
                    result.elapsed_s, {}, None, result.replan,
                )
            model = with_context(task.build_model(model_cfg), task_cfg).to(device)
            model.load_state_dict(weights)
            summary = finish_run(task, model, trainer, result, task_cfg, run_dir, best)
            for logger in loggers:
                log_finish(logger, task, summary, run_dir)
            return summary
        finally:
            for logger in loggers:
                logger.close()


def _with_keep_best(train_cfg: TrainConfig, validation: Validation | None) -> TrainConfig:
    """``train_cfg`` with ``keep_best`` decided (None: the task's choice,
    :func:`~addnorm.training.best.keeps_best`; off with several processes, where no
    validation runs), so that its checkpoints record what the run does."""
    if train_cfg.keep_best is None and distributed.is_distributed():
        return dataclasses.replace(train_cfg, keep_best=False)
    return dataclasses.replace(train_cfg, keep_best=keeps_best(train_cfg, validation))


def _write_run_files(run_dir: Path, files: dict[str, str]) -> None:
    """Write a task's own run files (``WritesRunFiles``) atomically; a name outside
    ``RUN_FILES`` (which replacing the run would not delete) is refused."""
    for name in files:
        if name not in RUN_FILES:
            raise ValueError(f"a task's run file must be one of {RUN_FILES}, got {name!r}")
    for name, text in files.items():

        def write(tmp: Path, text: str = text) -> None:
            tmp.write_text(text, "utf-8")

        write_file_atomic(run_dir / name, write)


def _check_task_config(task_cls: type[AnyTask], task_cfg: object) -> None:
    expected = type(task_cls.default_task_config())
    if not isinstance(task_cfg, expected):
        raise TypeError(
            f"task_cfg must be a {expected.__name__} for the {task_cls.name} task, got "
            f"{type(task_cfg).__name__}"
        )


def _check_same_task(checkpoint: LoadedCheckpoint, task: AnyTask, task_name: str) -> None:
    if task.name != task_name:
        raise ValueError(
            f"{checkpoint.path} holds a {task.name!r} run; it cannot be resumed as {task_name!r}"
        )


def has_run(run_dir: str | os.PathLike) -> bool:
    """Whether ``run_dir`` holds an addnorm run (its marker; a fresh run there would replace
    it)."""
    return read_marker(run_dir) is not None
