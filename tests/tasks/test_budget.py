"""addnorm.tasks.budget: a fresh run planned from its data and budget: ``--epochs`` counted
from the data, the steps fitted to the budget at a measured pace (the warm-up with them), a
model on a user's data sized by the task's rule, and nothing changed where the task's plan
fits (the run then is the one without a plan, bit for bit).

Provenance: the steps are arithmetic on the data's size and the batch (ceil(epochs * examples
/ batch)); the fits on ``fitting_steps`` at a fake pace (``measure=``), so no test reads
real time, except the measured warm-up's own test, which asserts only that it measured
something and that the run after it is the run without it (losses equal bit for bit).
"""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
from sum_task import SumData, SumTask

from addnorm.tasks.budget import (
    BudgetPlan,
    Pace,
    budget_plan,
    measure_pace,
    scaled_warmup,
    steps_for_epochs,
)
from addnorm.tasks.model_size import ladder, pick_size
from addnorm.tasks.plan import plan_budget, plan_fresh_run
from addnorm.tasks.run import train_run
from addnorm.tasks.task import DEFAULT_SIZE_RULE
from addnorm.training.budget import FIT_SHARE, fitting_steps


def fake_pace(step_s: float, targets: float = 24.0):
    """A ``measure`` that returns a fixed pace and records the configs it was asked about."""
    asked = []

    def measure(task, model_cfg, train_cfg, task_cfg, device):
        asked.append(model_cfg)
        return Pace(step_s, targets)

    measure.asked = asked  # type: ignore[attr-defined]
    return measure


def sum_plan(task=None, **train):
    task = task or SumTask()
    cfg = task.prepare(task.default_model_config())
    return task, cfg, dataclasses.replace(task.default_train_config(), **train), \
        task.default_task_config()


def test_epochs_count_the_datas_examples_in_global_batches(sum_task):
    task, cfg, train_cfg, task_cfg = sum_plan(epochs=2.5, batch_size=4, grad_accum=2)
    # 640 sequences, 8 a step: 2.5 * 640 / 8 = 200 steps.
    assert steps_for_epochs(task, cfg, train_cfg, task_cfg) == 200
    train_cfg = dataclasses.replace(train_cfg, epochs=0.01)
    assert steps_for_epochs(task, cfg, train_cfg, task_cfg) == 1  # ceil(0.8)
    with pytest.raises(ValueError, match=r"epochs \(1e\+300\) come to 8e\+301 steps"):
        steps_for_epochs(task, cfg, dataclasses.replace(train_cfg, epochs=1e300), task_cfg)


def test_an_lm_epoch_is_its_train_tokens_in_windows(tmp_path, monkeypatch):
    from addnorm.tasks.lm import LMTask, LMTaskConfig

    monkeypatch.setenv("ADDNORM_CACHE", str(tmp_path / "cache"))
    (tmp_path / "a.txt").write_text("the cat sat on the mat.\n" * 400, encoding="utf-8")
    task_cfg = LMTaskConfig(data=str(tmp_path / "a.txt"), seq_len=16)
    task = LMTask.from_config(task_cfg)
    train_cfg = dataclasses.replace(LMTask.default_train_config(), batch_size=8, epochs=1.0)
    cfg = task.prepare(LMTask.default_model_config())
    tokens = task.data.train_size()
    assert steps_for_epochs(task, cfg, train_cfg, task_cfg) == math.ceil(tokens / (8 * 16))


def test_the_plan_sets_steps_from_epochs_and_refuses_both(sum_task):
    plan = plan_fresh_run("vector-sum", train_overrides={"epochs": 1.0, "warmup": 4})
    assert plan.train_cfg.max_steps == 640 // 4 and plan.train_cfg.warmup == 4
    scaled = plan_fresh_run("vector-sum", train_overrides={
        "epochs": 1.0, "schedule": "cosine"})
    assert scaled.train_cfg.warmup == 20  # the task's 1 of 8 steps, scaled: 1 * 160 / 8
    with pytest.raises(ValueError, match="epochs .* and max_steps .* both set the steps"):
        plan_fresh_run("vector-sum", train_overrides={"epochs": 1.0, "max_steps": 5})


def test_a_task_without_a_data_object_cannot_count_epochs(sum_task, monkeypatch):
    class NoData(SumTask):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            del self.data

    task, cfg, train_cfg, task_cfg = sum_plan(NoData(), epochs=1.0)
    with pytest.raises(ValueError, match="epochs needs a task that knows"):
        steps_for_epochs(task, cfg, train_cfg, task_cfg)


def test_the_warm_up_scales_with_the_steps():
    assert scaled_warmup(100, 600, 61, "cosine") == 10
    assert scaled_warmup(50, 500, 3, "cosine") == 1  # never below one where there was one
    assert scaled_warmup(0, 500, 3, "cosine") == 0
    assert scaled_warmup(100, 600, 50, "constant") == 8
    assert scaled_warmup(100, 600, 1200, "cosine") == 200


def test_a_plan_that_fits_its_budget_is_left_as_it_was(sum_task):
    task, cfg, train_cfg, task_cfg = sum_plan(max_minutes=1.0, max_steps=40)
    measure = fake_pace(0.5)  # 40 steps of 0.5 s: 20 s of 54
    model, fitted, plan = budget_plan(task, cfg, train_cfg, task_cfg, "cpu", measure=measure)
    assert fitted == train_cfg and model == cfg
    assert (plan.steps, plan.asked_steps, plan.steps_from, plan.size) == (40, 40, "task", None)
    assert plan.expected_s == 20.0 and plan.epochs == 40 * 4 / 640


def test_a_plan_too_long_for_its_budget_is_fitted_with_its_warm_up(sum_task):
    task, cfg, train_cfg, task_cfg = sum_plan(max_minutes=1.0, max_steps=600, warmup=100,
                                              schedule="cosine")
    model, fitted, plan = budget_plan(task, cfg, train_cfg, task_cfg, "cpu",
                                      measure=fake_pace(2.0))
    steps = fitting_steps(60.0, 2.0)  # 0.9 * 60 / 2 = 27
    assert steps == int(FIT_SHARE * 60 / 2.0) == 27
    assert (fitted.max_steps, fitted.warmup) == (27, round(100 * 27 / 600))
    assert (plan.steps, plan.asked_steps) == (27, 600)
    text = "\n".join(plan.lines())
    assert "27 of 4 examples" in text and "fitted to the budget from 600" in text
    assert "2 s a step" in text and "54 s of training here, in a 1-minute budget" in text
    # A warm-up the caller gave is kept.
    _, kept, _ = budget_plan(task, cfg, train_cfg, task_cfg, "cpu", given={"warmup"},
                             measure=fake_pace(2.0))
    assert (kept.max_steps, kept.warmup) == (27, 100)


def test_without_a_budget_nothing_is_measured(sum_task):
    task, cfg, train_cfg, task_cfg = sum_plan(max_minutes=None)
    measure = fake_pace(1.0)
    _, fitted, plan = budget_plan(task, cfg, train_cfg, task_cfg, "cpu", measure=measure)
    assert fitted == train_cfg and plan.pace is None and measure.asked == []


def test_on_a_users_data_the_model_is_sized_by_the_rule_and_the_steps_fill_the_budget(
        sum_task):
    task = SumTask(data=SumData(n_train=10**6, record="your files"))
    task, cfg, train_cfg, task_cfg = sum_plan(task, max_minutes=5.0, lr=1e-2)
    measure = fake_pace(0.01, targets=24.0)
    model, fitted, plan = budget_plan(task, cfg, train_cfg, task_cfg, "cpu", measure=measure)
    expected = pick_size(
        ladder(cfg), rule=DEFAULT_SIZE_RULE,
        reference=cfg, reference_step_s=0.01, length=6, targets_per_step=24.0,
        unique_targets=10**6 * 24.0 / 4, budget_s=300.0, epochs=None)
    assert plan.size == expected and model == expected.cfg != cfg
    assert measure.asked == [cfg, expected.cfg]  # the task's model, then the chosen one
    # The steps fill the budget at the chosen model's (measured) pace, and so do not stop at
    # the task's 8; a wider model's peak lr is scaled by the widths.
    assert plan.steps_from == "budget" and fitted.max_steps == fitting_steps(300.0, 0.01)
    assert fitted.lr == pytest.approx(1e-2 * cfg.d_model / model.d_model, rel=1e-12)
    assert "sized from the data and the budget" in plan.lines()[0]
    assert "as many as fit the budget" in plan.lines()[1]


def test_a_model_or_steps_the_caller_gave_are_kept_on_a_users_data(sum_task):
    task = SumTask(data=SumData(n_train=10**6, record="your files"))
    task, cfg, train_cfg, task_cfg = sum_plan(task, max_minutes=5.0)
    model, fitted, plan = budget_plan(task, cfg, train_cfg, task_cfg, "cpu",
                                      given={"d_model", "max_steps"}, measure=fake_pace(0.01))
    assert model == cfg and plan.size is None
    assert plan.steps_from == "max_steps" and fitted.max_steps == train_cfg.max_steps


def test_the_measured_warm_up_leaves_the_run_as_it_would_be(sum_task, tmp_path):
    plan = plan_fresh_run("vector-sum", train_overrides={"max_minutes": 10.0})
    task = plan.task
    pace = measure_pace(task, task.prepare(plan.model_cfg), plan.train_cfg, plan.task_cfg, "cpu")
    assert pace.step_s > 0 and pace.targets_per_step == 4 * 6  # batch 4 of 6 vectors
    planned, decided = plan_budget(plan, "cpu")
    assert planned.train_cfg == plan.train_cfg  # 8 steps of a tiny MLP fit 10 minutes
    assert decided.pace is not None and decided.steps == 8
    after = train_run("vector-sum", planned.model_cfg, planned.train_cfg, tmp_path / "a",
                      task_cfg=plan.task_cfg, task=planned.task)
    alone = train_run("vector-sum", plan.model_cfg, plan.train_cfg, tmp_path / "b",
                      task_cfg=plan.task_cfg)
    assert after.metrics["val_mse"] == alone.metrics["val_mse"]

    def losses(run):
        return [json.loads(line)["loss"]
                for line in (run / "metrics.jsonl").read_text().splitlines()]

    assert losses(tmp_path / "a") == losses(tmp_path / "b")


def test_a_resumed_plan_is_kept(sum_task):
    task, cfg, train_cfg, task_cfg = sum_plan()
    kept = BudgetPlan.kept(task, cfg, train_cfg, task_cfg)
    assert (kept.steps, kept.pace, kept.size) == (train_cfg.max_steps, None, None)


def test_a_run_re_planned_in_training_resumes_exactly_through_train_run(
        sum_task, tmp_path, monkeypatch):
    """The re-plan through ``train_run`` and ``--resume``'s path (``plan_resumed_run``): the
    checkpoint's fitted schedule and steps are what the resumed run continues. Every loss
    call moves a fake training clock by 1 s: after step 11 (11 s), 100 steps of 1 s project
    to 100 s > 60, so the run is fitted to 11 + (0.9 * 60 - 11) = 54 steps."""
    from addnorm.tasks.plan import plan_resumed_run
    from addnorm.training import trainer as trainer_module
    from addnorm.training.clock import TrainingClock

    now = [0.0]
    monkeypatch.setattr(trainer_module, "TrainingClock",
                        lambda clock=None: TrainingClock(lambda: now[0]))
    calls = {"n": 0, "stop_at": None}

    class Timed(SumTask):
        def loss_fn(self, task_cfg):
            loss = super().loss_fn(task_cfg)

            def timed(model, batch):
                calls["n"] += 1
                if calls["n"] == calls["stop_at"]:
                    raise KeyboardInterrupt
                now[0] += 1.0
                return loss(model, batch)

            return timed

    plan = plan_fresh_run("vector-sum", train_overrides={
        "max_steps": 100, "warmup": 20, "schedule": "cosine", "max_minutes": 1.0,
        "checkpoint_every": 25})

    def run(out, how=plan):
        return train_run("vector-sum", how.model_cfg, how.train_cfg, out,
                         task_cfg=how.task_cfg, task=Timed(), resume=how.resume)

    whole = run(tmp_path / "whole")
    assert whole.replan is not None and (whole.replan.steps, whole.step) == (54, 54)
    calls.update(n=0, stop_at=26)  # the first (only) micro-batch of step 26
    first = run(tmp_path / "split")
    assert (first.stopped_by, first.step) == ("interrupt", 25)
    calls.update(n=0, stop_at=None)
    resumed_plan = plan_resumed_run("vector-sum", tmp_path / "split")
    assert resumed_plan.train_cfg.max_steps == 54  # the plan the checkpoint recorded
    resumed = run(tmp_path / "split", resumed_plan)
    assert (resumed.step, resumed.stopped_by, resumed.replan) == (54, "max_steps", None)

    def records(out):
        return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]

    assert [(r["loss"], r["lr"]) for r in records(tmp_path / "split")] == [
        (r["loss"], r["lr"]) for r in records(tmp_path / "whole")]
    assert resumed.metrics["val_mse"] == whole.metrics["val_mse"]


def test_steps_planned_to_fill_the_budget_are_recorded_for_the_trainer(sum_task):
    users = SumTask(data=SumData(n_train=10**6, record="your files"))
    task, cfg, train_cfg, task_cfg = sum_plan(users, max_minutes=5.0)
    given = {"d_model"}  # (the model kept: one measured pace)
    _, fitted, plan = budget_plan(task, cfg, train_cfg, task_cfg, "cpu", given=given,
                                  measure=fake_pace(0.5))
    # As many as fit 0.9 * 300 s at 0.5 s: 540, re-planned up in training if faster.
    assert (plan.steps_from, fitted.max_steps, fitted.fill_budget, plan.fill) == (
        "budget", 540, True, True)
    assert fitted.max_steps == fitting_steps(300.0, 0.5)
    # The last check of 540 steps (warm-up scaled to them) comes at a quarter: step 135.
    assert plan.lines()[-1].endswith(
        "re-planned once, down after its first steps if slower, or up after step 135 if faster")
    # Steps a caller gave, or no to fill_budget, are only fitted down.
    for more, values in (({"max_steps"}, {}), ({"fill_budget"}, {"fill_budget": False})):
        asked = dataclasses.replace(train_cfg, **values)
        _, kept, plan = budget_plan(task, cfg, asked, task_cfg, "cpu", given=given | more,
                                    measure=fake_pace(0.5))
        assert kept.fill_budget is values.get("fill_budget") and not plan.fill
        assert plan.lines()[-1].endswith("re-planned once, after its first steps, if slower")


def test_the_bundled_datas_steps_fill_the_budget_only_when_asked(sum_task):
    task, cfg, train_cfg, task_cfg = sum_plan(max_minutes=1.0, max_steps=8)
    _, kept, plan = budget_plan(task, cfg, train_cfg, task_cfg, "cpu", measure=fake_pace(0.5))
    assert (kept, plan.steps_from, plan.fill) == (train_cfg, "task", False)  # bit for bit
    asked = dataclasses.replace(train_cfg, fill_budget=True)
    _, filled, plan = budget_plan(task, cfg, asked, task_cfg, "cpu", given={"fill_budget"},
                                  measure=fake_pace(0.5))
    assert (plan.steps_from, filled.max_steps, filled.fill_budget) == ("budget", 108, True)
    with pytest.raises(ValueError, match="fill_budget and max_steps both set the steps"):
        budget_plan(task, cfg, asked, task_cfg, "cpu", given={"fill_budget", "max_steps"},
                    measure=fake_pace(0.5))
    with pytest.raises(ValueError, match="fill_budget and epochs both set the steps"):
        budget_plan(task, cfg, dataclasses.replace(asked, epochs=1.0), task_cfg, "cpu",
                    given={"fill_budget", "epochs"}, measure=fake_pace(0.5))
    with pytest.raises(ValueError, match="fill_budget needs a time budget"):
        budget_plan(task, cfg, dataclasses.replace(asked, max_minutes=None), task_cfg, "cpu",
                    given={"fill_budget"}, measure=fake_pace(0.5))
