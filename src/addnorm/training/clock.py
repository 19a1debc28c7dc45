"""The training time of one ``fit``: the wall clock since it started, less the time set aside
for work that is not training (a probe's), which a run's ``elapsed_s`` and its throughput
(``tokens_per_s``) leave out, and which its time budget (``max_minutes``) does not spend.

The clock it reads can be injected (``now``), so that a test of what depends on time (the
budget, the time cap) runs on a fake one and asserts nothing about real time."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

__all__ = ["TrainingClock"]


class TrainingClock:
    """Seconds of training since :meth:`start`, without those spent in :meth:`set_aside`.

    Args:
        now: the clock read, in seconds (any origin); None: ``time.monotonic``.
    """

    def __init__(self, now: Callable[[], float] | None = None) -> None:
        self._now = now
        self._start = self._read()
        self._aside = 0.0

    def _read(self) -> float:
        return time.monotonic() if self._now is None else self._now()

    def start(self) -> None:
        """Start counting from zero."""
        self._start, self._aside = self._read(), 0.0

    def seconds(self) -> float:
        """Training seconds since :meth:`start`."""
        return self._read() - self._start - self._aside

    @contextlib.contextmanager
    def set_aside(self) -> Iterator[None]:
        """Leave the time spent inside this block out of :meth:`seconds`."""
        began = self._read()
        try:
            yield
        finally:
            self._aside += self._read() - began
