"""The ``addnorm`` command's parsing and dispatch (``addnorm.cli.parser``): ``python -m addnorm
--help`` lists the subcommands (one subprocess smoke test), bad arguments exit 2 with one line
naming the problem, and an OS error exits 1 with one line, never a traceback.

Provenance: the exit codes the module documents; each subcommand's own behaviour is in
tests/cli/test_<subcommand>.py.
"""

from __future__ import annotations

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
