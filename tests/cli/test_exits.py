"""The exit codes of a stopped run (``addnorm.cli.exits``): Ctrl-C checkpoints and exits 130,
SIGTERM checkpoints and exits 143 (128 + the signal, as a shell reports it), and either run
resumes where it stopped.

Provenance: real signals and processes (a subprocess training sent SIGTERM; a
KeyboardInterrupt raised inside the trainer), and the uninterrupted run's losses, which the
resumed run equals bit for bit.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from cli_runs import TINY, TINY_TRANSLATE

from addnorm.cli.parser import main
from addnorm.training.checkpoint import load_checkpoint
from addnorm.training.metrics import read_metrics
from addnorm.training.run_dir import LOCK


def wait_for_first_metrics_line(path, process, timeout_s=120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not (path.exists() and path.read_text().count("\n") >= 1):
        if process.poll() is not None:
            raise AssertionError(f"training exited early: {process.communicate()}")
        if time.monotonic() > deadline:
            process.kill()
            raise AssertionError("no metrics line within the timeout")
        time.sleep(0.05)


def test_sigterm_checkpoints_exits_143_and_resume_continues(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["train", "translate", *TINY, "--max-steps", "100000", "--out", str(out)]
    training = subprocess.Popen(
        [sys.executable, "-m", "addnorm", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for_first_metrics_line(out / "metrics.jsonl", training)
        # Meanwhile a second writer is refused, naming the training's pid.
        assert main(["train", "translate", "--resume", "--out", str(out)]) == 2
        assert f"pid {training.pid} on host" in capsys.readouterr().err
        training.send_signal(signal.SIGTERM)
        _, err = training.communicate(timeout=120)
    finally:
        training.kill()
    assert training.returncode == 143, err
    step = load_checkpoint(out).step
    assert step >= 1 and f"terminated at step {step}" in err and "--resume" in err
    assert "Traceback" not in err
    assert not (out / "metrics.json").exists() and not (out / LOCK).exists()
    resume = ["train", "translate", "--resume", "--out", str(out), "--quiet", "--threads", "1"]
    assert main([*resume, "--max-steps", str(step + 2)]) == 0
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")] == list(range(1, step + 3))


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
        "--max-minutes",  # no budget, so no measured warm-up: the steps counted are the run's
        "none",
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
