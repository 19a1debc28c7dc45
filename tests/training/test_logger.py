"""Trackers: a trainer's records handed to a ``Logger``, TensorBoard's event files.

Provenance: the records a tracker gets are those ``metrics.jsonl`` holds (the same dicts);
TensorBoard's own reader (``event_accumulator``) reads the event files back, and a resumed
run's events are compared with the records of the run it continues.
"""

from __future__ import annotations

import errno
import importlib.util
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn
from toy_batches import SumBatches

from addnorm.training import logger as logger_module
from addnorm.training.checkpoint import load_checkpoint
from addnorm.training.config import TrainConfig
from addnorm.training.logger import LoggerCallback, TensorBoardLogger, TensorBoardMissingError
from addnorm.training.metrics import read_metrics
from addnorm.training.schedules import ScheduleConfig
from addnorm.training.trainer import Trainer

needs_tensorboard = pytest.mark.skipif(
    importlib.util.find_spec("tensorboard") is None, reason="tensorboard is not installed"
)


def make_trainer(run_dir, *, loggers=(), **settings) -> Trainer:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 1))
    config = TrainConfig(**{"lr": 1e-2, "warmup": 2, "log_every": 1, **settings})
    return Trainer(
        model, lambda m, b: (nn.functional.mse_loss(m(b["x"]), b["y"]), 8), SumBatches(),
        config, run_dir=run_dir, loggers=loggers,
        schedule=ScheduleConfig("cosine", config.lr, config.warmup, total_steps=12),
    )


class Recorder:
    """A tracker that keeps what it is given (what a W&B adapter would send)."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def start(self, step):
        self.calls.append(("start", step))

    def log_scalars(self, step, values):
        self.calls.append(("scalars", step, dict(values)))

    def log_image(self, step, tag, image):
        self.calls.append(("image", step, tag, image.shape))

    def flush(self):
        self.calls.append(("flush",))

    def close(self):
        self.calls.append(("close",))


def test_a_logger_gets_every_record_of_the_metrics_file_under_train(tmp_path):
    recorder = Recorder()
    trainer = make_trainer(tmp_path, max_steps=6, loggers=[recorder])
    trainer.fit()
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert recorder.calls[0] == ("start", 0) and recorder.calls[-1] == ("flush",)
    logged = [c for c in recorder.calls if c[0] == "scalars"]
    assert [(step, values) for _, step, values in logged] == [
        (r["step"], {f"train/{k}": v for k, v in r.items() if k != "step"}) for r in records
    ]
    assert {"train/loss", "train/lr", "train/grad_norm", "train/tokens_per_s"} <= set(
        logged[0][2]
    )


def test_a_logger_callback_refuses_an_object_without_the_logger_methods():
    with pytest.raises(TypeError, match="start, log_scalars, log_image, flush and close"):
        LoggerCallback(object())  # type: ignore[arg-type]


def test_tensorboard_asked_for_without_the_package_names_how_to_install_it(monkeypatch,
                                                                         tmp_path):
    monkeypatch.setattr(logger_module, "tensorboard_available", lambda: False)
    with pytest.raises(TensorBoardMissingError, match="pip install tensorboard"):
        TensorBoardLogger(tmp_path)


def _events(log_dir):
    from tensorboard.backend.event_processing import event_accumulator

    accumulator = event_accumulator.EventAccumulator(
        str(log_dir), size_guidance={event_accumulator.SCALARS: 0, event_accumulator.IMAGES: 0}
    )
    accumulator.Reload()
    return accumulator


@needs_tensorboard
def test_a_resumed_run_appends_to_its_tensorboard_run_without_repeating_steps(tmp_path):
    # The first run logs steps 1-10 and checkpoints at 6 and 10; resuming from step 6 must
    # hide its steps 7-10 (purge_step) and log the resumed run's 7-12 once.
    log_dir = tmp_path / "tensorboard"
    first = TensorBoardLogger(log_dir)
    make_trainer(tmp_path, max_steps=10, checkpoint_every=6, keep_checkpoints=2,
                 loggers=[first]).fit()
    first.close()
    second = TensorBoardLogger(log_dir)
    resumed = make_trainer(tmp_path, max_steps=12, checkpoint_every=6, loggers=[second])
    resumed.load(load_checkpoint(tmp_path / "checkpoints" / "step-00000006"))
    resumed.fit()
    second.log_image(12, "samples", np.zeros((4, 6, 3), dtype=np.uint8))
    second.close()
    events = _events(log_dir)
    losses = [(e.step, e.value) for e in events.Scalars("train/loss")]
    records = read_metrics(tmp_path / "metrics.jsonl")  # kept up to 6, then the resumed run's
    assert [step for step, _ in losses] == list(range(1, 13))
    # event files hold float32: the records' float64 losses rounded once
    assert [value for _, value in losses] == [
        float(torch.tensor(r["loss"], dtype=torch.float32)) for r in records
    ]
    (image,) = events.Images("samples")
    assert (image.step, image.width, image.height) == (12, 6, 4)


@needs_tensorboard
def test_a_folder_tensorboard_cannot_write_is_one_error_before_its_thread_starts():
    """Issue 41: ``--report-to tensorboard`` into an unwritable folder printed the event
    writer thread's traceback before the error; now the folder is refused on start."""
    from unprivileged import as_a_reader, read_only, shared_folder

    with shared_folder() as shared:
        log_dir = shared / "tensorboard"
        log_dir.mkdir()
        read_only(log_dir)

        def start() -> int:
            threads = threading.active_count()
            logger = TensorBoardLogger(log_dir)
            try:
                logger.start(0)
            finally:
                assert threading.active_count() == threads  # no writer thread was started
            return 0

        with pytest.raises(RuntimeError) as refused:
            as_a_reader(start)
    kind, message = refused.value.args
    assert kind == "OSError"
    assert message == (f"{log_dir}: TensorBoard's event files cannot be written there "
                       "(Permission denied); choose another --out, or --report-to jsonl")


@needs_tensorboard
def test_a_writer_thread_failure_is_raised_by_the_next_call_and_not_printed(tmp_path,
                                                                          monkeypatch):
    """A failure inside TensorBoard's writer thread (a full disk) is kept from the thread's
    traceback and raised once, naming the folder; other threads' errors still reach the hook
    that was there."""
    from tensorboard.summary.writer import record_writer

    printed = []
    monkeypatch.setattr(threading, "excepthook", lambda args: printed.append(args.exc_value))
    real, writes = record_writer.RecordWriter.write, []

    def disk_full(self, data):
        writes.append(1)
        if len(writes) > 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, data)

    monkeypatch.setattr(record_writer.RecordWriter, "write", disk_full)
    logger = TensorBoardLogger(tmp_path / "tb")
    logger.start(0)
    with pytest.raises(OSError, match=r"tb: TensorBoard's event files cannot be written there "
                                      r"\(No space left on device\)"):
        for step in range(1, 200):
            logger.log_scalars(step, {"loss": 1.0})
            logger.flush()
    assert printed == []  # the writer thread's traceback was not shown
    logger.close()
    assert threading.excepthook is not logger._writer_thread_hook
    other = threading.Thread(target=lambda: 1 / 0)
    other.start()
    other.join()
    assert len(printed) == 1 and isinstance(printed[0], ZeroDivisionError)


_FULL_DISK = """
import errno, sys
from tensorboard.summary.writer import record_writer
real, writes = record_writer.RecordWriter.write, []
def disk_full(self, data):
    writes.append(1)
    if len(writes) > 2:
        raise OSError(errno.ENOSPC, "No space left on device")
    return real(self, data)
record_writer.RecordWriter.write = disk_full
from addnorm.cli.parser import main
sys.exit(main(sys.argv[1:]))
"""


@needs_tensorboard
def test_a_run_whose_tensorboard_writer_fails_says_one_line(tmp_path):
    """The command's stderr: its announcement, its plan and the one error line, no thread
    traceback."""
    from cli_runs import TINY_LM

    src = str(Path(logger_module.__file__).resolve().parents[2])
    done = subprocess.run(
        [sys.executable, "-c", _FULL_DISK, "train", "lm", *TINY_LM, "--max-steps", "3",
         "--report-to", "tensorboard", "--out", str(tmp_path / "run")],
        env={**os.environ, "PYTHONPATH": src}, capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 1
    lines = done.stderr.splitlines()
    # the announcement, the budget's plan (indented lines, tasks.budget), the one error line
    assert lines[0].startswith("training lm into"), lines
    assert all(line.startswith("  ") for line in lines[1:-1]), lines
    assert lines[-1] == (f"addnorm train: error: {tmp_path / 'run' / 'tensorboard'}: TensorBoard's "
                        "event files cannot be written there (No space left on device); choose "
                        "another --out, or --report-to jsonl")
