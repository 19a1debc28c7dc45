"""``addnorm train ... --watch [EVERY]`` and ``addnorm info`` on a watched run, end to end with
tiny settings.

Provenance: the run's own files (``watch.jsonl``'s steps against the flag's interval, the
figure a PNG) and the library's summary of the same records (``inspection.summary``), which
``info`` prints.
"""

from __future__ import annotations

import json

import pytest

from addnorm.cli.parser import main
from addnorm.inspection.summary import summarize
from addnorm.training.metrics import read_metrics
from addnorm.training.watch import read_watch

TINY_LM = ["--preset", "lm-tiny", "--d-model", "32", "--n-heads", "2", "--d-ff", "64",
           "--n-layers", "2", "--batch-size", "2", "--seq-len", "16", "--eval-size", "2",
           "--log-every", "1", "--quiet", "--max-steps", "4"]


def test_watch_writes_its_records_and_figure_and_info_summarises_them(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "lm", *TINY_LM, "--watch", "3", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"inside the model: {out / 'watch.png'}" in printed
    records = read_watch(out / "watch.jsonl")
    assert [r["step"] for r in records] == [1, 3, 4]
    assert (out / "watch.png").read_bytes()[:4] == b"\x89PNG"
    assert main(["info", str(out)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["watch"]["steps"] == [1, 3, 4]
    assert report["watch"]["summary"] == summarize(records)
    assert report["watch"]["figure"] == str(out / "watch.png")
    assert report["watch"]["grad_norm"] == "before clipping"


def test_a_clipped_run_records_its_gradient_norms_before_clipping(tmp_path, capsys):
    """The lm task clips to --grad-clip; 1e-4 is far below the tiny model's gradient norm, so
    every step is clipped. Provenance: metrics.jsonl's grad_norm, the norm before clipping
    that torch's clip_grad_norm_ returns; tolerance: float32 sums in another grouping and the
    watch's 7 written digits (a few 1e-7 relative)."""
    out = tmp_path / "run"
    assert main(["train", "lm", *TINY_LM, "--grad-clip", "1e-4", "--watch", "2",
                 "--out", str(out)]) == 0
    records = read_watch(out / "watch.jsonl")
    metrics = {r["step"]: r["grad_norm"] for r in read_metrics(out / "metrics.jsonl")}
    for record in records:
        total = record["grad_norm"]["total"]
        assert total == pytest.approx(metrics[record["step"]], rel=1e-5)
        assert total > 100 * 1e-4 and record["clip_factor"] < 0.01
        assert total * record["clip_factor"] == pytest.approx(1e-4, rel=1e-5)  # what it got
    capsys.readouterr()
    assert main(["info", str(out)]) == 0
    assert json.loads(capsys.readouterr().out)["watch"]["grad_norm"] == "before clipping"


def test_watch_alone_means_every_50_steps(tmp_path):
    assert main(["train", "lm", *TINY_LM, "--watch", "--out", str(tmp_path)]) == 0
    assert [r["step"] for r in read_watch(tmp_path / "watch.jsonl")] == [1, 4]  # first, last


@pytest.mark.parametrize("value", ["0", "-3", "often"])
def test_a_bad_interval_exits_2_with_one_line(value, capsys, tmp_path):
    assert main(["train", "lm", "--watch", value, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "--watch" in err[0] and "integer >= 1" in err[0]


def test_help_describes_watch(capsys):
    assert main(["train", "lm", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "--watch [EVERY]" in text and "watch.jsonl and watch.png" in text
