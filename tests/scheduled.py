"""The learning rates a schedule's torch scheduler sets, step by step: shared by the schedule
tests and the trainer's (the lr each step was taken with)."""

from __future__ import annotations

import torch
from torch import nn

from addnorm.training.schedules import ScheduleConfig


def scheduled_lrs(schedule: ScheduleConfig, steps: int) -> list[float]:
    """The learning rates of steps 1 .. ``steps`` that ``schedule``'s torch scheduler sets."""
    optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=schedule.lr)
    scheduler = schedule.build(optimizer)
    lrs = []
    for _ in range(steps):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return lrs
