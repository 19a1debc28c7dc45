"""The ``addnorm`` command end to end, in-process through ``addnorm.cli.parser.main`` with tiny
settings, plus one subprocess smoke test of ``python -m addnorm``: what several subcommands
share (bad arguments, config files, devices, checkpoints, Ctrl-C). One subcommand's own
behaviour is in tests/cli/test_<subcommand>.py.

Provenance: the CLI's outputs are compared with the library calls they wrap (the task's
``predict`` / ``sample`` on the same checkpoint), with the run's own files (metrics,
checkpoint step), and a resumed run with the uninterrupted one (bit-exact losses).
"""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from addnorm.cli.parser import main


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


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        ([], "required"),
        (["train"], "required"),
        (["train", "translate", "--max-steps", "abc"], "--max-steps"),
        (["train", "translate", "--bogus"], "--bogus"),
        (["info"], "checkpoint"),
        (["translate", "x", "--weights", "best"], "--weights"),
        (["train", "translate", "--max-steps", "-1"], "--max-steps must be >= 1, got -1"),
        (["train", "translate", "--max-minutes", "0"], "--max-minutes"),
        (["train", "translate", "--lr", "fast"], "--lr"),
        (["train", "translate", "--norm-position", "middle"], "--norm-position"),
        (["train", "translate", "--d-model", "30", "--n-heads", "4"], "--d-model (30)"),
        (["train", "translate", "--schedule", "linear"], "--schedule"),
        (["train", "lm", "--position-encoding", "learned", "--max-len", "8", "--seq-len", "16"],
         "--seq-len (16) must be <= --max-len (8)"),
        (["train", "nope"], "nope"),
        (["train", "translate", "--resume", "--d-model", "64"], "--resume"),
        (["generate"], "--prompt"),
        (["translate", "x", "--device", "warp-drive"], "--device"),
        (["translate", "x", "--device", "meta"], "--device"),
        (["translate", "x", "--device", "cpu:3"], "--device"),
        (["translate", "x", "--device", "cuda:99"], "--device cuda:99"),
        (["generate", "--prompt", "a", "--threads", "100000"], "--threads"),
        (["train", "translate", "--threads", "-2"], "--threads"),
        (["train", "translate", "--threads", "100000"], "--threads"),
        (
            ["train", "translate", "--position-encoding", "learned", "--max-len", "5"],
            "--max-len (5)",
        ),
        (["train", "lm", "--seq-len", "100000000"], "validation split"),
        (["train", "translate", "--resume", "--overwrite"], "--overwrite"),
    ],
)
def test_bad_arguments_exit_2_with_one_line_naming_the_problem(argv, named, capsys, tmp_path):
    has_out = argv[:1] == ["train"] and len(argv) > 1
    assert main([*argv, "--out", str(tmp_path)] if has_out else argv) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1, err
    assert named in err[0] and err[0].startswith("addnorm")


def test_an_os_error_exits_1_with_one_line(tmp_path, capsys, monkeypatch):
    import addnorm.cli.explain

    def denied(out, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(out))

    monkeypatch.setattr(addnorm.cli.explain, "run_explain", denied)
    assert main(["explain", "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "Permission denied" in err[0]


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
    import addnorm.cli.explain

    seen = []
    monkeypatch.setattr(
        addnorm.cli.explain, "run_explain", lambda out, *a, **k: seen.append(out) or 0
    )
    assert main(["explain", "--out", str(tmp_path)]) == 0
    assert seen == [tmp_path]


def test_the_smoothed_loss_floor_is_what_cross_entropy_reaches_at_best():
    # Logits equal to the log of the smoothed target reach the floor; F.cross_entropy agrees.
    import math

    import torch
    import torch.nn.functional as F

    from addnorm.cli.demo import smoothed_loss_floor

    smoothing, n = 0.1, 15
    target = torch.full((n,), smoothing / n)
    target[3] += 1.0 - smoothing
    loss = F.cross_entropy(target.log()[None], torch.tensor([3]), label_smoothing=smoothing)
    # float32 cross-entropy over 15 classes against a float64 closed form: 15 u of the terms'
    # absolute sum (sum_bound, ~2x the loss) plus the target's rounding: ~2e-6 at worst.
    assert smoothed_loss_floor(smoothing, n) == pytest.approx(loss.item(), rel=1e-5)
    assert smoothed_loss_floor(0.0, n) == 0.0
    assert math.isfinite(smoothed_loss_floor(0.5, 2))
