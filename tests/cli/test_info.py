"""``addnorm info CHECKPOINT``: prints the run's configs, step and metrics as JSON.

Provenance: the run's own checkpoint and ``metrics.json``.
"""

from __future__ import annotations

import json

from addnorm.cli.parser import main


def test_info_prints_configs_step_and_metrics(translate_run, capsys):
    assert main(["info", str(translate_run)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["step"] == 3 and report["task"] == "translate"
    assert report["model_config"]["d_model"] == 32
    assert report["train_config"]["max_steps"] == 3
    assert report["metrics"] == json.loads((translate_run / "metrics.json").read_text())
