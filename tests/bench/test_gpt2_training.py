"""addnorm.bench.gpt2_training: the GPT-2 training step against Hugging Face's, tiny, eager and
compiled, with its same-weights checks (and that they can fail). Speed is never asserted."""

from __future__ import annotations

import pytest
from bench_groups import (
    COMPILED,
    COMPILED_IMPLS,
    EAGER,
    NEEDS,
    TINY,
    check_changed_weight_fails,
    check_group_run,
)


def test_gpt2_training_runs_tiny_eager_with_passing_checks_and_full_rows():
    pytest.importorskip(NEEDS["gpt2-train"])
    check_group_run("gpt2-train", TINY, EAGER["gpt2-train"])


# Compiling (dynamo and AOT autograd, even without inductor) costs seconds per model on 2
# cores: the default run compiles the GPT-2 step and the one-layer DiT step, and decoding in
# float32; every group compiled is the slow run's.
@pytest.mark.parametrize("group", ["gpt2-train"])
def test_gpt2_training_runs_tiny_compiled_with_passing_checks_and_full_rows(group, quick_compile):
    pytest.importorskip(NEEDS[group])
    check_group_run(group, COMPILED, COMPILED_IMPLS[group])


def test_a_changed_gpt2_weight_fails_the_same_weights_check(monkeypatch):
    pytest.importorskip(NEEDS["gpt2-train"])
    import addnorm.bench.gpt2_training as module

    check_changed_weight_fails("gpt2-train", module, "gpt2_pair", monkeypatch)
