"""addnorm.bench.decoding: the timed decoding gives GPT-2's tokens with its weights. Tiny sizes,
one round."""

from __future__ import annotations

import pytest

from addnorm.bench import BenchSettings, Report

TINY = BenchSettings(size="test", rounds=1, min_seconds=0.0)


def test_decoding_gives_gpt2s_tokens_with_its_weights():
    pytest.importorskip("transformers")
    from addnorm.bench.decoding import run_decoding

    report = Report()
    run_decoding(TINY, report, lambda line: None)
    assert [c.name for c in report.checks if not c.passed] == []
    assert len(report.checks) == 2  # batch 1 and 2
    assert {row.impl for row in report.rows} == {"addnorm", "HF GPT-2"}
