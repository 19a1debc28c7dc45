"""addnorm.bench.profiling: --profile writes the time and memory tables and one trace per profiled
call."""

from __future__ import annotations

import json

import pytest

from addnorm.bench import BenchSettings, run_bench


def test_profile_writes_both_tables_the_memory_and_a_trace(tmp_path, quick_compile):
    pytest.importorskip("transformers")
    settings = BenchSettings(size="test", rounds=1, min_seconds=0.0, compile=False,
                             profile_dir=str(tmp_path))
    run_bench(settings, ["gpt2-train"])
    summary = (tmp_path / "summary.txt").read_text()
    assert summary.count("=====") == 4  # two profiled steps: addnorm and HF, eager
    assert "top 30 by self_cpu_time_total" in summary
    assert "top 30 by self_cpu_memory_usage" in summary
    assert "optimizer state" in summary and "aten::" in summary
    traces = sorted(p.name for p in (tmp_path / "traces").iterdir())
    assert len(traces) == 2
    assert all(json.loads((tmp_path / "traces" / t).read_text())["traceEvents"] for t in traces)
