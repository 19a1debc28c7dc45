"""addnorm.bench.peak: the matrix-multiply row and the run's peak. Oracle: an n x n by n x n
product is 2 n^3 floating-point operations, and the peak is the median of its per-round
rates (the harness's rule)."""

from __future__ import annotations

import statistics

import pytest

from addnorm.bench import BenchSettings, Report
from addnorm.bench.peak import GROUP, measure_peak


def test_the_peak_is_the_median_rate_of_the_timed_multiply():
    report = Report()
    lines: list[str] = []
    measure_peak(BenchSettings(size="test", rounds=3, min_seconds=0.0), report, lines.append)
    (row,) = report.rows
    assert (row.group, row.case, row.impl) == (GROUP, "128x128x128 float32", "torch.mm")
    assert row.flops == 2 * 128**3 and len(row.samples) == 3
    # float64 arithmetic on the same samples: a few roundings (pytest.approx's rel 1e-6)
    assert report.peak_flops == pytest.approx(statistics.median(row.flops / s
                                                                for s in row.samples))
    assert lines == [f"{GROUP}: 128x128x128 float32"]
