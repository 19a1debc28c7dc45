"""When training stops before its step budget: a stop signal, the time cap or an early stop,
agreed by every rank.

While ``Trainer.fit`` runs (in the main thread), :class:`StopRequests` catches SIGINT and
SIGTERM (``STOP_SIGNALS``): the first of either only records the request, so the current step
finishes, a checkpoint is written and ``fit`` returns with ``stopped_by`` "interrupt" (SIGINT,
Ctrl-C) or "terminate" (SIGTERM); a second raises ``KeyboardInterrupt`` at once, and
``stopped_by`` still names the first. The time cap (``max_minutes``) runs on the training clock
of ``fit`` (:class:`~addnorm.training.clock.TrainingClock`: the wall clock less the probes'
time, the time a run's budget counts), or on the wall clock from the start of ``fit`` when
given none. It is the last resort: a run planned to its budget
(:mod:`~addnorm.training.budget`) ends at its planned steps before it. Before each step the
ranks of a ``torchrun`` launch agree on the strongest reason any of them has
(:func:`addnorm.training.distributed.agree_on_stop`), so all stop after the same step. A run
may also stop early (``early``: ``patience`` evaluations without a better score,
:mod:`addnorm.training.best_runner`; single-process runs), and what stops early hears of a
stop between its evaluations (the time cap's), to score the last step. The
handlers that were installed before are put back when ``fit`` ends.
"""

from __future__ import annotations

import signal
import threading
import time
from types import FrameType, TracebackType
from typing import Protocol

from addnorm.training import distributed
from addnorm.training.clock import TrainingClock

__all__ = ["STOP_SIGNALS", "EarlyStop", "StopRequests"]

# The signals that stop training cleanly, and the ``stopped_by`` each gives.
STOP_SIGNALS = {signal.SIGINT: "interrupt", signal.SIGTERM: "terminate"}


class EarlyStop(Protocol):
    """What may stop training before its budget
    (:class:`addnorm.training.best_runner.BestRunner`)."""

    def stop_reason(self) -> str | None:
        """The ``stopped_by`` if training should stop now ("patience"), else None."""
        ...

    def stopping(self, reason: str, step: int) -> None:
        """Training stops after ``step`` for ``reason`` (neither a signal nor its own)."""
        ...


class StopRequests:
    """Why ``fit`` stops, as a context manager around it (see the module docstring).

    Args:
        max_minutes: the time cap of this invocation; None for none.
        early: what may stop training early (see the module docstring), or None.
        clock: the training clock the cap is read on (``fit``'s, started by it); None: the
            wall clock since the context was entered.

    Attributes:
        requested: the ``stopped_by`` of the first stop signal, None before any.
        stopped_by: why training stopped: "max_steps" until :meth:`agreed` or
            :meth:`interrupted` says otherwise.
    """

    def __init__(self, max_minutes: float | None, early: EarlyStop | None = None, *,
                 clock: TrainingClock | None = None) -> None:
        self.max_s = None if max_minutes is None else 60.0 * max_minutes
        self.early = early
        self.clock = clock
        self.requested: str | None = None
        self.stopped_by = "max_steps"
        self._start = time.monotonic()
        self._previous: dict[int, object] = {}

    def __enter__(self) -> StopRequests:
        self.requested, self.stopped_by = None, "max_steps"
        if threading.current_thread() is threading.main_thread():  # else Python refuses
            previous = {signum: signal.signal(signum, self._request) for signum in STOP_SIGNALS}
            # (None: a handler not installed from Python, which cannot be put back)
            self._previous = {s: handler for s, handler in previous.items() if handler is not None}
        self._start = time.monotonic()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)  # type: ignore[arg-type]  # what signal() returned
        self._previous = {}

    def agreed(self, step: int = 0) -> bool:
        """Whether every rank stops before the next step (``step`` done): a stop signal, an
        early stop or the time cap passed, on any rank; sets ``stopped_by`` (and tells
        ``early`` of a stop that is no signal). A collective with several processes."""
        reason = self.requested
        if reason is None and self.early is not None:
            reason = self.early.stop_reason()
        if reason is None and self._out_of_time():
            reason = "max_minutes"
        reason = distributed.agree_on_stop(reason)
        if reason is not None:
            self.stopped_by = reason
            if self.early is not None and reason not in STOP_SIGNALS.values():
                self.early.stopping(reason, step)
        return reason is not None

    def interrupted(self) -> str:
        """Record a ``KeyboardInterrupt`` that reached ``fit``: the stop is the first signal's
        (a second signal raised it) or "interrupt"; returns ``stopped_by``."""
        self.stopped_by = self.requested or "interrupt"
        return self.stopped_by

    def _out_of_time(self) -> bool:
        if self.max_s is None:
            return False
        seconds = time.monotonic() - self._start if self.clock is None else self.clock.seconds()
        return seconds >= self.max_s

    def _request(self, signum: int, frame: FrameType | None) -> None:
        if self.requested is not None:
            raise KeyboardInterrupt
        self.requested = STOP_SIGNALS[signal.Signals(signum)]
