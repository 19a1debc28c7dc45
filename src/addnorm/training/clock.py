"""The training time of one ``fit``: the wall clock since it started, less the time set aside
for work that is not training (a probe's), which a run's ``elapsed_s`` and its throughput
(``tokens_per_s``) leave out."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

__all__ = ["TrainingClock"]


class TrainingClock:
    """Seconds of training since :meth:`start`, without those spent in :meth:`set_aside`."""

    def __init__(self) -> None:
        self._start = time.monotonic()
        self._aside = 0.0

    def start(self) -> None:
        """Start counting from zero."""
        self._start, self._aside = time.monotonic(), 0.0

    def seconds(self) -> float:
        """Training seconds since :meth:`start`."""
        return time.monotonic() - self._start - self._aside

    @contextlib.contextmanager
    def set_aside(self) -> Iterator[None]:
        """Leave the time spent inside this block out of :meth:`seconds`."""
        began = time.monotonic()
        try:
            yield
        finally:
            self._aside += time.monotonic() - began
