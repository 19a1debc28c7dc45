"""The run's metrics: the JSONL log written and read back, and the sample figure.

Provenance: identities (what is written is what is read; a resumed log keeps exactly the
records up to its step) and the file's rules (a line that is not a record is skipped with a
warning, a torn last line quietly, a FIFO reads as no metrics without blocking).
"""

from __future__ import annotations

import json
import logging
import os

import numpy as np
import pytest

from addnorm.training.metrics import (
    MAX_LINE_BYTES,
    MetricsLog,
    draw_samples,
    loss_window_from_state,
    read_metrics,
)


def test_draw_samples_draws_digits_side_by_side_and_text_one_line_a_sample():
    digits = [{"class": c, "pixels": [[float(c)] * 8] * 8} for c in range(3)]
    picture = draw_samples(digits, title="three digits")
    assert picture.dtype == np.uint8 and picture.ndim == 3 and picture.shape[2] == 3
    assert picture.shape[1] > picture.shape[0]  # side by side
    text = draw_samples([{"input": "1 May 2001", "prediction": "2001-05-01",
                          "answer": "2001-05-01"}] * 4)
    more = draw_samples([{"input": "1 May 2001", "prediction": "2001-05-01",
                          "answer": "2001-05-01"}] * 8)
    assert more.shape[0] > text.shape[0]  # a line a sample


def record(step: int) -> dict:
    return {"step": step, "loss": 1.0 / step, "lr": 1e-3, "tokens_per_s": 10.0, "elapsed_s": step}


def test_records_read_back_in_order_and_a_resumed_log_keeps_those_up_to_its_step(tmp_path):
    path = tmp_path / "run" / "metrics.jsonl"
    log = MetricsLog(path)
    for step in (1, 2, 3):
        log.write(record(step))
    assert read_metrics(path) == [record(1), record(2), record(3)]
    resumed = MetricsLog(path, resume_from_step=2)
    resumed.write(record(3))
    assert read_metrics(path) == [record(1), record(2), record(3)]  # step 3 not twice
    assert MetricsLog(path).path == path and read_metrics(path) == []  # a new run: empty


def test_lines_that_are_not_records_are_skipped_with_one_warning_and_a_torn_end_quietly(
    tmp_path, caplog
):
    path = tmp_path / "metrics.jsonl"
    lines = [json.dumps(record(1)), "not json", json.dumps({"step": -1, "loss": 1, "lr": 1}),
             json.dumps({"step": 2, "loss": "low", "lr": 1}), "x" * (MAX_LINE_BYTES + 5),
             json.dumps(record(2))]
    path.write_text("\n".join(lines) + "\n" + '{"step": 3, "lo')  # killed mid-line
    with caplog.at_level(logging.WARNING):
        assert read_metrics(path) == [record(1), record(2)]
    (message,) = [r.getMessage() for r in caplog.records]
    assert "skipped 4 line(s)" in message and "line 2: not JSON" in message
    assert read_metrics(tmp_path / "absent.jsonl") == []
    os.mkfifo(tmp_path / "pipe")  # opened without blocking, read as no metrics
    assert read_metrics(tmp_path / "pipe") == []


def test_a_saved_loss_window_reads_back_and_a_missing_one_starts_empty():
    assert loss_window_from_state({"sum": 3.5, "steps": 2}) == (3.5, 2)
    assert loss_window_from_state({"sum": 1, "steps": 0}) == (1.0, 0)
    assert loss_window_from_state(None) == (0.0, 0)  # a checkpoint from before the window


@pytest.mark.parametrize("saved", [
    {"sum": 1.0}, {"sum": 1.0, "steps": 1, "more": 0}, {"sum": float("nan"), "steps": 1},
    {"sum": 1.0, "steps": -1}, {"sum": 1.0, "steps": True}, {"sum": "1", "steps": 1}, [1.0, 1],
])
def test_a_loss_window_that_no_trainer_saved_is_refused(saved):
    with pytest.raises(ValueError, match="loss_window"):
        loss_window_from_state(saved)
