"""Experiment trackers: where a run's numbers and pictures go besides ``metrics.jsonl``.

A :class:`Logger` has five methods, enough to put a run into TensorBoard, Weights & Biases or
anything else: ``start(step)`` (training goes on after ``step``: 0 for a fresh run; a resumed
run drops what it logged past ``step``), ``log_scalars(step, values)``, ``log_image(step, tag,
image)`` (an (H, W, 3) uint8 array), ``flush()`` and ``close()``. :class:`LoggerCallback`
hands a trainer's records to one (``Trainer(loggers=[...])``: rank 0 only): every scalar of
each record (loss, lr, grad_norm, tokens_per_s, elapsed_s and a probe's ``probe_*`` scores)
under ``train/<name>`` at the record's step.

:class:`TensorBoardLogger` writes TensorBoard event files with ``torch.utils.tensorboard``
(which needs the ``tensorboard`` package: ``pip install addnorm[tensorboard]``). A resumed
run appends to the same folder: ``SummaryWriter(purge_step=step + 1)`` has TensorBoard hide
whatever the run logged past the checkpoint it resumed from, so no step is shown twice.

A W&B logger, for example, is ``start``: ``wandb.init(resume="allow")``, ``log_scalars``:
``wandb.log(values, step=step)``, ``log_image``: ``wandb.log({tag: wandb.Image(image)},
step=step)``, ``flush``: nothing, ``close``: ``wandb.finish()``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

from addnorm.training.callbacks import Callback

if TYPE_CHECKING:
    from addnorm.training.trainer_state import TrainerState

__all__ = [
    "REPORT_TO",
    "Logger",
    "LoggerCallback",
    "TensorBoardLogger",
    "TensorBoardMissingError",
    "read_png",
    "tensorboard_available",
]

# ``addnorm train --report-to``: what a run records beyond its checkpoints and metrics.json,
# each choice adding to the one before: nothing, metrics.jsonl with the figures drawn from it,
# and TensorBoard event files besides.
REPORT_TO = ("none", "jsonl", "tensorboard")


@runtime_checkable
class Logger(Protocol):
    """Where a run's scalars and images go (see the module docstring)."""

    def start(self, step: int) -> None:
        """Training goes on after ``step`` (0: a fresh run); what was logged past it is
        dropped."""
        ...

    def log_scalars(self, step: int, values: Mapping[str, float]) -> None:
        """Scalars of ``step``, by tag."""
        ...

    def log_image(self, step: int, tag: str, image: np.ndarray) -> None:
        """An (H, W, 3) uint8 image of ``step``."""
        ...

    def flush(self) -> None:
        """Write out what is buffered."""
        ...

    def close(self) -> None:
        """Flush and let go of the files."""
        ...


class TensorBoardMissingError(ImportError):
    """``tensorboard`` is asked for and not installed; the message says how to install it."""


def tensorboard_available() -> bool:
    """Whether ``torch.utils.tensorboard`` can write (the ``tensorboard`` package is
    installed)."""
    import importlib.util

    return importlib.util.find_spec("tensorboard") is not None


class TensorBoardLogger:
    """A :class:`Logger` writing TensorBoard event files into ``log_dir`` (created on
    ``start``); scalars with ``add_scalar``, images with ``add_image`` (HWC)."""

    def __init__(self, log_dir: str | os.PathLike) -> None:
        if not tensorboard_available():
            raise TensorBoardMissingError(
                "TensorBoard logging needs the tensorboard package: pip install tensorboard "
                "(or addnorm[tensorboard])"
            )
        self.log_dir = Path(log_dir)
        self._writer: Any = None

    def start(self, step: int) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.close()
        self._writer = SummaryWriter(
            str(self.log_dir), purge_step=step + 1 if step > 0 else None
        )

    def log_scalars(self, step: int, values: Mapping[str, float]) -> None:
        for tag, value in values.items():
            self._open().add_scalar(tag, value, global_step=step)

    def log_image(self, step: int, tag: str, image: np.ndarray) -> None:
        self._open().add_image(tag, image, global_step=step, dataformats="HWC")

    def flush(self) -> None:
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def _open(self):
        if self._writer is None:
            raise RuntimeError("TensorBoardLogger: call start(step) before logging")
        return self._writer


class LoggerCallback(Callback):
    """Hands the trainer's records to ``logger``: ``start`` at the step ``fit`` goes on from,
    each record's scalars (but its step) under ``train/<name>``, ``flush`` when ``fit`` ends
    (the logger's owner closes it)."""

    def __init__(self, logger: Logger) -> None:
        if not isinstance(logger, Logger):
            raise TypeError(
                "logger must have start, log_scalars, log_image, flush and close methods, got "
                f"{type(logger).__name__}"
            )
        self.logger = logger

    def on_fit_start(self, state: TrainerState) -> None:
        self.logger.start(state.step)

    def on_log(self, state: TrainerState, record: dict[str, float]) -> None:
        scalars = {f"train/{name}": value for name, value in record.items() if name != "step"}
        self.logger.log_scalars(int(record["step"]), scalars)

    def on_fit_end(self, state: TrainerState) -> None:
        self.logger.flush()


def read_png(path: str | os.PathLike) -> np.ndarray:
    """A PNG (a figure the run drew) as an (H, W, 3) uint8 array, for ``log_image``."""
    from PIL import Image

    with Image.open(path) as image:
        return np.asarray(image.convert("RGB"))
