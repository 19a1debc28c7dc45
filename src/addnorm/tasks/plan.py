"""Planning a training run before anything is built: which task, which model, train and task
configs (a new run's from the task's defaults or a preset, then a config's values, then
overrides; a resumed run's from its checkpoint), and whether they fit the memory of a device.

``addnorm train`` plans its runs here and :func:`addnorm.tasks.run.train_run` carries them
out; a library user can do the same without the command:

    plan = plan_fresh_run("lm", model_overrides={"n_layers": 2}, train_overrides={"max_steps": 50})
    check_run_fits(plan, "cpu")
    train_run(plan.task_name, plan.model_cfg, plan.train_cfg, "runs/lm",
              task_cfg=plan.task_cfg, resume=plan.resume, task=plan.task)

A fresh run's steps may be given in epochs (``TrainConfig.epochs``: max_steps from the data's
``train_size()``, :func:`addnorm.tasks.budget.steps_for_epochs`); :func:`plan_budget` then
fits the plan to its time budget and, on a user's data, sizes its model from the data, after a
short measured warm-up (:mod:`addnorm.tasks.budget`), before ``train_run``.

"Train" values and overrides hold ``TrainConfig`` fields and the task config's together (as
the command line and a ``--config`` file do); they are told apart by name
(:func:`addnorm.tasks.task.split_train_settings`). Everything task-specific is asked of the
task (:class:`addnorm.tasks.task.Task`'s hooks), so any registered task plans the same way.

A plan that cannot train raises ``ValueError`` or ``TypeError`` naming the config field;
sizes no memory here holds raise ``RunSizeError`` (naming the setting to blame); a checkpoint
to resume that is missing, damaged or does not fit its own config raises ``CheckpointError``.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from addnorm.tasks.budget import BudgetPlan, budget_plan, scaled_warmup, steps_for_epochs
from addnorm.tasks.registry import task_class
from addnorm.tasks.run import resume_configs
from addnorm.tasks.task import AnyTask, TaskConfig, split_train_settings
from addnorm.tasks.trained import task_of_checkpoint
from addnorm.training.checkpoint import LoadedCheckpoint, load_checkpoint
from addnorm.training.config import TrainConfig
from addnorm.training.sizes import RunSizeError
from addnorm.utils.checks import check_choice, check_known_fields

__all__ = [
    "RunPlan",
    "RunSizeError",
    "check_run_fits",
    "plan_budget",
    "plan_fresh_run",
    "plan_resumed_run",
]


@dataclass(frozen=True)
class RunPlan:
    """What a training run is, decided before anything is built.

    Attributes:
        task_name: a registered task's name (``addnorm.tasks.registry.TASKS``).
        model_cfg, train_cfg, task_cfg: the run's configs (the model's before
            ``task.prepare``).
        resume: the checkpoint a resumed run continues; None for a new run.
        task: the task the plan was checked with (its data read once), which
            ``check_run_fits`` and ``train_run(task=...)`` use rather than build another;
            None: they build it.
        given: the settings a fresh run's caller chose (model, train and task field names a
            config or an override set, and "preset"), which :func:`plan_budget` keeps; the
            others it may plan.
    """

    task_name: str
    model_cfg: Any
    train_cfg: TrainConfig
    task_cfg: TaskConfig
    resume: LoadedCheckpoint | None = None
    task: AnyTask | None = field(default=None, compare=False, repr=False)
    given: frozenset[str] = frozenset()

    @property
    def task_cls(self) -> type[AnyTask]:
        return task_class(self.task_name)


def plan_fresh_run(
    task_name: str,
    *,
    preset: str | None = None,
    model_values: Mapping[str, Any] | None = None,
    train_values: Mapping[str, Any] | None = None,
    source: str = "",
    model_overrides: Mapping[str, Any] | None = None,
    train_overrides: Mapping[str, Any] | None = None,
) -> RunPlan:
    """A new run of ``task_name``: the task's default configs (or the model config named
    ``preset``), then ``model_values`` / ``train_values`` (a config file's, named by ``source``
    in errors), then the overrides; checked by the task. ``epochs`` (a train value) sets
    ``max_steps`` from the data (and scales the task's warm-up with it unless ``warmup`` is
    given too). Raises ValueError or TypeError for an unknown task, preset or field, epochs
    with max_steps, or configs the task cannot train."""
    task_cls = task_class(task_name)
    presets = task_cls.presets()
    if preset is not None:
        check_choice("preset", preset, tuple(presets))
    model_cfg = presets[preset] if preset else task_cls.default_model_config()
    train_cfg, task_cfg = task_cls.default_train_config(), task_cls.default_task_config()
    if model_values is not None:
        known = check_known_fields(type(model_cfg), model_values, source)
        model_cfg = dataclasses.replace(model_cfg, **known)
    if train_values is not None:
        train_cfg, task_cfg = _with_train_values(
            task_cls, train_cfg, task_cfg, train_values, source
        )
    model_cfg = dataclasses.replace(model_cfg, **(model_overrides or {}))
    if train_overrides is not None:
        train_cfg, task_cfg = _with_train_values(task_cls, train_cfg, task_cfg, train_overrides)
    given = frozenset({*(["preset"] if preset else []), *(model_values or {}),
                       *(model_overrides or {}), *(train_values or {}), *(train_overrides or {})})
    task = task_cls.from_config(task_cfg)
    if hasattr(task, "data_recipe"):  # settings the data decides (the DiT's patch size)
        task, model_cfg, task_cfg = task.data_recipe(model_cfg, task_cfg, given)
    if train_cfg.epochs is not None:
        if "max_steps" in given:
            raise ValueError(f"epochs ({train_cfg.epochs:g}) and max_steps "
                             f"({train_cfg.max_steps}) both set the steps: give one")
        steps = steps_for_epochs(task, task.prepare(model_cfg), train_cfg, task_cfg)
        warmup = train_cfg.warmup if "warmup" in given else scaled_warmup(
            train_cfg.warmup, train_cfg.max_steps, steps, train_cfg.schedule)
        train_cfg = dataclasses.replace(train_cfg, max_steps=steps, warmup=warmup)
    task.check(task.prepare(model_cfg), train_cfg, task_cfg)
    return RunPlan(task_name, model_cfg, train_cfg, task_cfg, task=task, given=given)


def plan_budget(plan: RunPlan, device: str) -> tuple[RunPlan, BudgetPlan]:
    """A fresh ``plan`` fitted to its time budget and, on a user's data, its model sized from
    the data (:func:`addnorm.tasks.budget.budget_plan`: a short measured warm-up on
    ``device``; the settings in ``plan.given`` are kept), and what was decided, for the run
    to print before it starts. A resumed plan is returned as it is (it keeps its plan)."""
    task = plan.task if plan.task is not None else plan.task_cls.from_config(plan.task_cfg)
    if plan.resume is not None:
        return plan, BudgetPlan.kept(task, plan.model_cfg, plan.train_cfg, plan.task_cfg)
    model_cfg, train_cfg, decided = budget_plan(
        task, plan.model_cfg, plan.train_cfg, plan.task_cfg, device, given=plan.given)
    planned = dataclasses.replace(plan, model_cfg=model_cfg, train_cfg=train_cfg, task=task)
    return planned, decided


def _with_train_values(
    task_cls: type[AnyTask],
    train_cfg: TrainConfig,
    task_cfg: TaskConfig,
    values: Mapping[str, Any],
    where: str = "",
) -> tuple[TrainConfig, TaskConfig]:
    """``train_cfg`` and ``task_cfg`` with ``values`` (fields of either) applied."""
    trainer_values, task_values = split_train_settings(task_cls, values, where)
    return (
        dataclasses.replace(train_cfg, **trainer_values),
        dataclasses.replace(task_cfg, **task_values),
    )


def plan_resumed_run(
    task_name: str,
    run_dir: str | os.PathLike,
    *,
    train_overrides: Mapping[str, Any] | None = None,
) -> RunPlan:
    """The run in ``run_dir`` continued from its newest checkpoint: the checkpoint's configs,
    with ``train_overrides`` (only ``addnorm.tasks.run.RESUMABLE_FIELDS`` and the task
    config's ``resumable`` ones) applied. Raises ``CheckpointError`` if the checkpoint is
    missing, damaged, or holds weights or optimizer state that do not fit its own model config
    (checked on the meta device, without memory), and ValueError if it is another task's, an
    override may not change, or the checkpoint's task refuses the configs (its ``check``, as
    ``train_run`` would: a task trained on a user's files refuses files that changed since)."""
    checkpoint = load_checkpoint(run_dir)
    model_cfg, train_cfg, task_cfg = resume_configs(
        checkpoint, dict(train_overrides or {}), task_name=task_name
    )
    _check_resume_fits(model_cfg, train_cfg, checkpoint)
    task, _ = task_of_checkpoint(checkpoint)
    task.check(model_cfg, train_cfg, task_cfg)
    return RunPlan(task_name, model_cfg, train_cfg, task_cfg, resume=checkpoint, task=task)


def _check_resume_fits(model_cfg: Any, train_cfg: TrainConfig, resume: LoadedCheckpoint) -> None:
    """Refuse (``CheckpointError``, naming the file and tensor) a checkpoint whose weights or
    optimizer state do not fit its own model config, before anything is built: the model is
    made (by the checkpoint's own task) on the meta device, shapes without memory."""
    import torch

    from addnorm.training.resume import check_checkpoint_fits

    task, _ = task_of_checkpoint(resume)
    with torch.device("meta"):
        model = task.build_model(model_cfg)
    check_checkpoint_fits(model, train_cfg, resume)


def check_run_fits(plan: RunPlan, device: str) -> None:
    """Refuse (``RunSizeError``, naming the setting, the estimate and the limit) a run whose
    model, batches or evaluation cannot fit in the memory ``device`` has now, before anything
    is allocated; see ``addnorm.training.sizes``. The task's ``sizing`` gives the lengths and
    the evaluation batch (and refuses sizes the task itself cannot take)."""
    from addnorm.training.sizes import (
        inference_bytes,
        largest_setting,
        replace_fields,
        training_bytes,
    )
    from addnorm.utils.memory import MAX_LAYERS, available_memory, format_bytes

    task_cls, model_cfg, train_cfg, task_cfg = (
        plan.task_cls, plan.model_cfg, plan.train_cfg, plan.task_cfg
    )
    for name in ("n_layers", "n_encoder_layers", "n_decoder_layers"):
        value = getattr(model_cfg, name, None)
        if value is not None and value > MAX_LAYERS:
            raise RunSizeError(name, value, f"at most {MAX_LAYERS} layers per stack")
    task: AnyTask
    if plan.task is not None:  # the plan's own, its data already read
        task = plan.task
    elif plan.resume is None:
        task = task_cls.from_config(task_cfg)
    else:  # the checkpoint's own task (its saved tokenizers and settings)
        task, _ = task_of_checkpoint(plan.resume)
    model_cfg = task.prepare(model_cfg)
    task.sizing(model_cfg, train_cfg, task_cfg)  # sizes the task itself refuses
    limit = available_memory(device)
    if limit is None:
        return

    # A task setting named like a model field (``vocab_size``: the vocabulary a tokenizer is
    # trained to) is the model's in ``settings``: the model config holds what the task made.
    model_fields = {f.name for f in dataclasses.fields(model_cfg)}

    def sizing(s: dict):  # the run's sizing with the train and task settings of ``s``
        task_values = {k: v for k, v in s.items() if k not in model_fields}
        return task.sizing(
            model_cfg, replace_fields(train_cfg, s), replace_fields(task_cfg, task_values)
        )

    checks = [
        ("train", lambda s: training_bytes(
            replace_fields(model_cfg, s), batch_size=s["batch_size"], length=sizing(s).length,
            ema=train_cfg.ema_decay > 0)),
        ("evaluate", lambda s: inference_bytes(
            replace_fields(model_cfg, s), batch_size=sizing(s).eval_batch,
            length=sizing(s).length)),
    ]
    settings = {
        **task_cfg.to_dict(), **train_cfg.to_dict(), **dataclasses.asdict(model_cfg)
    }
    defaults = {
        **task_cls.default_task_config().to_dict(),
        **task_cls.default_train_config().to_dict(),
        **dataclasses.asdict(task.prepare(task_cls.default_model_config())),
    }
    for what, estimate in checks:
        needed = estimate(settings)
        if needed > limit:
            culprit = largest_setting(estimate, settings, defaults) or _other_culprit(
                estimate, settings, defaults
            )
            raise RunSizeError(
                culprit or None,
                settings[culprit] if culprit else None,
                f"to {what} this model needs about {format_bytes(needed)} of memory, "
                f"more than the {format_bytes(limit)} available on {device}",
            )


def _other_culprit(estimate, settings: dict, defaults: dict) -> str | None:
    """The numeric setting outside ``sizes.SIZE_FIELDS`` (``d_freq``, ...) whose default value
    shrinks ``estimate`` the most, for a message that names a setting; None if none does."""
    best, best_value = None, estimate(settings)
    for key, value in settings.items():
        if isinstance(value, bool) or not isinstance(value, int) or value == defaults.get(key):
            continue
        try:
            smaller = estimate({**settings, key: defaults[key]})
        except (KeyError, ValueError, TypeError):  # no default, or it breaks a constraint
            continue
        if smaller < best_value:
            best, best_value = key, smaller
    return best
