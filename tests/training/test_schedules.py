"""The learning-rate schedules: each follows its closed form (the paper's eq. 3, the linear
warm-up, the half cosine to a floor) step by step, past its end, and its state round-trips
through JSON."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from properties import examples
from scheduled import scheduled_lrs
from torch import nn

from addnorm.training.config import TrainConfig
from addnorm.training.schedules import SCHEDULES, ScheduleConfig, make_scheduler, noam_lr


def warmup_cosine(step: int, *, peak: float, warmup: int, total: int, final: float) -> float:
    """Linear warm-up to ``peak`` at step ``warmup``, a half cosine to ``final`` at ``total``,
    then ``final`` (the schedule "cosine" restated in closed form)."""
    if step <= warmup:
        return peak * step / warmup
    progress = min((step - warmup) / max(total - warmup, 1), 1.0)
    return final + 0.5 * (peak - final) * (1.0 + math.cos(math.pi * progress))


def test_noam_schedule_peaks_at_warmup_with_the_papers_value():
    d_model, warmup = 512, 4000
    peak = noam_lr(warmup, d_model=d_model, warmup=warmup)
    # At step == warmup both branches of the min agree: d_model^-0.5 * warmup^-0.5.
    # Python floats, a few roundings of a closed form: FLOAT64_EXACT's rel=1e-12 throughout.
    assert peak == pytest.approx(d_model**-0.5 * warmup**-0.5, rel=1e-12)
    half = noam_lr(warmup // 2, d_model=d_model, warmup=warmup)
    assert half == pytest.approx(peak / 2, rel=1e-12)
    quarter = noam_lr(4 * warmup, d_model=d_model, warmup=warmup)
    assert quarter == pytest.approx(peak / 2, rel=1e-12)
    assert noam_lr(1, d_model=d_model, warmup=warmup, scale=2.0) == pytest.approx(
        2 * d_model**-0.5 * warmup**-1.5, rel=1e-12
    )


def test_cosine_schedule_rises_to_the_peak_then_decays_to_the_floor():
    lrs = scheduled_lrs(ScheduleConfig("cosine", 1.0, 10, total_steps=110,
                                       final_lr_fraction=0.1), 500)
    # Torch's schedulers step their lr recursively: a few roundings of float64 per step,
    # 1e-12 relative over 500 steps (FLOAT64_EXACT's rel).
    rel = 1e-12
    assert lrs[5 - 1] == pytest.approx(0.5, rel=rel)
    assert lrs[10 - 1] == pytest.approx(1.0, rel=rel)
    assert lrs[60 - 1] == pytest.approx(0.55, rel=rel)  # halfway: the mean
    assert lrs[110 - 1] == pytest.approx(0.1, rel=rel)
    assert lrs[500 - 1] == pytest.approx(0.1, rel=rel)  # held: torch's cosine alone would rise


@examples(30)
@given(kind=st.sampled_from(SCHEDULES), warmup=st.integers(1, 40),
       total=st.integers(1, 120), fraction=st.sampled_from([0.0, 0.05, 0.5, 1.0]))
def test_every_schedule_follows_its_closed_form_past_its_end(kind, warmup, total, fraction):
    # The closed forms restated; 60 steps past total_steps (a resumed run may go on).
    schedule = ScheduleConfig(kind, 3e-3, warmup, total_steps=total, final_lr_fraction=fraction)
    for step, lr in enumerate(scheduled_lrs(schedule, total + 60), start=1):
        if kind == "noam":
            expected = 3e-3 * warmup**0.5 * min(step**-0.5, step * warmup**-1.5)
        elif kind == "constant":
            expected = 3e-3 * min(1.0, step / warmup)
        else:
            expected = warmup_cosine(step, peak=3e-3, warmup=warmup, total=total,
                                     final=fraction * 3e-3)
        # recursive float64 steps (see above); absolute for a floor of 0
        assert lr == pytest.approx(expected, rel=1e-12, abs=1e-18), (step, lr, expected)


def test_a_scheduler_state_is_json_and_a_foreign_one_is_refused_naming_the_entry():
    import json

    from addnorm.training.schedules import check_scheduler_state

    optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = ScheduleConfig("cosine", 1.0, 5, total_steps=20).build(optimizer)
    saved = json.loads(json.dumps(scheduler.state_dict()))
    check_scheduler_state(scheduler, saved)
    with pytest.raises(ValueError, match=r"scheduler\._schedulers differs|must be a list of 3"):
        check_scheduler_state(scheduler, {**saved, "_schedulers": saved["_schedulers"][:2]})
    with pytest.raises(ValueError, match=r"scheduler\.last_epoch must be a number"):
        check_scheduler_state(scheduler, {**saved, "last_epoch": "7"})
    noam = ScheduleConfig("noam", 1.0, 5).build(optimizer)
    with pytest.raises(ValueError, match="differs: missing"):
        check_scheduler_state(noam, saved)


def test_noam_lr_is_the_peak_and_the_papers_choice_reproduces_the_paper():
    d_model, warmup = 512, 4000
    papers_lr = d_model**-0.5 * warmup**-0.5  # the paper's peak, reached at step == warmup
    lrs = scheduled_lrs(ScheduleConfig("noam", papers_lr, warmup), 10_000)
    for step in (1, 10, 1000, 3999, 4000, 4001, 10_000):
        assert lrs[step - 1] == pytest.approx(
            noam_lr(step, d_model=d_model, warmup=warmup), rel=1e-12
        )
    peak = scheduled_lrs(ScheduleConfig("noam", 1e-3, 50), 500)
    assert peak[50 - 1] == pytest.approx(1e-3, rel=1e-12)
    assert max(peak) == pytest.approx(1e-3, rel=1e-12)
    assert peak[200 - 1] == pytest.approx(1e-3 / 2, rel=1e-12)  # 1/sqrt(step): 4x warmup halves


def test_schedule_for_gives_every_schedule_its_peak_lr():
    from addnorm.tasks.run import schedule_for

    for kind in SCHEDULES:
        schedule = schedule_for(TrainConfig(schedule=kind, lr=2e-3, warmup=20))
        assert schedule.kind == kind
        assert scheduled_lrs(schedule, 20)[-1] == pytest.approx(2e-3, rel=1e-12)


def _optimizer() -> torch.optim.Optimizer:
    return torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.1)


def test_make_scheduler_builds_a_config_or_calls_a_factory():
    optimizer = _optimizer()
    built = make_scheduler(ScheduleConfig("constant", 0.1, 0), optimizer)
    assert isinstance(built, torch.optim.lr_scheduler.LRScheduler)
    made = make_scheduler(lambda opt: torch.optim.lr_scheduler.StepLR(opt, 3), _optimizer())
    assert isinstance(made, torch.optim.lr_scheduler.StepLR)


def test_make_scheduler_refuses_what_is_no_torch_scheduler_or_whose_state_is_not_json():
    with pytest.raises(TypeError, match="must be a ScheduleConfig or make a torch"):
        make_scheduler(lambda opt: object(), _optimizer())
    with pytest.raises(TypeError, match="state_dict must be JSON"):  # a set in its state
        make_scheduler(lambda opt: _StepWithASet(opt, 3), _optimizer())


class _StepWithASet(torch.optim.lr_scheduler.StepLR):
    """A StepLR whose state holds a set, which JSON cannot write."""

    def __init__(self, optimizer: torch.optim.Optimizer, step_size: int) -> None:
        self.seen = {0}
        super().__init__(optimizer, step_size)
