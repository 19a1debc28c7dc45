"""``addnorm train --report-to``: metrics.jsonl, TensorBoard event files, or neither.

Provenance: TensorBoard's own reader (``event_accumulator``) reads the event files back and
they are compared with the run's ``metrics.jsonl`` and ``metrics.json`` (the same numbers,
rounded to float32 as event files hold them).
"""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch

from addnorm.cli import train as train_cli
from addnorm.cli.parser import main
from addnorm.training.metrics import read_metrics

TINY = ["--preset", "tiny", "--d-model", "32", "--n-heads", "2", "--d-ff", "64",
        "--n-encoder-layers", "1", "--n-decoder-layers", "1", "--batch-size", "4",
        "--eval-size", "4", "--log-every", "2", "--max-steps", "6", "--quiet", "--threads", "1"]
needs_tensorboard = pytest.mark.skipif(
    importlib.util.find_spec("tensorboard") is None, reason="tensorboard is not installed"
)


def _float32(value: float) -> float:
    return float(torch.tensor(value, dtype=torch.float32))


@needs_tensorboard
def test_report_to_tensorboard_writes_the_metrics_records_and_a_picture_of_the_samples(
    tmp_path,
):
    from tensorboard.backend.event_processing import event_accumulator

    out = tmp_path / "run"
    assert main(["train", "translate", *TINY, "--out", str(out), "--report-to",
                 "tensorboard"]) == 0
    events = event_accumulator.EventAccumulator(
        str(out / "tensorboard"),
        size_guidance={event_accumulator.SCALARS: 0, event_accumulator.IMAGES: 0},
    )
    events.Reload()
    records = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in records] == [2, 4, 6]
    for name in ("loss", "lr", "grad_norm", "tokens_per_s"):
        logged = [(e.step, e.value) for e in events.Scalars(f"train/{name}")]
        assert logged == [(r["step"], _float32(r[name])) for r in records], name
    metrics = json.loads((out / "metrics.json").read_text())
    (final,) = events.Scalars("final/test_exact_match")
    assert (final.step, final.value) == (6, _float32(metrics["test_exact_match"]))
    (samples,) = events.Images("samples")
    assert samples.step == 6 and samples.encoded_image_string[:8] == b"\x89PNG\r\n\x1a\n"
    assert events.Images("figures/loss")  # loss.png, as drawn
    # --overwrite clears the event files addnorm wrote, and only those
    (out / "tensorboard" / "notes.txt").write_text("mine")
    assert main(["train", "translate", *TINY, "--out", str(out), "--overwrite"]) == 0
    assert [p.name for p in (out / "tensorboard").iterdir()] == ["notes.txt"]


def test_report_to_none_keeps_checkpoints_and_metrics_json_only(tmp_path):
    out = tmp_path / "run"
    assert main(["train", "translate", *TINY, "--out", str(out), "--report-to", "none"]) == 0
    assert sorted(p.name for p in out.iterdir()) == [
        "addnorm-run.json", "checkpoints", "metrics.json"
    ]


def test_report_to_tensorboard_without_the_package_is_a_usage_error(tmp_path, monkeypatch,
                                                                    capsys):
    monkeypatch.setattr(train_cli, "tensorboard_available", lambda: False)
    code = main(["train", "translate", *TINY, "--out", str(tmp_path / "run"), "--report-to",
                 "tensorboard"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert err[-1].endswith("--report-to tensorboard needs the tensorboard package: pip install "
                            "tensorboard (or addnorm[tensorboard])")
    assert not (tmp_path / "run").exists()
