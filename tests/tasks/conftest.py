"""Fixtures of the tasks' tests: ``sum_task`` registers tests/sum_task.py's task for one test;
``tiny_lm_run`` trains a tiny lm run (6 steps by default) into a folder."""

from __future__ import annotations

from dataclasses import replace

import pytest
from sum_task import SumTask

from addnorm.tasks.lm import LMTask, LMTaskConfig
from addnorm.tasks.registry import TASKS, register_task
from addnorm.tasks.run import train_run
from addnorm.training.config import TrainConfig


@pytest.fixture
def sum_task():
    register_task(SumTask)
    yield SumTask
    del TASKS[SumTask.name]


def _tiny_lm_run(tmp_path, *, seq_len=16, **train):
    task = LMTask()
    model_cfg = replace(task.default_model_config(), d_model=32, n_heads=2, n_layers=1, d_ff=64)
    settings = dict(max_steps=6, batch_size=4, lr=3e-3, warmup=2)
    settings.update(train)
    task_cfg = LMTaskConfig(seq_len=seq_len, eval_size=4)
    return train_run("lm", model_cfg, TrainConfig(**settings), tmp_path, task_cfg=task_cfg)


@pytest.fixture
def tiny_lm_run():
    """``tiny_lm_run(folder, seq_len=16, **train_settings)``: the ``RunSummary`` of a tiny lm
    run (one layer, d_model 32) trained into ``folder``."""
    return _tiny_lm_run
