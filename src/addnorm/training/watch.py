"""The watch of a training run: ``Trainer(watch=EVERY)`` and ``addnorm train ... --watch``.

:class:`WatchCallback` measures the model with :class:`addnorm.inspection.Watch` on the
watched steps (the first, every ``every``-th and the last) and writes each step's record as
one JSON line of ``watch.jsonl`` in the run (rank 0), with the step, its loss and its
learning rate; a resumed run keeps the lines up to the step it resumed from, as
``metrics.jsonl`` does. ``sinks`` receive each record as well (a scalar logger such as
TensorBoard's: :func:`scalars` flattens a record into its ``name -> number`` pairs, and
:func:`logger_sink` hands them to a :class:`~addnorm.training.logger.Logger`; the trainer does
this for its ``loggers``).

Gradient norms are those before clipping, the numbers other tools report and
``metrics.jsonl``'s ``grad_norm``: a record's ``grad_norm`` (each layer's, sublayer's and the
``"total"``) is the norm of the gradients as the backward pass left them, and ``clip_factor``
what ``grad_clip`` then multiplied every gradient by (1: not clipped; torch's factor,
:func:`~addnorm.training.optimizer.clip_factor`), so ``grad_norm * clip_factor`` is what the
optimizer got. The watch reads the gradients after clipping and divides by the factor (equal
within a float32 rounding; a factor of 0 or one that is not finite leaves the norms null).
Records written before ``clip_factor`` existed hold the norms as clipped
(:func:`grad_norm_basis` tells them apart); ratios between layers are the same either way.

Cost: the hooks are registered at the start of a watched step and removed once its
gradients are complete, so an unwatched step runs exactly as without the watch; a watched
step measures on its own batch (every micro-batch, every process), reads its numbers back
once and keeps a copy of the weights until its update is done (for ``update_ratio``).

With ``compile``, hooks would never run inside the compiled graph: a watched step runs the
model's uncompiled form instead (the same parameters; it sets the trainer's
:attr:`~addnorm.training.wrapping.WrappedModel.eager`), unwatched steps the compiled one. A
first step that is watched then runs eagerly, so the compiling falls into the next step and
``TrainResult.compile_s`` times an eager step.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import os
import stat
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from addnorm.inspection import Watch
from addnorm.training import distributed
from addnorm.training.callbacks import Callback
from addnorm.utils.checks import check_int
from addnorm.utils.files import parse_json, write_file_atomic

if TYPE_CHECKING:
    from addnorm.training.logger import Logger
    from addnorm.training.trainer_state import TrainerState

__all__ = [
    "DEFAULT_EVERY",
    "WATCH_FILE",
    "WatchCallback",
    "WatchLog",
    "grad_norm_basis",
    "logger_sink",
    "read_watch",
    "scalars",
]

WATCH_FILE = "watch.jsonl"
WATCH_FIGURE = "watch.png"
DEFAULT_EVERY = 50
# A record grows with the model: about 1.5 kB per layer. A longer line is no record.
MAX_LINE_BYTES = 2**24
SIGNIFICANT = 7  # digits written per number (float32's precision)
_log = logging.getLogger(__name__)

Sink = Callable[[dict], None]


class WatchCallback(Callback):
    """Watch the trainer's model every ``every`` steps (see the module docstring).

    Args:
        every: the interval between watched steps (step 1 and the last are watched too).
        path: the JSONL file (rank 0 writes it), or None to write nothing.
        sinks: called with each record, on rank 0, after it is written.
        attention: recompute attention weights for their entropy.
    """

    def __init__(
        self,
        every: int = DEFAULT_EVERY,
        path: str | os.PathLike | None = None,
        *,
        sinks: Sequence[Sink] = (),
        attention: bool = True,
    ) -> None:
        self.every = check_int("every", every, min_value=1)
        self.path = None if path is None else Path(path)
        self.sinks = tuple(sinks)
        self.attention = attention
        self._watch: Watch | None = None
        self._log: WatchLog | None = None
        self._active = False
        self._lr = 0.0  # the watched step's learning rate
        self._clip = torch.ones(())  # what clipping multiplied its gradients by

    def due(self, step: int, max_steps: int) -> bool:
        """Whether step ``step`` (counted from 1) is watched."""
        return step == 1 or step % self.every == 0 or step == max_steps

    def on_fit_start(self, state: TrainerState) -> None:
        self._watch = Watch(state.model, attention=self.attention)
        if self.path is not None and distributed.is_main():
            self._log = WatchLog(self.path, resume_from_step=state.resumed_from)

    def on_step_start(self, state: TrainerState) -> None:
        self._active = self.due(state.step + 1, state.config.max_steps)
        if not self._active:
            return
        assert self._watch is not None, "on_step_start before on_fit_start"
        self._watch.reset()
        state.wrapped.eager = True  # a compiled forward would run no hooks: this step runs eagerly
        self._watch.attach()

    def on_before_update(self, state: TrainerState) -> None:
        if self._active:
            assert self._watch is not None
            self._restore(state)
            self._lr = state.optimizer.param_groups[0]["lr"]  # the scheduler steps after
            self._clip = state.clip_factor  # (a tensor: read with the rest, on_step_end)
            self._watch.before_update()

    def on_step_end(self, state: TrainerState, loss: float, tokens: int) -> None:
        if not self._active:
            return
        assert self._watch is not None
        self._active = False
        measured = self._watch.step()  # every rank: the sums are reduced over them
        if not distributed.is_main():
            return
        factor = distributed.as_float(self._clip)
        known = math.isfinite(factor) and factor > 0
        record = {"step": state.step, "loss": loss, "lr": self._lr,
                  "clip_factor": factor if math.isfinite(factor) else None, **measured}
        record["grad_norm"] = {  # before clipping: the clipped norms over the factor
            name: norm / factor if known and norm is not None else None
            for name, norm in measured["grad_norm"].items()
        }
        if self._log is not None:
            self._log.write(record)
        for sink in self.sinks:
            sink(record)

    def on_fit_end(self, state: TrainerState) -> None:
        self._restore(state)
        self._active = False

    def _restore(self, state: TrainerState) -> None:
        """Hooks off and the compiled forward back."""
        if self._watch is not None:
            self._watch.detach()
        state.wrapped.eager = False


class WatchLog:
    """Appends watch records to a JSONL file, a line each, flushed as written.

    Args:
        path: the file.
        resume_from_step: None starts a new file; an int keeps the records with
            ``step <= resume_from_step`` (those a resumed run does not repeat).
    """

    def __init__(self, path: str | os.PathLike, *, resume_from_step: int | None = None) -> None:
        self.path = Path(path)
        keep_records(self.path, -1 if resume_from_step is None else resume_from_step)

    def write(self, record: dict) -> None:
        """Append one record as a JSON line (numbers to ``SIGNIFICANT`` digits)."""
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(_rounded(record)) + "\n")


def keep_records(path: str | os.PathLike, up_to_step: int) -> None:
    """Rewrite the watch file ``path`` with its records of ``step <= up_to_step`` (none for
    -1; a missing file becomes an empty one)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    kept = [r for r in read_watch(path) if r["step"] <= up_to_step] if up_to_step >= 0 else []
    text = "".join(json.dumps(record) + "\n" for record in kept)
    write_file_atomic(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def read_watch(path: str | os.PathLike) -> list[dict]:
    """The records of a watch file, in order. A line that is not one (torn by a kill, edited,
    not UTF-8, over ``MAX_LINE_BYTES``) is skipped, with a warning naming the first; a
    missing file, or one that is not a regular file, has none."""
    path = Path(path)
    try:
        f = open(path, "rb", opener=lambda p, flags: os.open(p, flags | os.O_NONBLOCK))
    except (FileNotFoundError, IsADirectoryError):
        return []
    records, skipped = [], []
    with f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            _log.warning("addnorm: %s is not a regular file; read as no watch records", path)
            return []
        for number in itertools.count(1):
            line = f.readline(MAX_LINE_BYTES + 1)
            if not line:
                break
            record, why = _parse_record(line)
            if record is not None:
                records.append(record)
            elif line.endswith(b"\n") or f.peek(1):  # (a torn last line: a kill, quietly)
                skipped.append((number, why))
            while len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
                line = f.readline(MAX_LINE_BYTES)
    if skipped:
        _log.warning("addnorm: %s: skipped %d line(s) that are not watch records (line %d: %s)",
                     path, len(skipped), *skipped[0])
    return records


def _parse_record(line: bytes) -> tuple[dict | None, str]:
    if len(line) > MAX_LINE_BYTES:
        return None, f"longer than {MAX_LINE_BYTES} bytes"
    try:
        record = parse_json(line.decode("utf-8"))
    except UnicodeDecodeError:
        return None, "not UTF-8"
    except ValueError:
        return None, "not JSON"
    if not isinstance(record, dict):
        return None, "not a JSON object"
    if type(record.get("step")) is not int or record["step"] < 0:
        return None, f"step {record.get('step')!r} is not an int >= 0"
    if not isinstance(record.get("layers"), list) or not isinstance(record.get("grad_norm"), dict):
        return None, "no layers and grad_norm"
    return record, ""


def _rounded(value: Any) -> Any:
    if isinstance(value, float):
        return float(f"{value:.{SIGNIFICANT}g}")
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return value


def scalars(record: dict, prefix: str = "watch") -> dict[str, float]:
    """A record's numbers as ``"prefix/section/name[/stat]" -> value`` (heads as ``/hN``)
    and its ``clip_factor`` as ``"prefix/clip_factor"``, for a scalar logger (``grad_norm``:
    before clipping); missing (None) values left out. The loss and lr are the metrics
    records' (``train/...``)."""
    out: dict[str, float] = {}
    if _is_number(record.get("clip_factor")):
        out[f"{prefix}/clip_factor"] = float(record["clip_factor"])
    for section, content in record.items():
        if section in ("step", "layers") or not isinstance(content, dict):
            continue
        for name, value in content.items():
            if isinstance(value, dict):
                items = [(f"{name}/{k}", v) for k, v in value.items()]
            elif isinstance(value, list):
                items = [(f"{name}/h{i}", v) for i, v in enumerate(value)]
            else:
                items = [(name, value)]
            for key, number in items:
                if _is_number(number):
                    out[f"{prefix}/{section}/{key}"] = float(number)
    return out


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def grad_norm_basis(records: Sequence[dict]) -> str:
    """What the ``grad_norm`` of a watch file's ``records`` measures: "before clipping"
    (records with ``clip_factor``), "after clipping" (records written before it was kept,
    whose norms are as ``grad_clip`` left them), or where a resumed run went from one to
    the other."""
    first = next((r["step"] for r in records if "clip_factor" in r), None)
    if first is None:
        return "after clipping (a watch file written before clip_factor was recorded)"
    if all("clip_factor" in r for r in records):
        return "before clipping"
    return f"before clipping from step {first}, after clipping in the records before"


def logger_sink(logger: Logger) -> Sink:
    """A sink that logs each record's :func:`scalars` (``watch/...``) at its step."""

    def log(record: dict) -> None:
        logger.log_scalars(record["step"], scalars(record))

    return log
