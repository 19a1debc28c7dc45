"""What ranks a run's evaluations on its validation split (addnorm.training.best): the record,
the defaults, when evaluations are due, and a record of another metric refused.

Provenance: the record is restated from its contract (strictly better in the metric's
direction; NaN and inf never; a tie keeps the earlier step); the defaults from
``TrainConfig``'s documented ones (a tenth of max_steps; keep_best none: the task's choice).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from torch import nn

from addnorm.training.best import (
    BestKeeper,
    BestSoFar,
    Validation,
    eval_interval,
    keeps_best,
    validates,
)
from addnorm.training.config import TrainConfig
from addnorm.utils.files import CheckpointError


def val_mse(model: nn.Module) -> dict[str, float]:
    return {"val_mse": 1.0}


VALIDATION = Validation("val_mse", higher_is_better=False, score=val_mse)


def test_better_is_strict_in_the_metrics_direction_and_never_a_non_finite_score():
    lower = BestSoFar("val_bpc", higher_is_better=False)
    assert lower.better(5.0) and not lower.better(float("nan"))
    assert not lower.better(float("-inf"))
    record = lower.after(10, 5.0).after(20, 5.0).after(30, 4.0).after(40, float("nan"))
    assert (record.step, record.value, record.evaluated, record.last, record.since) == (
        30, 4.0, 40, None, 1)  # the tie at step 20 keeps step 10; NaN never wins
    higher = BestSoFar("val_exact_match", higher_is_better=True).after(5, 0.5).after(6, 0.25)
    assert (higher.step, higher.value, higher.since) == (5, 0.5, 1)


def test_the_record_round_trips_through_json_and_refuses_what_it_never_writes():
    record = BestSoFar("val_bpc", False).after(10, 2.5).after(20, 3.0)
    assert BestSoFar.from_dict(record.to_dict()) == record
    for bad, named in (
        ({**record.to_dict(), "value": None}, "both be null"),
        ({**record.to_dict(), "since": -1}, "best.since"),
        ({**record.to_dict(), "step": True}, "best.step"),
        ({**record.to_dict(), "value": float("inf")}, "best.value"),
        ({**record.to_dict(), "extra": 1}, "unknown entries"),
        ([], "must be an object"),
    ):
        with pytest.raises(ValueError, match=named):
            BestSoFar.from_dict(bad)


def test_keep_best_follows_the_task_unless_told_and_needs_something_to_validate_on():
    config = TrainConfig()
    by_default = Validation("val_bpc", False, val_mse, keep_by_default=True)
    assert keeps_best(config, by_default) and not keeps_best(config, VALIDATION)
    assert not keeps_best(config, None)
    assert not keeps_best(TrainConfig(keep_best=False), by_default)
    assert keeps_best(TrainConfig(keep_best=True), VALIDATION)
    assert validates(TrainConfig(patience=2), VALIDATION)
    nothing = Validation("val_bpc", False, val_mse, keep_by_default=True,
                         unavailable="the held-out pairs have one source")
    assert not keeps_best(config, nothing)  # (off by default, silently)
    for asked in (TrainConfig(keep_best=True), TrainConfig(patience=3)):
        with pytest.raises(ValueError, match="one source"):
            validates(asked, nothing)
        with pytest.raises(ValueError, match="has none"):
            validates(asked, None)


def test_evaluations_come_every_eval_every_steps_or_ten_times_a_run_and_at_the_last_step():
    assert eval_interval(TrainConfig(max_steps=600)) == 60
    assert eval_interval(TrainConfig(max_steps=7)) == 1
    assert eval_interval(TrainConfig(max_steps=600, eval_every=25)) == 25
    keeper = BestKeeper(VALIDATION, every=4, keep=True, patience=None)
    assert [s for s in range(1, 11) if keeper.due(s, max_steps=10)] == [4, 8, 10]


def test_a_record_ranking_by_another_metric_or_direction_is_refused():
    keeper = BestKeeper(VALIDATION, every=2, keep=True, patience=None)
    saved = BestSoFar("val_mse", False).after(4, 2.0)
    keeper.resume(saved, Path("state.json"))
    assert keeper.record == saved and not keeper.pending(4) and keeper.pending(5)
    for other in (BestSoFar("val_mae", False), BestSoFar("val_mse", True)):
        with pytest.raises(CheckpointError, match="this run ranks by 'val_mse'"):
            BestKeeper(VALIDATION, every=2, keep=True, patience=None).resume(
                other, Path("state.json"))
    keeper.resume(None, Path("state.json"))  # a checkpoint without one: nothing changes
    assert keeper.record == saved


def test_patience_runs_out_after_that_many_evaluations_without_a_better_score():
    keeper = BestKeeper(VALIDATION, every=1, keep=False, patience=2)
    for step, value in enumerate([3.0, 2.0, 2.5, 2.0], start=1):
        assert not keeper.exhausted
        keeper.record = keeper.scored(step, {"val_mse": value})
    assert keeper.exhausted and keeper.record.step == 2  # 2.5 and the tie 2.0: no better
    with pytest.raises(ValueError, match="lack its metric 'val_mse'"):
        keeper.scored(5, {"val_mae": 1.0})


def test_a_tie_goes_to_the_later_step_only_with_a_strictly_lower_tie_break():
    # A DiT's class agreement reaches 1.0 long before its samples have the data's spread
    # (docs: the 16x16 digits run kept step 938 of 4,694 at Fréchet 72 where the last weights
    # scored 24): equal scores are ranked by the tie-break figure, lower is better.
    record = BestSoFar("val_class_agreement", True).after(10, 1.0, 72.0)
    assert record.tie == 72.0
    worse, same, none = (record.after(20, 1.0, 80.0), record.after(20, 1.0, 72.0),
                         record.after(20, 1.0))
    assert [r.step for r in (worse, same, none)] == [10, 10, 10]
    assert [r.since for r in (worse, same, none)] == [1, 1, 1]
    better = record.after(20, 1.0, 24.0)
    assert (better.step, better.value, better.tie, better.since) == (20, 1.0, 24.0, 0)
    assert record.after(20, 1.0, float("nan")).step == 10  # a non-finite tie-break never wins
    assert record.after(20, 0.99, 1.0).step == 10  # the metric first
    # a best without a tie-break figure (an earlier version's record) yields to one with it
    assert BestSoFar("val_class_agreement", True).after(10, 1.0).after(20, 1.0, 9.0).step == 20
    # the figure is kept for resume; a record without one is written as earlier versions did
    assert BestSoFar.from_dict(better.to_dict()) == better
    assert "tie" not in BestSoFar("val_bpc", False).after(10, 2.0).to_dict()
    with pytest.raises(ValueError, match="best.tie"):
        BestSoFar.from_dict({**better.to_dict(), "tie": float("inf")})


def test_the_keeper_reads_the_tie_break_from_the_validations_scores():
    validation = Validation("val_acc", True, score=val_mse, tie_break="val_fd")
    keeper = BestKeeper(validation, every=1, keep=True, patience=None)
    keeper.record = keeper.scored(1, {"val_acc": 1.0, "val_fd": 5.0})
    assert keeper.scored(2, {"val_acc": 1.0, "val_fd": 3.0}).step == 2
    assert keeper.scored(2, {"val_acc": 1.0}).step == 1  # no figure: no tie-break
    plain = BestKeeper(VALIDATION, every=1, keep=True, patience=None)
    plain.record = plain.scored(1, {"val_mse": 1.0, "val_fd": 5.0})
    assert plain.scored(2, {"val_mse": 1.0, "val_fd": 3.0}).step == 1
