"""Callbacks: what ``Trainer.fit`` tells the code around it, at fixed points of the loop.

A :class:`Callback` overrides the hooks it needs (each does nothing by default). Each is
called with ``state``, a :class:`~addnorm.training.trainer_state.TrainerState`: where training
stands (``state.step``, ``state.step_lr``, ``state.config``, ``state.resumed_from``, the
gradients' norm before clipping and the clip factor) and what it trains (``state.model``,
``state.optimizer``, ``state.ema``), under the names the trainer has for them; a snapshot made
for that call, never the trainer itself.

- ``on_fit_start(state)``: ``fit`` begins; ``state.step`` is where it continues from.
- ``on_step_start(state)``: before the first micro-batch of step ``state.step + 1`` (the model
  in train mode, the gradients cleared, the step's learning rate set).
- ``on_before_update(state)``: the step's gradients are complete (accumulated over its
  micro-batches, averaged over the ranks, clipped: ``state.grad_norm`` is their norm before
  clipping, ``state.clip_factor`` what clipping multiplied them by), just before the optimizer
  update.
- ``on_step_end(state, loss, tokens)``: after the update (``state.step`` counts it); ``loss``
  is the step's mean loss and ``tokens`` the targets it covered, over every rank.
- ``on_log(state, record)``: a metrics record (``step``, ``loss``: the mean of the steps'
  losses since the record before, ``lr``, ``grad_norm``, ``tokens_per_s``, ``elapsed_s`` and a
  probe's ``probe_*`` scores; :mod:`~addnorm.training.record_window`), every ``log_every``
  steps, at each probe and at the last step.
- ``on_fit_end(state)``: ``fit`` is done, however it ended (an error too), before its last
  checkpoint is written.

The trainer calls them on every rank, its own first (:class:`ProgressBar`, and
:class:`MetricsFile` on rank 0), then those it was given, in order. :class:`ProgressLines`
is the bar's counterpart for output that is no terminal (a log file): plain lines. A hook
runs inside the step's phases (:mod:`addnorm.training.step_boundary`): an interrupt in
``on_step_start`` or ``on_before_update`` undoes the step; one in ``on_step_end`` or
``on_log`` keeps it.
"""

from __future__ import annotations

import os
import sys
import time
from typing import TYPE_CHECKING, TextIO

from tqdm.auto import tqdm

from addnorm.training.metrics import MetricsLog

if TYPE_CHECKING:
    from addnorm.training.trainer_state import TrainerState

__all__ = ["Callback", "MetricsFile", "ProgressBar", "ProgressLines"]


class Callback:
    """A hook into ``Trainer.fit``; see the module docstring for when each method is called."""

    def on_fit_start(self, state: TrainerState) -> None:
        """``fit`` begins."""

    def on_step_start(self, state: TrainerState) -> None:
        """A step begins (before its first micro-batch)."""

    def on_before_update(self, state: TrainerState) -> None:
        """The step's gradients are complete; the optimizer update comes next."""

    def on_step_end(self, state: TrainerState, loss: float, tokens: int) -> None:
        """A step ended with this mean ``loss`` over ``tokens`` targets."""

    def on_log(self, state: TrainerState, record: dict[str, float]) -> None:
        """A metrics record was made."""

    def on_fit_end(self, state: TrainerState) -> None:
        """``fit`` is done (by any way)."""


class MetricsFile(Callback):
    """Writes each record as a line of ``path`` (``metrics.jsonl``); a resumed run keeps the
    lines up to the step it resumed from (:class:`~addnorm.training.metrics.MetricsLog`)."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = path
        self._log: MetricsLog | None = None

    def on_fit_start(self, state: TrainerState) -> None:
        self._log = MetricsLog(self.path, resume_from_step=state.resumed_from)

    def on_log(self, state: TrainerState, record: dict[str, float]) -> None:
        assert self._log is not None, "on_log before on_fit_start"
        self._log.write(record)


class ProgressBar(Callback):
    """A tqdm bar of the steps on stderr, showing the last record's loss, lr and tokens/s."""

    def __init__(self) -> None:
        self._bar: tqdm | None = None

    def on_fit_start(self, state: TrainerState) -> None:
        self._bar = tqdm(
            total=state.config.max_steps,
            initial=state.step,
            unit="step",
            dynamic_ncols=True,
        )

    def on_step_end(self, state: TrainerState, loss: float, tokens: int) -> None:
        if self._bar is not None:
            if self._bar.total != state.config.max_steps:  # the run was fitted to its budget
                self._bar.total = state.config.max_steps
            self._bar.update(1)

    def on_log(self, state: TrainerState, record: dict[str, float]) -> None:
        if self._bar is not None:
            self._bar.set_postfix(
                loss=f"{record['loss']:.4f}", lr=f"{record['lr']:.2e}",
                tok_s=f"{record['tokens_per_s']:.0f}",
            )

    def on_fit_end(self, state: TrainerState) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


class ProgressLines(Callback):
    """A plain line of progress every ``every_steps`` steps or ``every_s`` seconds, whichever
    comes first (and at the last step), for output that is no terminal, where a bar would
    stay silent (``addnorm train lm > log``); rank 0 only. A line::

        step 120/2000  loss 2.3456  lr 1.20e-03  1520 tok/s  36 s

    ``loss`` is the mean of the steps' losses since the line before, ``tok/s`` the targets
    per second since then, the seconds those since ``fit`` began. ``stream``: default
    ``sys.stdout`` at the time of writing; each line is flushed.
    """

    def __init__(
        self, *, every_steps: int = 100, every_s: float = 30.0, stream: TextIO | None = None
    ) -> None:
        self.every_steps, self.every_s, self.stream = every_steps, every_s, stream
        self._start = self._last = 0.0
        self._window = (0.0, 0, 0)  # losses summed, steps and targets since the last line

    def on_fit_start(self, state: TrainerState) -> None:
        self._start = self._last = time.monotonic()
        self._window = (0.0, 0, 0)

    def on_step_end(self, state: TrainerState, loss: float, tokens: int) -> None:
        total, steps, targets = self._window
        self._window = (total + loss, steps + 1, targets + tokens)
        now = time.monotonic()
        last = state.step >= state.config.max_steps
        if steps + 1 >= self.every_steps or now - self._last >= self.every_s or last:
            self._write(state, now)

    def _write(self, state: TrainerState, now: float) -> None:
        from addnorm.training import distributed

        total, steps, targets = self._window
        self._window, since, self._last = (0.0, 0, 0), self._last, now
        if not distributed.is_main():
            return
        stream = self.stream if self.stream is not None else sys.stdout
        if stream is None:  # no stdout at all (closed): nothing to write to
            return
        line = (f"step {state.step}/{state.config.max_steps}  loss {total / steps:.4f}  "
                f"lr {state.step_lr:.2e}  "
                f"{targets / max(now - since, 1e-9):.0f} tok/s  {now - self._start:.0f} s")
        print(line, file=stream, flush=True)
