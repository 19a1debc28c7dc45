"""The GPU suite of ``addnorm bench`` at its tiny sizes on the CPU (and on CUDA where present):
every group, its same-weights checks (and that they can fail), its rows and JSON, and the
``--suite gpu`` command. Speed itself is never asserted here."""

from __future__ import annotations

import json
import statistics

import pytest
import torch

from addnorm.bench import BenchSettings, run_bench, to_json
from addnorm.bench.harness import format_table, from_json
from addnorm.bench.run import GPU_GROUPS, GROUPS
from addnorm.cli.parser import main

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


def _check_group_run(group: str, settings: BenchSettings, impls: set[str]) -> None:
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


@pytest.mark.parametrize("group", list(GPU_GROUPS))
def test_each_gpu_group_runs_tiny_eager_with_passing_checks_and_full_rows(group):
    pytest.importorskip(NEEDS[group])
    _check_group_run(group, TINY, EAGER[group])


# Compiling (dynamo and AOT autograd, even without inductor) costs seconds per model on 2
# cores: the default run compiles the GPT-2 step and the one-layer DiT step, and decoding in
# float32 below; every group compiled is the slow run's.
@pytest.mark.parametrize("group", [
    "gpt2-train", "dit-b-train",
    *[pytest.param(g, marks=pytest.mark.slow) for g in ("gpt2-decode", "dit-train")],
])
def test_gpu_group_runs_tiny_compiled_with_passing_checks_and_full_rows(group, quick_compile):
    pytest.importorskip(NEEDS[group])
    _check_group_run(group, COMPILED, COMPILED_IMPLS[group])


@pytest.mark.parametrize("group", ["gpt2-train", "bert", "dit-infer"])
def test_a_changed_weight_fails_the_same_weights_check(group, monkeypatch):
    # The checks can fail: addnorm's copy of the weights gets one entry changed.
    pytest.importorskip(NEEDS[group])
    import addnorm.bench.bert_inference as bert
    import addnorm.bench.dit_inference as dit
    import addnorm.bench.gpt2_training as gpt2

    module = {"gpt2-train": gpt2, "bert": bert, "dit-infer": dit}[group]
    name = {"gpt2-train": "gpt2_pair", "bert": "bert_pair", "dit-infer": "dit_pair"}[group]
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


# ---------------------------------------------------------------------- FLOP formulas


# ---------------------------------------------------------------- memory, bounds, profile


# --------------------------------------------------------------------- the run and the CLI


def test_cli_runs_a_gpu_group_tiny_and_writes_json(tmp_path, capsys):
    pytest.importorskip("transformers")
    out = tmp_path / "bench.json"
    code = main(["bench", "--suite", "gpu", "--tiny", "--only", "bert", "--json", str(out)])
    assert code == 0
    data = json.loads(out.read_text())
    assert data["machine"]["command"] == "addnorm bench --suite gpu --tiny --only bert"
    assert data["peak_flops"] > 0 and data["errors"] == []
    assert {r["group"] for r in data["rows"]} == {"matrix multiply",
                                                   "BERT inference, padded batch"}
    captured = capsys.readouterr()
    assert "real tokens/s" in captured.out
    assert "] BERT inference, padded batch: BERT-tiny" in captured.err  # timestamped progress


@pytest.mark.parametrize("argv", [
    ["bench", "--device", "mps"], ["bench", "--device", "auto"], ["bench", "--budget", "0"],
    ["bench", "--budget", "nan"], ["bench", "--device", "cuda:99999"],
])
def test_cli_refuses_bad_gpu_suite_arguments_with_exit_code_2(argv, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("addnorm bench: error:")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("group", ["gpt2-train", "bert"])
def test_gpu_group_runs_tiny_on_cuda_with_memory_measured(group):
    pytest.importorskip("transformers")
    settings = BenchSettings(size="test", rounds=1, min_seconds=0.0, compile=False,
                             device="cuda")
    report = run_bench(settings, [group])
    assert report.errors == [] and all(c.passed for c in report.checks)
    rows = [r for r in report.rows if r.group != "matrix multiply"]
    assert rows and all(r.peak_memory is not None and r.peak_memory > 0 for r in rows)


def test_the_gpu_session_script_parses():
    # benchmarks/gpu_session.sh runs once on a lent GPU; a syntax error would waste it.
    import shutil
    import subprocess
    from pathlib import Path

    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("no bash")
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_session.sh"
    assert subprocess.run([bash, "-n", str(script)], check=False).returncode == 0


def test_groups_cover_the_gpu_suite():
    assert set(EAGER) == set(COMPILED_IMPLS) == set(GPU_GROUPS) and set(GPU_GROUPS) <= set(GROUPS)
