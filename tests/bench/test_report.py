"""addnorm.bench.report: the ratios against the references, the checks, the table and the
JSON, on rows with stated samples (the expected ratios are their medians and quartiles,
computed by hand). Speed itself is never asserted."""

from __future__ import annotations

import pytest

from addnorm.bench import Check, Report, Row, to_json
from addnorm.bench.report import format_table


def test_ratio_is_the_rate_over_the_fastest_reference_of_the_same_case():
    rows = [Row("g", "c", "ours", (1.0,), 10, "x/s", reference=False),
            Row("g", "c", "slow ref", (4.0,), 10, "x/s", reference=True),
            Row("g", "c", "fast ref", (2.0,), 10, "x/s", reference=True),
            Row("g", "other", "ours", (1.0,), 10, "x/s", reference=False)]
    report = Report(rows=rows)
    # pytest.approx's default rel=1e-6 throughout: float64 ratios, medians and quartiles of
    # a few small exact numbers, a few u (1.1e-16) from the printed values.
    assert report.ratio(rows[0]) == pytest.approx(2.0)  # 10/s against the best 5/s
    assert report.ratio(rows[2]) == pytest.approx(1.0)
    assert report.ratio(rows[3]) is None  # no reference in that case
    assert "2.00x" in format_table(report)


def test_ratio_and_its_range_are_the_median_and_quartiles_of_the_per_round_ratios():
    rows = [Row("g", "c", "ours", (1.0, 1.0, 1.0, 2.0), 10, "x/s", reference=False),
            Row("g", "c", "ref", (2.0, 2.0, 3.0, 3.0), 10, "x/s", reference=True),
            Row("g", "d", "ours", (1.0,), 10, "x/s", reference=False),
            Row("g", "d", "ref", (2.0,), 10, "x/s", reference=True)]
    report = Report(rows=rows)
    # per-round ratios 2, 2, 3, 1.5: median 2 (the ratio of the medians would be 2.5 / 1),
    # quartiles (inclusive) 1.875 and 2.25
    assert report.ratio(rows[0]) == pytest.approx(2.0)
    assert report.ratio_range(rows[0]) == pytest.approx((1.875, 2.25))
    assert report.ratio_range(rows[1]) is None  # the reference itself
    assert report.ratio(rows[2]) == pytest.approx(2.0) and report.ratio_range(rows[2]) is None
    assert "| 2.00x (1.88-2.25) |" in format_table(report)
    assert to_json(report)["rows"][0]["ratio_range"] == pytest.approx([1.875, 2.25])


def test_check_passes_only_within_its_tolerance():
    assert Check("g", "n", 1e-6, 1e-5).passed
    assert not Check("g", "n", 1.0, 0.0).passed


def test_twin_ratio_is_against_the_same_weights_reference_shown_with_several_references():
    rows = [Row("g", "c", "ours pre", (1.0,), 9, "x/s", reference=False, twin="pre ref"),
            Row("g", "c", "pre ref", (1.0,), 10, "x/s", reference=True),
            Row("g", "c", "post ref", (1.0,), 12, "x/s", reference=True),
            Row("h", "c", "ours", (1.0,), 9, "x/s", reference=False, twin="ref"),
            Row("h", "c", "ref", (1.0,), 10, "x/s", reference=True)]
    report = Report(rows=rows)
    assert report.ratio(rows[0]) == pytest.approx(0.75)  # 9 against the fastest, 12
    assert report.twin_ratio(rows[0]) == pytest.approx(0.9)  # 9 against its twin, 10
    assert report.twin_ratio(rows[1]) is None
    table = format_table(report)
    group_g, group_h = table.split("### h")
    assert "vs twin" in group_g and "| 0.75x | 0.90x |" in group_g
    assert "vs twin" not in group_h  # one reference: its twin is the best reference
    assert to_json(report)["rows"][0]["ratio_to_twin"] == pytest.approx(0.9)


def test_table_shows_memory_compile_and_step_columns_only_where_a_group_has_them():
    rows = [Row("g", "c", "ours", (0.5,), 100, "tokens/s", reference=False, flops=1e12,
                peak_memory=3 * 2**30, compile_seconds=12.0, steps=50, twin="ref"),
            Row("g", "c", "ref", (1.0,), 100, "tokens/s", reference=True, flops=1e12,
                peak_memory=2**29, steps=50),
            Row("h", "c", "ours", (1.0,), 10, "x/s", reference=False)]
    report = Report(rows=rows, peak_flops=4e12)
    table = format_table(report)
    group_g, group_h = table.split("### h")
    assert "| ms/step | TFLOP/s | of GEMM | peak memory | compile |" in group_g
    # 0.5 s per call of 50 steps: 10 ms/step; 1e12 FLOPs in 0.5 s: 2 TFLOP/s
    assert "| 200 tokens/s | 2.00x | 10 | 2 |  | 3.00 GiB | 12 s |" in group_g
    assert "| 512.0 MiB |" in group_g
    assert "ms/step" not in group_h and "peak memory" not in group_h
    assert "4 TFLOP/s" in table  # the same-run peak
    data = to_json(report)
    assert data["rows"][0]["tflops"] == pytest.approx(2.0)
    assert data["rows"][0]["ms_per_step"] == pytest.approx(10.0)
