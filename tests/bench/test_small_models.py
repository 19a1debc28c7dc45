"""addnorm.bench.small_models: the translator training rows, checked against their same-weight
twins. Tiny sizes, one round."""

from __future__ import annotations

from addnorm.bench import BenchSettings, Report

TINY = BenchSettings(size="test", rounds=1, min_seconds=0.0)


def test_translator_training_rows_run_on_the_tasks_batch_with_same_weight_checks():
    from addnorm.bench.small_models import _translator

    report = Report()
    _translator(TINY, report, lambda line: None)
    assert [c.name for c in report.checks if not c.passed] == []
    assert len(report.checks) == 2  # torch.nn twin, unpadded twin
    assert {row.impl for row in report.rows} == {
        "addnorm, sinusoidal", "addnorm, default (sinusoidal, unpadded)",
        "addnorm, rotary, unpadded", "torch.nn"}
