"""addnorm.bench.dit_inference: the DiT forward against diffusers', tiny, with its same-weights
checks (and that they can fail). Speed is never asserted."""

from __future__ import annotations

import pytest
from bench_groups import (
    EAGER,
    NEEDS,
    TINY,
    check_changed_weight_fails,
    check_group_run,
)


def test_dit_inference_runs_tiny_with_passing_checks_and_full_rows():
    pytest.importorskip(NEEDS["dit-infer"])
    check_group_run("dit-infer", TINY, EAGER["dit-infer"])


def test_a_changed_dit_weight_fails_the_same_weights_check(monkeypatch):
    pytest.importorskip(NEEDS["dit-infer"])
    import addnorm.bench.dit_inference as module

    check_changed_weight_fails("dit-infer", module, "dit_pair", monkeypatch)
