"""Planning a run (``addnorm.tasks.plan``): the memory estimate reads a task's own sizing and
blames the task's setting that makes a run too big for the memory.

Provenance: ``sizes.training_bytes`` grows with the task's ``length``; the memory is replaced
by a known size. Planning fresh and resumed runs of every task is also exercised in
test_task.py, test_lm_data.py, test_translate_data.py and test_dit_task_config.py.
"""

from __future__ import annotations

from unittest import mock

import pytest

from addnorm.tasks.plan import check_run_fits, plan_fresh_run
from addnorm.training.sizes import RunSizeError
from addnorm.utils import memory as _memory


def test_the_memory_estimate_reads_the_tasks_sizing_and_blames_its_setting(sum_task):
    plan = plan_fresh_run("vector-sum", train_overrides={"length": 10**9})
    with mock.patch.object(_memory, "available_memory", lambda device="cpu": 10**9):
        with pytest.raises(RunSizeError) as refused:
            check_run_fits(plan, "cpu")
    assert (refused.value.setting, refused.value.value) == ("length", 10**9)
