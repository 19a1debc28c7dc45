"""addnorm.bench.dit: the DiT and timestep-embedding groups match diffusers with the same weights.
Tiny sizes, one round."""

from __future__ import annotations

import pytest

from addnorm.bench import BenchSettings, run_bench

TINY = BenchSettings(size="test", rounds=1, min_seconds=0.0)


def test_dit_and_timestep_match_diffusers():
    pytest.importorskip("diffusers")
    report = run_bench(TINY, ["dit", "timestep"])
    assert report.checks and all(check.passed for check in report.checks)
    assert {row.group for row in report.rows} == {"DiT", "timestep embedding"}
