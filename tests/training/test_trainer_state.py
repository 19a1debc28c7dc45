"""addnorm.training.trainer_state: what a callback is handed instead of the trainer.

Provenance: at each hook the state is compared with the trainer's own attributes of the same
name (the trainer is the definition of where training stands); the gradient norm before
clipping with plain autograd on a twin of the model, and the clip factor with the norm of the
gradients the hook sees (clipped: the norm before times the factor, torch's definition).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn
from toy_batches import SumBatches, mse_loss

from addnorm.training import Callback
from addnorm.training.config import TrainConfig
from addnorm.training.schedules import ScheduleConfig
from addnorm.training.trainer import Trainer
from addnorm.training.trainer_state import TrainerState


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 1))


def _trainer(run_dir, callbacks, **overrides) -> Trainer:
    config = TrainConfig(**{"max_steps": 3, "lr": 1e-2, "warmup": 2, "log_every": 1,
                            "checkpoint_every": 0, "ema_decay": 0.9, **overrides})
    schedule = ScheduleConfig("constant", config.lr, config.warmup, total_steps=config.max_steps)
    return Trainer(_model(), mse_loss, SumBatches(), config, run_dir=run_dir, schedule=schedule,
                   callbacks=callbacks)


class Seen(Callback):
    """Keeps the state of every hook, with the trainer's own values at that moment."""

    def __init__(self) -> None:
        self.trainer: Trainer | None = None
        self.seen: list[tuple[str, TrainerState, dict]] = []

    def _keep(self, hook: str, state: TrainerState) -> None:
        trainer = self.trainer
        assert trainer is not None
        own = {"step": trainer.step, "step_lr": trainer.step_lr, "resumed_from":
               trainer.resumed_from}
        self.seen.append((hook, state, own))

    def on_fit_start(self, state):
        self._keep("fit_start", state)

    def on_before_update(self, state):
        self._keep("before_update", state)
        self.clipped = float(torch.linalg.vector_norm(
            torch.cat([p.grad.flatten() for p in state.model.parameters()])))

    def on_step_end(self, state, loss, tokens):
        self._keep("step_end", state)


def test_each_hook_sees_the_trainers_step_lr_settings_and_objects(tmp_path):
    seen = Seen()
    trainer = _trainer(tmp_path, [seen])
    seen.trainer = trainer
    trainer.fit()
    assert [hook for hook, _, _ in seen.seen][:3] == ["fit_start", "before_update", "step_end"]
    for _, state, own in seen.seen:
        assert not isinstance(state, Trainer)
        assert (state.step, state.step_lr, state.resumed_from) == (
            own["step"], own["step_lr"], own["resumed_from"])
        assert state.config is trainer.config and state.run_dir == trainer.run_dir
        assert state.model is trainer.model and state.optimizer is trainer.optimizer
        assert state.ema is trainer.ema and state.forward_model is trainer.forward_model
    assert [s.step for h, s, _ in seen.seen if h == "step_end"] == [1, 2, 3]


def test_a_state_is_a_snapshot_that_callbacks_cannot_move(tmp_path):
    seen = Seen()
    trainer = _trainer(tmp_path, [seen])
    seen.trainer = trainer
    trainer.fit()
    first = seen.seen[0][1]
    assert first.step == 0 and trainer.step == 3  # kept past its hook: stale, as documented
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.step = 5  # type: ignore[misc]


def test_before_the_update_the_state_holds_the_norm_before_clipping_and_the_factor(tmp_path):
    clip = 1e-3

    class First(Seen):
        def on_before_update(self, state):
            if state.step == 0:
                super().on_before_update(state)

    seen = First()
    trainer = _trainer(tmp_path, [seen], grad_clip=clip, max_steps=1)
    seen.trainer = trainer
    trainer.fit()
    (state,) = [s for h, s, _ in seen.seen if h == "before_update"]
    twin = _model()  # the same initial weights; the first batch of the same data order
    mse_loss(twin, SumBatches().next_batch())[0].backward()
    plain = torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in twin.parameters()]))
    # float32 norms of a few hundred terms in another order: a few u relative
    torch.testing.assert_close(state.grad_norm, plain, rtol=1e-6, atol=0.0)
    assert float(state.grad_norm) > 100 * clip and float(state.clip_factor) < 1
    assert seen.clipped == pytest.approx(float(state.grad_norm * state.clip_factor), rel=1e-6)
