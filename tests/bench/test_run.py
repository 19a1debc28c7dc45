"""addnorm.bench.run: run_bench runs the named groups, records a failing one and goes on, and
skips what the budget or a missing reference leaves out."""

from __future__ import annotations

import pytest

from addnorm.bench import BenchSettings, run_bench
from addnorm.bench.harness import format_table

TINY = BenchSettings(size="test", rounds=1, min_seconds=0.0)


def test_a_group_whose_reference_is_missing_adds_a_note_and_no_rows(monkeypatch):
    import addnorm.bench.dit as dit

    def missing(name, notes):
        notes.append(f"{name} skipped: not installed")

    monkeypatch.setattr(dit, "optional_module", missing)
    report = run_bench(TINY, ["timestep"])
    assert report.rows == [] and report.checks == []
    assert any("skipped" in note for note in report.notes)


def test_a_failing_group_is_recorded_and_the_run_goes_on(monkeypatch):
    import addnorm.bench.run as run

    def broken(settings, report, log):
        raise RuntimeError("out of memory, say")

    ran: list[str] = []
    monkeypatch.setitem(run.GROUPS, "bert", broken)
    monkeypatch.setitem(run.GROUPS, "dit-infer", lambda s, r, log: ran.append("dit-infer"))
    report = run_bench(TINY, ["bert", "dit-infer"], keep_going=True)
    assert ran == ["dit-infer"]
    assert len(report.errors) == 1 and report.errors[0].startswith("bert: RuntimeError: out of")
    assert "Traceback" in report.errors[0]
    assert "### errors" in format_table(report)
    with pytest.raises(RuntimeError, match="out of memory"):
        run_bench(TINY, ["bert"])


def test_groups_after_the_budget_are_skipped_with_a_note(monkeypatch):
    import addnorm.bench.run as run

    ran: list[str] = []
    monkeypatch.setitem(run.GROUPS, "bert", lambda s, r, log: ran.append("bert"))
    report = run_bench(TINY, ["bert"], budget=-1.0)
    assert ran == [] and any("bert: not run" in note for note in report.notes)


def test_the_cpu_suite_groups_refuse_a_gpu_device():
    settings = BenchSettings(size="test", rounds=1, min_seconds=0.0, device="meta")
    with pytest.raises(ValueError, match="run on the CPU only"):
        run_bench(settings, ["encoder"])
