"""addnorm.bench.gpt2_decoding: greedy decoding against Hugging Face's generate, tiny, eager and
compiled, its tokens checked. Speed is never asserted."""

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

from addnorm.bench import BenchSettings, run_bench


def test_gpt2_decoding_runs_tiny_eager_with_passing_checks_and_full_rows():
    pytest.importorskip(NEEDS["gpt2-decode"])
    check_group_run("gpt2-decode", TINY, EAGER["gpt2-decode"])


# Compiling (dynamo and AOT autograd, even without inductor) costs seconds per model on 2
# cores: the default run compiles the GPT-2 step and the one-layer DiT step, and decoding in
# float32; every group compiled is the slow run's.
@pytest.mark.parametrize("group", [pytest.param("gpt2-decode", marks=pytest.mark.slow)])
def test_gpt2_decoding_runs_tiny_compiled_with_passing_checks_and_full_rows(group, quick_compile):
    pytest.importorskip(NEEDS[group])
    check_group_run(group, COMPILED, COMPILED_IMPLS[group])


def test_float32_decoding_checks_compiled_tokens_and_bf16_only_notes_them(quick_compile):
    pytest.importorskip("transformers")
    fp32 = run_bench(BenchSettings(size="test", rounds=1, min_seconds=0.0, compile=True,
                                   precision="fp32"), ["gpt2-decode"])
    assert fp32.errors == [] and all(c.passed for c in fp32.checks)
    compiled = [c for c in fp32.checks if "addnorm compiled vs addnorm" in c.name]
    assert len(compiled) == 2 and all(c.passed and c.tolerance == 0 for c in compiled)
    assert not any("same token" in note for note in fp32.notes)
    rows = [r for r in fp32.rows if r.group != "matrix multiply"]
    assert all(r.steps == 6 and r.ms_per_step == pytest.approx(1e3 * r.seconds / 6)
               for r in rows)
