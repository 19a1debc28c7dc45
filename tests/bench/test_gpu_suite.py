"""The GPU suite of ``addnorm bench`` at its tiny sizes on the CPU (and on CUDA where present):
every group, its same-weights checks (and that they can fail), its rows and JSON, the FLOP
formulas against torch's own counter, the memory and profiling helpers, and the run's
keep-going and budget. Speed itself is never asserted here."""

from __future__ import annotations

import functools
import json
import statistics

import pytest
import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from addnorm.bench import BenchSettings, run_bench, to_json
from addnorm.bench.flops import dit_flops, encoder_flops, lm_flops, matmul_weights
from addnorm.bench.harness import format_table, from_json
from addnorm.bench.measure import peak_memory, state_bytes
from addnorm.bench.run import GPU_GROUPS, GROUPS
from addnorm.bench.tolerances import BF16_U, bf16_bound
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


@pytest.fixture(autouse=True)
def one_thread():
    """One torch thread: nothing here is timed, and on a shared 2-core machine a parallel
    region of the tiny models' kernels can wait hundreds of milliseconds for its second
    thread (fused AdamW of 50k parameters: 0.7 s at 2 threads under load, 0.2 ms at 1)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def quick_compile(monkeypatch):
    """``torch.compile`` with the aot_eager backend: dynamo and AOT autograd capture the same
    graphs (``fullgraph`` refusals included) and run them eagerly, without inductor's code
    generation, which takes minutes on 2 cores. Used by addnorm's compiled decoding and by
    Hugging Face's static-cache generation alike."""
    original = torch.compile

    def compile(model=None, **kwargs):
        kwargs = {k: v for k, v in kwargs.items() if k not in ("options", "mode", "backend")}
        if model is None:
            return functools.partial(original, backend="aot_eager", **kwargs)
        return original(model, backend="aot_eager", **kwargs)

    monkeypatch.setattr(torch, "compile", compile)


def test_groups_cover_the_gpu_suite():
    assert set(EAGER) == set(COMPILED_IMPLS) == set(GPU_GROUPS) and set(GPU_GROUPS) <= set(GROUPS)


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


def _counted(fn) -> int:
    """FLOPs torch's counter sees; the math attention kernel, whose products it counts."""
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


def test_lm_formula_is_what_torch_counts_for_a_forward_and_a_training_step():
    pytest.importorskip("transformers")
    import transformers

    from addnorm.bench.gpt2_training import GPT2_TINY, lm_loss
    from addnorm.bench.pairs import gpt2_pair

    ours, _ = gpt2_pair(transformers, GPT2_TINY, 16, torch.device("cpu"))
    ids = torch.randint(0, GPT2_TINY["vocab_size"], (2, 17))
    x, y = ids[:, :-1], ids[:, 1:]
    args = (matmul_weights(ours), GPT2_TINY["n_layer"], GPT2_TINY["n_embd"], 2, 16)
    assert _counted(lambda: lm_loss(ours)(x, y).backward()) == lm_flops(*args, training=True)
    with torch.no_grad():
        assert _counted(lambda: ours(x)) == lm_flops(*args, training=False)


def test_encoder_formula_is_what_torch_counts_without_padding():
    pytest.importorskip("transformers")
    from addnorm.bench.bert_inference import BERT_TINY
    from addnorm.bench.pairs import bert_pair

    padded, _, _ = bert_pair(BERT_TINY, torch.device("cpu"))
    ids = torch.randint(1, BERT_TINY.vocab_size, (3, 12))
    with torch.no_grad():
        counted = _counted(lambda: padded(ids))
    assert counted == encoder_flops(matmul_weights(padded), BERT_TINY.n_layers,
                                    BERT_TINY.d_model, [12, 12, 12])


@pytest.mark.parametrize("training", [False, True])
def test_dit_formula_is_what_torch_counts(training):
    import torch.nn.functional as F

    from addnorm.bench.dit_training import DIT_TINY, dit_batch
    from addnorm.dit.model import DiT

    model = DiT(DIT_TINY).train(training)
    x, t, y = dit_batch(DIT_TINY, 3, torch.device("cpu"))

    def run() -> None:
        out = model(x, t, y)
        if training:
            F.mse_loss(out, torch.zeros_like(out)).backward()

    with torch.set_grad_enabled(training):
        counted = _counted(run)
    # flops.py counts a training step as three forwards (6 N per token), as the field does;
    # the two products whose input needs no gradient (the patch convolution of x and the
    # timestep MLP's first layer on the fixed sinusoids) compute only their weight's
    # gradient, one forward's worth less each, which the counter sees.
    d, tokens = DIT_TINY.d_model, (DIT_TINY.input_size // DIT_TINY.patch_size) ** 2
    no_input_gradient = 2 * 3 * (tokens * DIT_TINY.in_channels * DIT_TINY.patch_size**2 * d
                                 + DIT_TINY.d_freq * d)
    assert counted == dit_flops(model, 3, training=training) - training * no_input_gradient


def test_matmul_weights_count_a_tied_table_once_and_split_per_image_weights():
    from addnorm.bench.dit_training import DIT_TINY
    from addnorm.dit.model import DiT

    lm = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 4, bias=False))
    lm[1].weight = nn.Parameter(lm[0].weight.detach().T.contiguous())
    assert matmul_weights(lm) == 64
    tied = nn.Sequential(nn.Linear(4, 4, bias=False), nn.Linear(4, 4, bias=False))
    tied[1].weight = tied[0].weight
    assert matmul_weights(tied) == 16
    dit = DiT(DIT_TINY)
    every = sum(m.weight.numel() for m in dit.modules() if isinstance(m, nn.Linear | nn.Conv2d))
    assert matmul_weights(dit) + matmul_weights(dit, per_image=True) == every
    d = DIT_TINY.d_model  # per image: the timestep MLP, 2 adaLN-Zero layers, the final one
    assert matmul_weights(dit, per_image=True) == 256 * d + d * d + 2 * d * 6 * d + d * 2 * d


# ---------------------------------------------------------------- memory, bounds, profile


def test_state_bytes_counts_parameters_gradients_and_optimizer_state():
    model = nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(model.parameters(), fused=True)
    assert state_bytes(model, optimizer) == 15 * 4  # 12 + 3 float32, no gradient yet
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    # parameters, gradients, exp_avg and exp_avg_sq: 4 x 15 floats; a float32 step per tensor
    assert state_bytes(model, optimizer) == 4 * 15 * 4 + 2 * 4
    assert peak_memory(lambda: None, torch.device("cpu"), 123) is None


def test_bf16_bound_is_twice_the_worst_reference_with_one_rounding_as_floor():
    assert bf16_bound([0.01, 0.03], 1.0) == pytest.approx(0.06)
    assert bf16_bound([1e-9], 10.0) == pytest.approx(10 * BF16_U)
    assert bf16_bound([], 0.1) == pytest.approx(BF16_U)  # the floor's scale is at least 1


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


# --------------------------------------------------------------------- the run and the CLI


def test_a_failing_group_is_recorded_and_the_run_goes_on(monkeypatch):
    import addnorm.bench.run as run

    def broken(settings, report, log):
        raise RuntimeError("out of memory, say")

    ran: list[str] = []
    monkeypatch.setitem(run.GROUPS, "bert", broken)
    monkeypatch.setitem(run.GROUPS, "dit-infer", lambda s, r, log: ran.append("dit-infer"))
    report = run_bench(TINY, ["bert", "dit-infer"], keep_going=True)
    assert ran == ["dit-infer"]
    assert len(report.errors) == 1 and report.errors[0].startswith("bert: RuntimeError: out of")
    assert "Traceback" in report.errors[0]
    assert "### errors" in format_table(report)
    with pytest.raises(RuntimeError, match="out of memory"):
        run_bench(TINY, ["bert"])


def test_groups_after_the_budget_are_skipped_with_a_note(monkeypatch):
    import addnorm.bench.run as run

    ran: list[str] = []
    monkeypatch.setitem(run.GROUPS, "bert", lambda s, r, log: ran.append("bert"))
    report = run_bench(TINY, ["bert"], budget=-1.0)
    assert ran == [] and any("bert: not run" in note for note in report.notes)


def test_the_cpu_suite_groups_refuse_a_gpu_device():
    settings = BenchSettings(size="test", rounds=1, min_seconds=0.0, device="meta")
    with pytest.raises(ValueError, match="run on the CPU only"):
        run_bench(settings, ["encoder"])


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
