"""addnorm.bench.padded_batch: the padded-batch embeddings match BERT's, padded and unpadded. Tiny
sizes, one round."""

from __future__ import annotations

import pytest

from addnorm.bench import BenchSettings, Report

TINY = BenchSettings(size="test", rounds=1, min_seconds=0.0)


def test_padded_batch_embeddings_match_bert_padded_and_unpadded():
    pytest.importorskip("transformers")
    from addnorm.bench.padded_batch import run_padded_batch

    report = Report()
    run_padded_batch(TINY, report, lambda line: None)
    assert len(report.checks) == 2 and all(check.passed for check in report.checks)
    assert {row.impl for row in report.rows} == {
        "addnorm, unpadded", "addnorm, padded", "HF BertModel"}
