"""addnorm.bench.dit_training: the DiT-XL and DiT-B training steps against diffusers', tiny,
eager and compiled, with their same-weights checks. Speed is never asserted."""

from __future__ import annotations

import pytest
from bench_groups import (
    COMPILED,
    COMPILED_IMPLS,
    EAGER,
    NEEDS,
    TINY,
    check_group_run,
)


@pytest.mark.parametrize("group", ['dit-train', 'dit-b-train'])
def test_dit_training_runs_tiny_eager_with_passing_checks_and_full_rows(group):
    pytest.importorskip(NEEDS[group])
    check_group_run(group, TINY, EAGER[group])


# Compiling (dynamo and AOT autograd, even without inductor) costs seconds per model on 2
# cores: the default run compiles the GPT-2 step and the one-layer DiT step, and decoding in
# float32; every group compiled is the slow run's.
@pytest.mark.parametrize(
    "group", ["dit-b-train", pytest.param("dit-train", marks=pytest.mark.slow)])
def test_dit_training_runs_tiny_compiled_with_passing_checks_and_full_rows(group, quick_compile):
    pytest.importorskip(NEEDS[group])
    check_group_run(group, COMPILED, COMPILED_IMPLS[group])
