"""The tasks by name: ``TASKS`` holds ``translate``, ``lm`` and ``dit``, and
:func:`register_task` adds another (any class that meets :class:`~addnorm.tasks.task.Task`),
after which ``plan_fresh_run``, ``train_run``, ``load_trained``, ``addnorm.load`` and (in a
parser built after it) ``addnorm train NAME`` know it, and a checkpoint naming it loads."""

from __future__ import annotations

import dataclasses
from typing import TypeVar

from addnorm.dit import DiT, DiTConfig
from addnorm.tasks.dit import DiTTask, DiTTaskConfig
from addnorm.tasks.lm import LMTask, LMTaskConfig
from addnorm.tasks.task import AnyTask, Task, TaskConfig
from addnorm.tasks.translate import TranslateTask, TranslateTaskConfig
from addnorm.training.config import TrainConfig
from addnorm.transformer import Transformer, TransformerLM
from addnorm.transformer.config import LMConfig, TransformerConfig
from addnorm.utils.checks import check_choice

__all__ = ["TASKS", "register_task", "task_class"]

TASKS: dict[str, type[AnyTask]] = {}

_T = TypeVar("_T", bound=type)


def register_task(task_cls: _T) -> _T:
    """Add ``task_cls`` to ``TASKS`` under its ``name`` and return it (so it also decorates a
    class). Raises ValueError if another class has that name, or if its task config has a
    field named like a ``TrainConfig`` field (the two share the command line and a config
    file's ``"train"`` object); TypeError if its default task config is no ``TaskConfig``."""
    name = getattr(task_cls, "name", None)
    if not isinstance(name, str) or not name:
        raise TypeError(f"a task class needs a non-empty str name, got {name!r}")
    if TASKS.get(name, task_cls) is not task_cls:
        raise ValueError(f"a task named {name!r} is already registered: {TASKS[name]!r}")
    task_cfg = task_cls.default_task_config()
    if not isinstance(task_cfg, TaskConfig):
        raise TypeError(
            f"{task_cls.__name__}.default_task_config() must return a TaskConfig, got "
            f"{type(task_cfg).__name__}"
        )
    trainer_fields = {f.name for f in dataclasses.fields(TrainConfig)}
    clash = sorted(trainer_fields & {f.name for f in dataclasses.fields(task_cfg)})
    if clash:
        raise ValueError(f"{task_cls.__name__}'s task config repeats TrainConfig fields {clash}")
    TASKS[name] = task_cls
    return task_cls


def task_class(name: str) -> type[AnyTask]:
    """The task class registered as ``name``; ValueError naming the known ones otherwise."""
    return TASKS[check_choice("task_name", name, tuple(TASKS))]


# The built-in tasks, each typed by its own configs and model (so mypy checks every hook).
_translate: type[Task[TransformerConfig, Transformer, TranslateTaskConfig]] = TranslateTask
_lm: type[Task[LMConfig, TransformerLM, LMTaskConfig]] = LMTask
_dit: type[Task[DiTConfig, DiT, DiTTaskConfig]] = DiTTask
for _task_cls in (_translate, _lm, _dit):
    register_task(_task_cls)
