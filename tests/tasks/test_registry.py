"""The registry of tasks (``addnorm.tasks.registry``): ``register_task`` takes the same class
again as a no-op, and refuses a name already taken and a task setting named like a
``TrainConfig`` field (which would be ambiguous on the command line), registering nothing.
A registered task going through planning, training and loading is in test_task.py."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import pytest
from sum_task import SumTask

from addnorm.tasks.lm import LMTask
from addnorm.tasks.registry import TASKS, register_task
from addnorm.tasks.task import TaskConfig


def test_register_task_refuses_a_taken_name_and_a_setting_named_like_the_trainers():
    assert register_task(LMTask) is LMTask  # the same class again: nothing changes

    class Impostor(SumTask):
        name: ClassVar[str] = "lm"

    with pytest.raises(ValueError, match="'lm' is already registered"):
        register_task(Impostor)

    @dataclass(frozen=True)
    class Clashing(TaskConfig):
        lr: float = 0.1

    class ClashingTask(SumTask):
        name: ClassVar[str] = "clashing"

        @staticmethod
        def default_task_config() -> Clashing:
            return Clashing()

    with pytest.raises(ValueError, match=r"repeats TrainConfig fields \['lr'\]"):
        register_task(ClashingTask)
    assert "clashing" not in TASKS
