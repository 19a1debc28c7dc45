"""``addnorm info CHECKPOINT``: prints the run's configs, step and metrics as JSON.

Provenance: the run's own checkpoint and ``metrics.json``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from addnorm.cli.parser import main

SRC = str(Path(__file__).resolve().parents[2] / "src")


def test_info_prints_configs_step_and_metrics(translate_run, capsys):
    assert main(["info", str(translate_run)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["step"] == 3 and report["task"] == "translate"
    assert report["model_config"]["d_model"] == 32
    assert report["train_config"]["max_steps"] == 3
    assert report["metrics"] == json.loads((translate_run / "metrics.json").read_text())


def test_info_with_stdout_closed_exits_1_with_one_line(translate_run):
    """Issue 41: ``addnorm info RUN >&-`` exited 0 with its report lost; it refuses as
    ``translate`` does (tests/cli/test_broken_runs.py), before reading the run."""
    result = subprocess.run(
        [sys.executable, "-m", "addnorm", "info", str(translate_run)],
        env={**os.environ, "PYTHONPATH": SRC}, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: os.close(1), timeout=120,
    )
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        "addnorm info: error: stdout is closed, so the report would be lost; run the command "
        "with its output open (e.g. > FILE)"
    ]
