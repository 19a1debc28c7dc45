"""What the tests of the GPU suite's groups share: the tiny settings, what each group times,
and the run of one group with its checks (each group's tests: tests/bench/test_<module>.py).
"""

from __future__ import annotations

import json
import statistics

import pytest
import torch

from addnorm.bench import BenchSettings, run_bench, to_json
from addnorm.bench.harness import format_table, from_json

TINY = BenchSettings(size="test", rounds=2, min_seconds=0.0, compile=False)
COMPILED = BenchSettings(size="test", rounds=2, min_seconds=0.0, compile=True)

# What each group times at the tiny size, eager and with compiling on (the references need
# their library: transformers for GPT-2 and BERT, diffusers for the DiTs).
EAGER = {
    "gpt2-train": {"addnorm", "HF GPT-2"},
    "gpt2-decode": {"addnorm", "HF generate"},
    "bert": {"addnorm, padded", "addnorm, unpad=True", "HF BertModel"},
    "dit-infer": {"addnorm", "diffusers"},
    "dit-train": {"addnorm", "diffusers"},
    "dit-b-train": {"addnorm", "diffusers"},
}
COMPILED_IMPLS = {
    "gpt2-train": EAGER["gpt2-train"] | {"addnorm compiled", "HF GPT-2 compiled"},
    "gpt2-decode": EAGER["gpt2-decode"] | {"addnorm compiled", "HF static cache, compiled"},
    "bert": EAGER["bert"],
    "dit-infer": EAGER["dit-infer"],
    "dit-train": EAGER["dit-train"] | {"addnorm compiled", "diffusers compiled"},
    "dit-b-train": {"addnorm compiled", "diffusers compiled"},
}
NEEDS = {"gpt2-train": "transformers", "gpt2-decode": "transformers", "bert": "transformers",
         "dit-infer": "diffusers", "dit-train": "diffusers", "dit-b-train": "diffusers"}


def check_group_run(group: str, settings: BenchSettings, impls: set[str]) -> None:
    """Run one group tiny: no error, every check passed, a same-weights check among them, the
    peak measured, each row complete, the JSON and table well formed."""
    report = run_bench(settings, [group])
    assert report.errors == []
    assert [c.name for c in report.checks if not c.passed] == []
    assert any("same weights" in c.name for c in report.checks)
    peak = [r for r in report.rows if r.group == "matrix multiply"]
    assert len(peak) == 1  # the peak: the median of its per-round rates
    assert report.peak_flops == pytest.approx(
        statistics.median(peak[0].flops / s for s in peak[0].samples))
    rows = [r for r in report.rows if r.group != "matrix multiply"]
    assert {r.impl for r in rows} == impls
    for row in rows:
        assert len(row.samples) == settings.rounds and row.rate > 0
        assert row.flops is not None and row.flops > 0 and row.gemm_fraction is not None
        assert row.peak_memory is None  # measured on CUDA only
        assert (row.compile_seconds is not None) == ("compiled" in row.impl)
        assert report.ratio(row) is not None
    assert sum("graph breaks" in note for note in report.notes) == sum(
        "compiled" in impl for impl in impls) * (2 if group == "gpt2-decode" else 1)
    data = json.loads(json.dumps(to_json(report)))
    assert data == json.loads(json.dumps(to_json(from_json(data))))
    assert all(r["tflops"] > 0 for r in data["rows"])
    table = format_table(report)
    assert "TFLOP/s" in table and "of GEMM" in table
    assert ("| compile |" in table) == any(r.compile_seconds is not None for r in rows)


def check_changed_weight_fails(group: str, module, name: str, monkeypatch) -> None:
    """The checks can fail: addnorm's copy of the weights that ``module.name`` builds gets one
    entry changed, and a same-weights check of ``group`` fails."""
    build = getattr(module, name)

    def changed(*args, **kwargs):
        models = build(*args, **kwargs)
        ours = models[0]
        with torch.no_grad():
            weight = next(p for n, p in ours.named_parameters() if n.endswith("w2.weight"))
            weight[0, 0] += 1.0
        return models

    monkeypatch.setattr(module, name, changed)
    report = run_bench(BenchSettings(size="test", rounds=1, min_seconds=0.0), [group])
    failed = [c.name for c in report.checks if not c.passed]
    assert any("same weights" in name for name in failed)
