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
whatever the run logged past the checkpoint it resumed from, so no step is shown twice. A
folder it cannot write is refused on ``start``, before TensorBoard's writer thread exists;
what fails later in that thread (a full disk) is kept from the thread's own traceback and
raised by the logger's next call, as one ``OSError`` naming the folder.

A W&B logger, for example, is ``start``: ``wandb.init(resume="allow")``, ``log_scalars``:
``wandb.log(values, step=step)``, ``log_image``: ``wandb.log({tag: wandb.Image(image)},
step=step)``, ``flush``: nothing, ``close``: ``wandb.finish()``.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
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
    ``start``); scalars with ``add_scalar``, images with ``add_image`` (HWC).

    Between ``start`` and ``close`` it is ``threading.excepthook``'s first reader: an
    exception of TensorBoard's writer thread is kept for the logger's next call (TensorBoard
    raises it there too), every other thread's goes to the hook that was set before."""

    def __init__(self, log_dir: str | os.PathLike) -> None:
        if not tensorboard_available():
            raise TensorBoardMissingError(
                "TensorBoard logging needs the tensorboard package: pip install tensorboard "
                "(or addnorm[tensorboard])"
            )
        self.log_dir = Path(log_dir)
        self._writer: Any = None
        self._thread_error: BaseException | None = None
        self._previous_hook: Any = None
        self._failed = False  # an error was raised: close stays quiet

    def start(self, step: int) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.close()
        self._check_writable()
        self._thread_error, self._failed = None, False
        self._previous_hook = threading.excepthook
        threading.excepthook = self._writer_thread_hook
        try:
            with self._writing():
                self._writer = SummaryWriter(
                    str(self.log_dir), purge_step=step + 1 if step > 0 else None
                )
        except BaseException:
            self.close()
            raise

    def log_scalars(self, step: int, values: Mapping[str, float]) -> None:
        writer = self._open()
        with self._writing():
            for tag, value in values.items():
                writer.add_scalar(tag, value, global_step=step)

    def log_image(self, step: int, tag: str, image: np.ndarray) -> None:
        writer = self._open()
        with self._writing():
            writer.add_image(tag, image, global_step=step, dataformats="HWC")

    def flush(self) -> None:
        if self._writer is not None:
            with self._writing():
                self._writer.flush()

    def close(self) -> None:
        writer, self._writer = self._writer, None
        try:
            if writer is not None:
                with self._writing():
                    writer.close()
        except OSError:
            if not self._failed:  # a failure already raised is not raised again on close
                raise
        finally:
            if threading.excepthook == self._writer_thread_hook:
                threading.excepthook = self._previous_hook

    def _open(self):
        if self._writer is None:
            raise RuntimeError("TensorBoardLogger: call start(step) before logging")
        return self._writer

    def _check_writable(self) -> None:
        """Make the folder and a file in it, or raise the one ``OSError`` naming it."""
        try:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryFile(dir=self.log_dir):
                pass
        except OSError as err:
            raise self._error(err) from None

    @contextlib.contextmanager
    def _writing(self):
        """Around a call into TensorBoard: an error of its writer thread (kept by
        ``_writer_thread_hook``) or of the call itself becomes one ``OSError`` naming the
        folder (the thread's once)."""
        self._raise_thread_error()
        try:
            yield
        except OSError as err:
            raise self._error(err) from None
        self._raise_thread_error()

    def _raise_thread_error(self) -> None:
        error, self._thread_error = self._thread_error, None
        if error is not None:
            raise self._error(error)

    def _error(self, err: BaseException) -> OSError:
        self._failed = True
        reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        return OSError(f"{self.log_dir}: TensorBoard's event files cannot be written there "
                       f"({reason}); choose another --out, or --report-to jsonl")

    def _writer_thread_hook(self, args: threading.ExceptHookArgs) -> None:
        """``threading.excepthook`` while the logger is open: an exception of TensorBoard's
        writer thread is kept for the logger's next call (instead of the thread's traceback
        on stderr); any other thread's goes to the hook there was."""
        if args.thread is not None and type(args.thread).__module__.startswith("tensorboard"):
            if self._thread_error is None:
                self._thread_error = args.exc_value
            return
        self._previous_hook(args)


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
