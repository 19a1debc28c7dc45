"""addnorm.training.step_boundary: an interrupt in a step's forward phase puts the data order
and the random generators back to the step's start; in another phase nothing is undone.

Provenance: the draws after ``rewind`` are compared with the draws the step started with
(identity).
"""

from __future__ import annotations

import random

import pytest
import torch

from addnorm.training.checkpoint import save_checkpoint
from addnorm.training.step_boundary import StepBoundary


class Order:
    """A data order: a seeded ``random.Random`` whose state is JSON."""

    def __init__(self) -> None:
        self.rng = random.Random(0)

    def state_dict(self) -> dict:
        version, internal, gauss = self.rng.getstate()
        return {"rng": [version, list(internal), gauss]}

    def load_state_dict(self, state: dict) -> None:
        version, internal, gauss = state["rng"]
        self.rng.setstate((version, tuple(internal), gauss))


def draws(order: Order) -> tuple[float, torch.Tensor]:
    return order.rng.random(), torch.rand(3)


def test_rewind_in_the_forward_phase_repeats_the_steps_draws():
    order, boundary = Order(), StepBoundary()
    assert boundary.phase == "idle"
    boundary.enter(order)
    assert boundary.phase == "forward"
    first = draws(order)
    boundary.rewind(order)
    again = draws(order)
    assert first[0] == again[0] and torch.equal(first[1], again[1])


def test_rewind_in_the_update_or_idle_phase_changes_nothing():
    for phase in ("update", "idle"):
        order, boundary = Order(), StepBoundary()
        boundary.enter(order)
        first = draws(order)
        boundary.phase = phase
        boundary.rewind(order)
        after = draws(order)
        assert first[0] != after[0] and not torch.equal(first[1], after[1])


def test_after_an_interrupt_in_an_update_the_newest_checkpoint_is_kept(tmp_path):
    boundary = StepBoundary()
    with pytest.raises(KeyboardInterrupt, match="before any checkpoint was written"):
        boundary.kept_checkpoint(tmp_path)
    for step in (4, 8):
        save_checkpoint(tmp_path, step, {"model": {"w": torch.zeros(1)}}, {"step": step})
    assert boundary.kept_checkpoint(tmp_path) == (8, tmp_path / "checkpoints" / "step-00000008")
