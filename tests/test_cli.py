"""The ``addnorm`` command end to end, in-process through ``addnorm.cli.main`` with tiny
settings, plus one subprocess smoke test of ``python -m addnorm``.

Provenance: the CLI's outputs are compared with the library calls they wrap (the task's
``predict`` / ``sample`` on the same checkpoint), with the run's own files (metrics,
checkpoint step), and a resumed run with the uninterrupted one (bit-exact losses).
"""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys

import pytest

from addnorm.cli import main
from addnorm.training.metrics import read_metrics
from addnorm.training.run import load_trained

TINY_TRANSLATE = [
    "--preset",
    "tiny",
    "--d-model",
    "32",
    "--n-heads",
    "2",
    "--d-ff",
    "64",
    "--n-encoder-layers",
    "1",
    "--n-decoder-layers",
    "1",
    "--batch-size",
    "4",
    "--eval-size",
    "4",
    "--log-every",
    "1",
    "--quiet",
]
TINY_LM = [
    "--preset",
    "lm-tiny",
    "--d-model",
    "32",
    "--n-heads",
    "2",
    "--d-ff",
    "64",
    "--n-layers",
    "1",
    "--batch-size",
    "2",
    "--seq-len",
    "16",
    "--eval-size",
    "2",
    "--log-every",
    "1",
    "--quiet",
]


@pytest.fixture(scope="module")
def translate_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "translate"
    assert main(["train", "translate", *TINY_TRANSLATE, "--max-steps", "3", "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "lm"
    assert main(["train", "lm", *TINY_LM, "--max-steps", "2", "--out", str(out)]) == 0
    return out


def test_python_dash_m_addnorm_help_lists_the_subcommands():
    done = subprocess.run(
        [sys.executable, "-m", "addnorm", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0
    for command in ("train", "translate", "generate", "info", "demo", "explain"):
        assert command in done.stdout


def test_train_writes_checkpoint_metrics_and_loss_curve(translate_run):
    metrics = json.loads((translate_run / "metrics.json").read_text())
    assert metrics["step"] == 3 and metrics["task"] == "translate"
    assert 0.0 <= metrics["test_exact_match"] <= 1.0 and metrics["n_test"] == 4
    assert [r["step"] for r in read_metrics(translate_run / "metrics.jsonl")] == [1, 2, 3]
    assert (translate_run / "loss.png").read_bytes()[:4] == b"\x89PNG"
    assert (translate_run / "checkpoints" / "step-00000003" / "manifest.json").is_file()


def test_translate_prints_the_models_greedy_answer(translate_run, capsys):
    texts = ["21 Nov 2026", "2026년 11월 21일"]
    assert main(["translate", *texts, "--checkpoint", str(translate_run), "--device", "cpu"]) == 0
    task, model, _ = load_trained(translate_run)
    assert capsys.readouterr().out.splitlines() == task.predict(model, texts)


def test_translate_reads_one_date_per_stdin_line(translate_run, capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO("2026-11-21\nNov 21, 2026\n\n"))
    assert main(["translate", "--checkpoint", str(translate_run)]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 3


def test_info_prints_configs_step_and_metrics(translate_run, capsys):
    assert main(["info", str(translate_run)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["step"] == 3 and report["task"] == "translate"
    assert report["model_config"]["d_model"] == 32
    assert report["train_config"]["max_steps"] == 3
    assert report["metrics"] == json.loads((translate_run / "metrics.json").read_text())


def test_generate_continues_the_prompt_like_the_library(lm_run, capsys):
    args = [
        "generate",
        "--prompt",
        "def ",
        "--max-new-tokens",
        "6",
        "--temperature",
        "0",
        "--checkpoint",
        str(lm_run),
    ]
    assert main(args) == 0
    task, model, _ = load_trained(lm_run)
    expected = task.sample(model, "def ", max_new_tokens=6, temperature=0)
    assert capsys.readouterr().out == expected + "\n"
    assert expected.startswith("def ")


def test_ctrl_c_checkpoints_exits_130_and_resume_continues_exactly(tmp_path, capsys, monkeypatch):
    from addnorm.training.trainer import Trainer

    base = [
        "train",
        "translate",
        *TINY_TRANSLATE,
        "--dropout",
        "0.1",
        "--warmup",
        "2",
        "--max-steps",
        "4",
    ]
    assert main([*base, "--out", str(tmp_path / "whole")]) == 0
    real_step = Trainer._train_step

    def step_then_interrupt(self):
        if self.step == 2:
            raise KeyboardInterrupt
        return real_step(self)

    split = tmp_path / "split"
    monkeypatch.setattr(Trainer, "_train_step", step_then_interrupt)
    assert main([*base, "--out", str(split)]) == 130
    err = capsys.readouterr().err
    assert "step-00000002" in err and "--resume" in err
    assert not (split / "metrics.json").exists()
    monkeypatch.setattr(Trainer, "_train_step", real_step)
    assert main(["train", "translate", "--resume", "--out", str(split), "--quiet"]) == 0
    # Same weights, optimizer, schedule, dropout RNG and data order: the same losses.
    assert read_metrics(split / "metrics.jsonl")[-1]["step"] == 4
    split_losses = [r["loss"] for r in read_metrics(split / "metrics.jsonl")]
    assert split_losses == [r["loss"] for r in read_metrics(tmp_path / "whole" / "metrics.jsonl")]


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["train", "translate", "--max-steps", "-1"], "max_steps"),
        (["train", "translate", "--max-minutes", "0"], "max_minutes"),
        (["train", "translate", "--lr", "fast"], "--lr"),
        (["train", "translate", "--norm-position", "middle"], "--norm-position"),
        (["train", "translate", "--d-model", "30", "--n-heads", "4"], "d_model (30)"),
        (["train", "translate", "--schedule", "linear"], "--schedule"),
        (["train", "lm", "--positions", "learned", "--max-len", "8", "--seq-len", "16"], "seq_len"),
        (["train", "nope"], "nope"),
        (["train", "translate", "--resume", "--d-model", "64"], "--resume"),
        (["generate"], "--prompt"),
        (["translate", "x", "--device", "warp-drive"], "--device"),
        (["train", "translate", "--threads", "-2"], "--threads"),
    ],
)
def test_bad_arguments_exit_2_with_one_line_naming_the_problem(argv, named, capsys, tmp_path):
    assert main([*argv, "--out", str(tmp_path)] if argv[0] == "train" else argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert named in err[-1]
    assert not any("Traceback" in line for line in err)


def test_bad_config_file_exits_2(tmp_path, capsys):
    config = tmp_path / "cfg.json"
    config.write_text(json.dumps({"model": {"d_model": 64, "heads": 3}}))
    assert main(["train", "translate", "--config", str(config), "--out", str(tmp_path)]) == 2
    assert "heads" in capsys.readouterr().err


def test_a_model_checkpoint_of_the_other_task_is_refused(lm_run, capsys):
    assert main(["translate", "x", "--checkpoint", str(lm_run)]) == 2
    assert "'lm'" in capsys.readouterr().err


def damaged_copy(run, tmp_path, name, content: bytes | None):
    copy = tmp_path / "damaged"
    shutil.copytree(run, copy)
    target = next((copy / "checkpoints").iterdir()) / name
    if content is None:
        target.write_bytes(target.read_bytes()[: target.stat().st_size // 2])
    else:
        target.write_bytes(content)
    return copy


@pytest.mark.parametrize(
    ("name", "content", "command"),
    [
        ("model.safetensors", None, "translate"),
        ("state.json", b"{oops", "translate"),
        ("manifest.json", b"[not json", "info"),
    ],
)
def test_damaged_checkpoints_exit_1_naming_the_file(
    translate_run, tmp_path, capsys, name, content, command
):
    copy = damaged_copy(translate_run, tmp_path, name, content)
    argv = (
        ["info", str(copy)] if command == "info" else ["translate", "x", "--checkpoint", str(copy)]
    )
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert name in err and "Traceback" not in err


def test_missing_checkpoint_exits_1_naming_the_path(tmp_path, capsys):
    assert main(["info", str(tmp_path / "absent")]) == 1
    assert "absent" in capsys.readouterr().err


def test_explain_calls_the_leads_run_explain_with_out(tmp_path, monkeypatch):
    import addnorm.explain

    seen = []
    monkeypatch.setattr(addnorm.explain, "run_explain", lambda out: seen.append(out) or 0)
    assert main(["explain", "--out", str(tmp_path)]) == 0
    assert seen == [tmp_path]


def test_demo_trains_then_prints_the_table_and_accuracy(tmp_path, capsys):
    from addnorm.demo import DEMO_FORMATS, run_demo

    assert run_demo(tmp_path / "demo", max_steps=2, eval_size=4, progress=False) == 0
    out = capsys.readouterr().out
    assert "held-out exact match" in out and "년" in out  # Korean row included
    table_rows = [line for line in out.splitlines() if line.rstrip().endswith(("ok", "WRONG"))]
    assert len(table_rows) == len(DEMO_FORMATS)
    assert (tmp_path / "demo" / "loss.png").exists()


def test_the_smoothed_loss_floor_is_what_cross_entropy_reaches_at_best():
    # Logits equal to the log of the smoothed target reach the floor; F.cross_entropy agrees.
    import math

    import torch
    import torch.nn.functional as F

    from addnorm.demo import smoothed_loss_floor

    smoothing, n = 0.1, 15
    target = torch.full((n,), smoothing / n)
    target[3] += 1.0 - smoothing
    loss = F.cross_entropy(target.log()[None], torch.tensor([3]), label_smoothing=smoothing)
    assert smoothed_loss_floor(smoothing, n) == pytest.approx(loss.item(), rel=1e-5)
    assert smoothed_loss_floor(0.0, n) == 0.0
    assert math.isfinite(smoothed_loss_floor(0.5, 2))
