"""Fixtures of the tasks' tests: ``sum_task`` registers tests/sum_task.py's task for one test."""

from __future__ import annotations

import pytest
from sum_task import SumTask

from addnorm.tasks.registry import TASKS, register_task


@pytest.fixture
def sum_task():
    register_task(SumTask)
    yield SumTask
    del TASKS[SumTask.name]
