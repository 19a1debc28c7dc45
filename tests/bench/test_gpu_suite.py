"""The GPU suite of ``addnorm bench`` as a whole: its groups, the ``--suite gpu`` command, a
run on CUDA where present, and the GPU session script. (Each group at its tiny size, with its
same-weights checks: tests/bench/test_<module>.py, through tests/bench_groups.py.) Speed
itself is never asserted here."""

from __future__ import annotations

import json

import pytest
import torch
from bench_groups import COMPILED_IMPLS, EAGER

from addnorm.bench import BenchSettings, run_bench
from addnorm.bench.run import GPU_GROUPS, GROUPS
from addnorm.cli.parser import main

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
