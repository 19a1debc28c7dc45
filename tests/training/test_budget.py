"""addnorm.training.budget: a fresh run with a time budget checks its pace inside its warm-up
and, in a long enough plan, once more at a quarter of it; a run whose steps do not fit is
re-planned to the steps that do, its schedule completing its decay within the budget; a run
whose steps fill its budget (``fill_budget``) and leave a quarter of it idle is re-planned up;
a run with time to spare, or given its steps, is left as it was, bit for bit, and a
re-planned run resumes exactly.

Provenance: every run here reads a fake clock that the loss function advances by a fixed
number of seconds per micro-batch (no test reads real time), so the pace, the projection and
the fitted steps are arithmetic on those seconds (restated in each test); the learning rates
are compared with the schedule's closed form and with the same run without a budget.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from torch import nn
from toy_batches import SumBatches, mse_loss

from addnorm.training.best import Validation
from addnorm.training.budget import (
    FIT_SHARE,
    LAST_CHECK_SHARE,
    MIN_PACE_STEPS,
    PACE_STEPS,
    RAISE_SHARE,
    REPLAN_SHARE,
    StepBudget,
    check_steps,
    fitting_steps,
    pace_step,
)
from addnorm.training.checkpoint import load_checkpoint
from addnorm.training.config import TrainConfig
from addnorm.training.metrics import read_metrics
from addnorm.training.schedules import ScheduleConfig
from addnorm.training.trainer import Trainer


class FakeTime:
    """A clock that the loss function moves on: ``first`` seconds for step 1's micro-batches,
    ``each`` for every later one (``then`` from micro-batch ``change_at`` on, when given)."""

    def __init__(self, each: float, first: float | None = None, *,
                 then: float | None = None, change_at: int = 0) -> None:
        self.now, self.each, self.first, self.calls = 0.0, each, first, 0
        self.then, self.change_at = then, change_at

    def __call__(self) -> float:
        return self.now

    def loss(self, grad_accum: int):
        def timed(model, batch):
            self.calls += 1
            first = self.first if self.first is not None else self.each
            later = (self.then if self.then is not None and self.calls >= self.change_at
                     else self.each)
            self.now += first if self.calls <= grad_accum else later
            return mse_loss(model, batch)

        return timed


def make_trainer(run_dir, clock: FakeTime | None, *, max_minutes=None, validation=None,
                 **overrides) -> Trainer:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 1))
    settings = dict(max_steps=100, lr=1e-2, warmup=20, final_lr_fraction=0.1, log_every=1,
                    checkpoint_every=25, grad_accum=2, max_minutes=max_minutes)
    settings.update(overrides)
    config = TrainConfig(**settings)
    schedule = ScheduleConfig("cosine", config.lr, config.warmup, total_steps=config.max_steps,
                              final_lr_fraction=config.final_lr_fraction)
    loss = mse_loss if clock is None else clock.loss(config.grad_accum)
    return Trainer(model, loss, SumBatches(), config, run_dir=run_dir, schedule=schedule,
                   clock=clock, validation=validation)


def records(run_dir) -> list[dict]:
    return read_metrics(run_dir / "metrics.jsonl")


def test_the_pace_is_checked_inside_a_warm_up_that_holds_enough_timed_steps():
    assert pace_step(100, 600) == 1 + PACE_STEPS
    assert pace_step(8, 600) == 7  # the step before the peak, after 6 timed steps
    assert pace_step(2 + MIN_PACE_STEPS, 600) == 1 + MIN_PACE_STEPS
    assert pace_step(1 + MIN_PACE_STEPS, 600) == 1 + PACE_STEPS  # too short a warm-up
    assert pace_step(0, 600) == 1 + PACE_STEPS
    # A plan shorter than twice that is checked at its half, after 3 timed steps at least.
    assert pace_step(100, 2 * (1 + PACE_STEPS)) == 1 + PACE_STEPS
    assert pace_step(100, 21) == 10 and pace_step(100, 12) == 6
    assert pace_step(100, 5) == 1 + MIN_PACE_STEPS == 4
    assert pace_step(100, 1 + MIN_PACE_STEPS) is None  # the run ends by then


def test_the_fitted_steps_fill_the_budgets_share():
    # 60 s budget, 11 steps done in 15 s, 1 s a step: 0.9 * 60 - 15 = 39 more.
    assert fitting_steps(60.0, 1.0, elapsed_s=15.0, done=11) == 11 + 39
    assert fitting_steps(60.0, 100.0, elapsed_s=15.0, done=11) == 12  # at least one more
    budget = StepBudget(1.0, warmup=20, max_steps=100)
    # 100 steps at 1 s: 15 + 89 = 104 s > 60: refitted; 40 steps: 44 s: kept.
    assert budget.refit(step=11, step_s=1.0, elapsed_s=15.0, max_steps=100) == 50
    assert budget.refit(step=11, step_s=1.0, elapsed_s=15.0, max_steps=40) is None
    # Between the shares (57 s projected, 0.9 * 60 = 54 < 57 <= 60): kept.
    assert REPLAN_SHARE * 60 >= 15 + (53 - 11) * 1.0 > FIT_SHARE * 60
    assert budget.refit(step=11, step_s=1.0, elapsed_s=15.0, max_steps=53) is None


def test_the_pace_is_the_median_step_so_one_slowed_step_does_not_re_plan():
    budget = StepBudget(1.0, warmup=100, max_steps=30)
    seconds = 0.0
    for step in range(1, 12):  # step 1: 5 s (allocation); step 6: 20 s (a passing load)
        seconds += 5.0 if step == 1 else 20.0 if step == 6 else 1.0
        measured = budget.pace(step, seconds)
    assert measured == (1.0, 34.0, (34.0 - 5.0) / 10)  # the median of steps 2-11; the mean
    # At the median, 34 + 19 * 1 = 53 s fit the 60; at the mean, 34 + 19 * 2.9 = 89 would not.
    assert budget.refit(step=11, step_s=1.0, elapsed_s=34.0, max_steps=30) is None
    assert budget.refit(step=11, step_s=2.9, elapsed_s=34.0, max_steps=30) == 11 + 6


def test_a_run_with_time_to_spare_is_the_run_without_a_budget_bit_for_bit(tmp_path):
    free = make_trainer(tmp_path / "free", FakeTime(0.5))
    free.fit()
    spare = make_trainer(tmp_path / "spare", FakeTime(0.5), max_minutes=2.0)  # 100 s of 120
    result = spare.fit()
    assert (result.stopped_by, result.step, result.replan) == ("max_steps", 100, None)
    assert records(tmp_path / "spare") == [
        {**r, "tokens_per_s": s["tokens_per_s"], "elapsed_s": s["elapsed_s"]}
        for r, s in zip(records(tmp_path / "free"), records(tmp_path / "spare"), strict=True)
    ]
    for name, value in free.model.state_dict().items():
        assert torch.equal(spare.model.state_dict()[name], value)


def test_a_run_given_a_budget_finishes_its_schedule_within_it(tmp_path):
    # 2 micro-batches of 0.5 s: 1 s a step, the first 2 s. A 1-minute budget cannot hold 100
    # steps of 1 s (101 s), so after step 11 (12 s in; 10 timed steps at 1 s) the run
    # is fitted to 0.9 * 60 s: 11 + (54 - 12) / 1 = 53 steps.
    clock = FakeTime(0.5, first=1.0)
    trainer = make_trainer(tmp_path / "run", clock, max_minutes=1.0)
    result = trainer.fit()
    replan = result.replan
    assert replan is not None
    assert (replan.at_step, replan.step_s, replan.elapsed_s) == (11, 1.0, 12.0)
    assert (replan.planned_steps, replan.steps) == (100, 53)
    assert (result.stopped_by, result.step) == ("max_steps", 53)
    assert result.elapsed_s == 12.0 + 42 * 1.0 <= FIT_SHARE * 60  # the plan's own share
    # The warm-up, 20 steps of 100, scaled to the 53: round(20 * 53 / 100) = 11 -> the step
    # after the check (12); then the cosine ends at the last step, on its floor.
    assert replan.warmup == 12
    lrs = [r["lr"] for r in records(tmp_path / "run")]
    fitted = trainer.schedule
    assert isinstance(fitted, ScheduleConfig) and fitted.replanned_total == 53
    assert lrs[:11] == pytest.approx([1e-2 * s / 20 for s in range(1, 12)], rel=1e-12)
    assert lrs[11] == pytest.approx(1e-2, rel=1e-12)  # the peak at step 12
    # The half cosine from the peak at step 12 to the floor (0.1 * 1e-2) at step 53, restated.
    assert lrs[32] == pytest.approx(1e-3 + 0.5 * 9e-3 * (1 + math.cos(math.pi * 21 / 41)),
                                    rel=1e-12)
    assert lrs[52] == pytest.approx(1e-3, rel=1e-12)  # the last step on the floor
    assert all(a >= b for a, b in zip(lrs[11:], lrs[12:], strict=False))  # decaying


def test_the_steps_taken_before_the_re_plan_keep_their_learning_rates(tmp_path):
    make_trainer(tmp_path / "free", FakeTime(0.5, first=1.0)).fit()
    make_trainer(tmp_path / "fitted", FakeTime(0.5, first=1.0), max_minutes=1.0).fit()
    free, fitted = records(tmp_path / "free"), records(tmp_path / "fitted")
    assert [r["lr"] for r in fitted[:11]] == [r["lr"] for r in free[:11]]
    assert [r["loss"] for r in fitted[:11]] == [r["loss"] for r in free[:11]]


def test_the_re_plan_is_in_the_checkpoints_and_a_resumed_run_continues_it_exactly(tmp_path):
    whole = make_trainer(tmp_path / "whole", FakeTime(0.5, first=1.0), max_minutes=1.0)
    whole.fit()
    # The same run stopped at step 25 (its checkpoint there), then resumed with its budget.
    clock = FakeTime(0.5, first=1.0)
    calls = {"n": 0}
    timed = clock.loss(2)

    def interrupted(model, batch):
        calls["n"] += 1
        if calls["n"] == 2 * 25 + 1:  # the first micro-batch of step 26
            raise KeyboardInterrupt
        return timed(model, batch)

    first = make_trainer(tmp_path / "split", clock, max_minutes=1.0)
    first.loss_fn = interrupted
    assert first.fit().step == 25
    saved = load_checkpoint(tmp_path / "split")
    assert saved.state["train_config"]["max_steps"] == 53
    assert saved.state["schedule"]["replanned_total"] == 53
    resumed = make_trainer(tmp_path / "split", FakeTime(0.5), max_minutes=1.0)
    resumed.schedule = ScheduleConfig(**saved.state["schedule"])  # as train_run rebuilds it
    resumed.scheduler = resumed.schedule.build(resumed.optimizer)
    resumed.config = TrainConfig.from_dict(saved.state["train_config"])
    resumed.load(saved)
    result = resumed.fit()
    assert (result.step, result.replan) == (53, None)  # the plan kept, not made again
    assert [r["loss"] for r in records(tmp_path / "split")] == [
        r["loss"] for r in records(tmp_path / "whole")]
    for name, value in whole.model.state_dict().items():
        assert torch.equal(resumed.model.state_dict()[name], value)


def test_a_caller_scheduler_is_not_fitted_and_the_time_cap_stays(tmp_path):
    from torch.optim.lr_scheduler import ConstantLR

    clock = FakeTime(0.5)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 1))
    config = TrainConfig(max_steps=200, lr=1e-2, warmup=1, grad_accum=2, max_minutes=1.0,
                         checkpoint_every=0)
    trainer = Trainer(model, clock.loss(2), SumBatches(), config, run_dir=tmp_path,
                      schedule=lambda opt: ConstantLR(opt, factor=1.0), clock=clock)
    result = trainer.fit()
    # 1 s a step on the training clock: the cap at 60 s stops it after step 60.
    assert (result.stopped_by, result.step, result.replan) == ("max_minutes", 60, None)


def test_a_long_enough_plan_checks_a_last_time_at_a_quarter_by_half_of_it():
    assert LAST_CHECK_SHARE == 0.25
    assert check_steps(20, 100) == (11, 25)
    assert check_steps(100, 600) == (11, 150)
    assert check_steps(8, 36) == (7, 17)  # a quarter (9) is too soon: 10 steps after the first
    assert check_steps(20, 42) == (11, 21)  # 21 is half the plan
    assert check_steps(20, 41) == (11,)  # 21 would come after half of it
    assert check_steps(100, 12) == (6,)
    assert check_steps(100, 4) == ()  # too short to check


def test_a_plan_filling_its_budget_is_re_fitted_up_only_well_below_it():
    budget = StepBudget(1.0, warmup=20, max_steps=100, fill=True)
    # 25 steps in 10 s at 0.25 s a step: 10 + 75 * 0.25 = 28.75 s < 0.75 * 60 = 45 s, so up
    # to 0.9 * 60 s: 25 + (54 - 10) / 0.25 = 201 steps.
    assert budget.refit(step=25, step_s=0.25, elapsed_s=10.0, max_steps=100,
                        upward=True) == 201
    assert budget.refit(step=25, step_s=0.25, elapsed_s=10.0, max_steps=100) is None
    # 10 + 75 * 0.5 = 47.5 s: between RAISE_SHARE (45 s) and the budget: kept.
    assert RAISE_SHARE * 60 < 10 + 75 * 0.5 <= REPLAN_SHARE * 60
    assert budget.refit(step=25, step_s=0.5, elapsed_s=10.0, max_steps=100, upward=True) is None
    # No measured pace (0 s a step: a clock that did not move) is no reason to lengthen.
    assert budget.refit(step=25, step_s=0.0, elapsed_s=0.0, max_steps=100, upward=True) is None
    # Lengthened at the mean step so far when that is slower (a passing load counts): at
    # 0.4 s, 10 + 75 * 0.4 = 40 s < 45 s still, and 25 + (54 - 10) / 0.4 = 135 steps.
    assert budget.refit(step=25, step_s=0.25, elapsed_s=10.0, max_steps=100, upward=True,
                        mean_s=0.4) == 135
    assert budget.refit(step=25, step_s=0.25, elapsed_s=10.0, max_steps=100, upward=True,
                        mean_s=0.1) == 201  # (the median when that is slower)
    # Past the budget it is re-planned down whether or not it may go up.
    assert budget.refit(step=25, step_s=1.0, elapsed_s=10.0, max_steps=100, upward=True) == 69


def up_run(run_dir, *, fill=True, clock=None, **overrides):
    """A run whose 36 steps are what a warm-up timed at 1.5 s a step plans for a 1-minute
    budget (0.9 * 60 / 1.5), trained at 0.5 s a step (the first: 1 s)."""
    assert fitting_steps(60.0, 1.5) == 36
    settings = dict(max_minutes=1.0, max_steps=36, warmup=8, fill_budget=True if fill else None)
    settings.update(overrides)
    return make_trainer(run_dir, clock or FakeTime(0.25, first=0.5), **settings)


def test_a_run_planned_from_a_slow_warm_up_is_re_planned_up_and_finishes_within_its_budget(
        tmp_path):
    # Checks after steps 7 and 17 (check_steps(8, 36)). At 17: 1 + 16 * 0.5 = 9 s in, 0.5 s a
    # step (the median of steps 8-17); 9 + 19 * 0.5 = 18.5 s < 45 s, so up to
    # 17 + (54 - 9) / 0.5 = 107 steps, which end at 9 + 90 * 0.5 = 54 s = 0.9 of the budget.
    trainer = up_run(tmp_path / "up")
    result = trainer.fit()
    replan = result.replan
    assert replan is not None and replan.direction == "up"
    assert (replan.at_step, replan.step_s, replan.elapsed_s) == (17, 0.5, 9.0)
    assert (replan.planned_steps, replan.steps, replan.warmup) == (36, 107, 8)
    assert replan.to_dict()["direction"] == "up"
    assert (result.stopped_by, result.step) == ("max_steps", 107)
    assert result.elapsed_s == 54.0 == FIT_SHARE * 60
    # The learning rates: those of the 36-step plan up to step 17 (the same run without a
    # budget), then a half cosine from there to the floor (0.1 * 1e-2) at step 107.
    make_trainer(tmp_path / "free", FakeTime(0.25, first=0.5), max_steps=36, warmup=8).fit()
    lrs, free = ([r["lr"] for r in records(tmp_path / name)] for name in ("up", "free"))
    assert lrs[:17] == free[:17]
    start = 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (17 - 8) / (36 - 8)))  # the 36's, at 17
    assert lrs[61] == pytest.approx(1e-2 * (0.1 + 0.5 * (start - 0.1)), rel=1e-12)  # step 62
    assert lrs[106] == pytest.approx(1e-3, rel=1e-12)
    assert all(a >= b for a, b in zip(lrs[17:], lrs[18:], strict=False))


def test_a_run_given_its_steps_is_never_lengthened(tmp_path):
    # The same pace as above, without fill_budget (a caller's max_steps): it keeps its 36 steps
    # (18.5 s of 60) and is the run without a budget, bit for bit.
    given = up_run(tmp_path / "given", fill=False)
    result = given.fit()
    assert (result.stopped_by, result.step, result.replan) == ("max_steps", 36, None)
    free = make_trainer(tmp_path / "free", FakeTime(0.25, first=0.5), max_steps=36, warmup=8)
    free.fit()
    assert [(r["loss"], r["lr"]) for r in records(tmp_path / "given")] == [
        (r["loss"], r["lr"]) for r in records(tmp_path / "free")]
    for name, value in free.model.state_dict().items():
        assert torch.equal(given.model.state_dict()[name], value)


def test_a_slower_machine_is_re_planned_down_at_the_last_check(tmp_path):
    # 0.5 s a step to step 11 (5.5 s; 5.5 + 89 * 0.5 = 50 s fit the 60), then 1 s a step: at
    # the last check, step 25, 5.5 + 14 = 19.5 s in, the median of steps 12-25 is 1 s and
    # 19.5 + 75 = 94.5 s > 60, so down to 25 + (54 - 19.5) / 1 = 59 steps.
    clock = FakeTime(0.25, then=0.5, change_at=2 * 11 + 1)
    result = make_trainer(tmp_path / "run", clock, max_minutes=1.0).fit()
    replan = result.replan
    assert replan is not None and replan.direction == "down"
    assert (replan.at_step, replan.step_s, replan.elapsed_s) == (25, 1.0, 19.5)
    assert (replan.planned_steps, replan.steps) == (100, 59)
    assert (result.stopped_by, result.step, result.elapsed_s) == ("max_steps", 59, 53.5)


def test_a_run_re_planned_up_resumes_exactly_from_a_checkpoint_with_or_without_fill_budget(
        tmp_path):
    whole = up_run(tmp_path / "whole")
    whole.fit()
    for name, keep_field in (("split", True), ("earlier", False)):
        clock = FakeTime(0.25, first=0.5)
        calls = {"n": 0}
        timed = clock.loss(2)

        def interrupted(model, batch, calls=calls, timed=timed):
            calls["n"] += 1
            if calls["n"] == 2 * 50 + 1:  # the first micro-batch of step 51
                raise KeyboardInterrupt
            return timed(model, batch)

        first = up_run(tmp_path / name, clock=clock)
        first.loss_fn = interrupted
        assert first.fit().step == 50
        saved = load_checkpoint(tmp_path / name)
        train_config = dict(saved.state["train_config"])
        assert (train_config["max_steps"], train_config["fill_budget"]) == (107, True)
        assert saved.state["schedule"]["replanned_total"] == 107
        if not keep_field:  # as a checkpoint of a version before fill_budget records it
            del train_config["fill_budget"]
            saved = dataclasses.replace(saved, state=saved.state | {"train_config": train_config})
        resumed = up_run(tmp_path / name, clock=FakeTime(0.25))
        resumed.schedule = ScheduleConfig(**saved.state["schedule"])  # as train_run does
        resumed.scheduler = resumed.schedule.build(resumed.optimizer)
        resumed.config = TrainConfig.from_dict(train_config)
        assert resumed.config.fill_budget is (True if keep_field else None)
        resumed.load(saved)
        result = resumed.fit()
        assert (result.step, result.replan) == (107, None)  # the plan kept, not made again
        assert [(r["loss"], r["lr"]) for r in records(tmp_path / name)] == [
            (r["loss"], r["lr"]) for r in records(tmp_path / "whole")]
        for key, value in whole.model.state_dict().items():
            assert torch.equal(resumed.model.state_dict()[key], value)


def test_a_short_plan_filling_its_budget_is_checked_at_its_half_and_re_planned_up(tmp_path):
    # 10 steps (a warm-up timed at 5.4 s a step plans them for a minute) trained at 0.5 s a
    # step: one check, after step 5 (half the plan), 1 + 4 * 0.5 = 3 s in; 3 + 5 * 0.5 =
    # 5.5 s < 45 s, so up to 5 + (54 - 3) / 0.5 = 107 steps, ending at 54 s.
    assert check_steps(1, 10) == (5,) and fitting_steps(60.0, 5.4) == 10
    result = up_run(tmp_path / "run", max_steps=10, warmup=1).fit()
    assert result.replan is not None and result.replan.direction == "up"
    assert (result.replan.at_step, result.replan.steps) == (5, 107)
    assert (result.stopped_by, result.step, result.elapsed_s) == ("max_steps", 107, 54.0)
    assert records(tmp_path / "run")[-1]["lr"] == pytest.approx(1e-3, rel=1e-12)  # the floor


def test_a_re_planned_runs_evaluations_come_every_tenth_of_its_new_plan_as_on_resume(
        tmp_path):
    # keep_best without eval_every: a tenth of the plan, 36 // 10 = 3 steps, to the re-plan
    # at step 17, then 107 // 10 = 10, the interval a run resumed from a later checkpoint
    # (whose max_steps is 107) takes; and the last step.
    held_out = SumBatches(seed=99, batch_size=64).next_batch()
    validation = Validation("val_mse", higher_is_better=False, score=lambda model: {
        "val_mse": float(mse_loss(model, held_out)[0])})

    def evaluated(name: str) -> list[int]:
        return [r["step"] for r in records(tmp_path / name) if "val_mse" in r]

    up_run(tmp_path / "whole", validation=validation, keep_best=True).fit()
    assert evaluated("whole") == [3, 6, 9, 12, 15, *range(20, 101, 10), 107]
    clock = FakeTime(0.25, first=0.5)
    timed, calls = clock.loss(2), {"n": 0}

    def interrupted(model, batch):
        calls["n"] += 1
        if calls["n"] == 2 * 50 + 1:  # the first micro-batch of step 51
            raise KeyboardInterrupt
        return timed(model, batch)

    first = up_run(tmp_path / "split", clock=clock, validation=validation, keep_best=True)
    first.loss_fn = interrupted
    assert first.fit().step == 50
    saved = load_checkpoint(tmp_path / "split")
    resumed = up_run(tmp_path / "split", clock=FakeTime(0.25), validation=validation,
                     **saved.state["train_config"])
    resumed.schedule = ScheduleConfig(**saved.state["schedule"])
    resumed.scheduler = resumed.schedule.build(resumed.optimizer)
    resumed.load(saved)
    assert resumed.fit().step == 107
    assert evaluated("split") == evaluated("whole")
