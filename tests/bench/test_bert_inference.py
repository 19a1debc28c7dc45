"""addnorm.bench.bert_inference: the padded-batch BERT forward against BertModel's, tiny, with
its same-weights checks (and that they can fail). Speed is never asserted."""

from __future__ import annotations

import pytest
from bench_groups import (
    EAGER,
    NEEDS,
    TINY,
    check_changed_weight_fails,
    check_group_run,
)


def test_bert_inference_runs_tiny_with_passing_checks_and_full_rows():
    pytest.importorskip(NEEDS["bert"])
    check_group_run("bert", TINY, EAGER["bert"])


def test_a_changed_bert_weight_fails_the_same_weights_check(monkeypatch):
    pytest.importorskip(NEEDS["bert"])
    import addnorm.bench.bert_inference as module

    check_changed_weight_fails("bert", module, "bert_pair", monkeypatch)
