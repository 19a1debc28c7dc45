"""addnorm.bench.training_step: one training case is checked before it is timed. Oracle: the
float32 loss of the same weights on the check batch (computed here with torch.nn directly);
every implementation's first loss must lie within FP32_LOSS of it, so a changed weight fails."""

from __future__ import annotations

import copy

import torch
from torch import nn

from addnorm.bench import BenchSettings, Report
from addnorm.bench.tolerances import FP32_LOSS
from addnorm.bench.training_step import TrainImpl, adamw, run_training_case

TINY = BenchSettings(size="test", rounds=1, min_seconds=0.0, precision="fp32")


def impls(change: float = 0.0) -> list[TrainImpl]:
    torch.manual_seed(0)
    reference = nn.Linear(4, 1)
    ours = copy.deepcopy(reference)
    with torch.no_grad():
        ours.weight[0, 0] += change

    def loss(model):
        return lambda x, y: nn.functional.mse_loss(model(x), y)

    return [TrainImpl("ours", ours, loss(ours), adamw(ours), twin="ref"),
            TrainImpl("ref", reference, loss(reference), adamw(reference), reference=True)]


def run(change: float) -> Report:
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(8, 4, generator=g), torch.randn(8, 1, generator=g)
    pair = impls(change)
    with torch.no_grad():
        exact = nn.functional.mse_loss(pair[1].model(x), y).item()
    report = Report()
    steps = run_training_case("g", "c", pair, check_batch=(x, y), timed_batch=(x, y),
                              exact=exact, per_call=8, unit="examples/s", flops=64.0,
                              settings=TINY, report=report, log=lambda line: None)
    assert set(steps) == {"ours", "ref"}
    return report


def test_a_case_checks_each_first_loss_against_the_same_weights_and_times_every_step():
    report = run(0.0)
    assert len(report.checks) == 2 and all(c.passed for c in report.checks)
    assert all(c.tolerance == FP32_LOSS for c in report.checks)
    assert {r.impl for r in report.rows} == {"ours", "ref"}
    ours = next(r for r in report.rows if r.impl == "ours")
    assert ours.twin == "ref" and ours.flops == 64.0 and len(ours.samples) == 1


def test_a_changed_weight_fails_its_check():
    report = run(1.0)
    assert [c.passed for c in report.checks] == [False, True]  # ours, then the reference
