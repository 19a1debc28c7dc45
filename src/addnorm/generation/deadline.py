"""``max_time``: the end of a generation's time, on the host's clock.

transformers' ``MaxTimeCriteria`` compares ``time.time()`` with the time its stopping
criteria were built (before the prompt runs) after every step, and ends every row once more
than ``max_time`` seconds have passed; its loop reads the stop flag back at every step, so
that clock has waited for the device. addnorm's loops read one value per step at most (the
stop check, see :mod:`addnorm.generation.loop`), so the clock is read after that check:

- with a stop rule (stop ids, stop strings, beam search), the step's read has waited for
  the device, and the time counted is the device's, as in transformers;
- without one, nothing is read back per step and none is added: the host only queues the
  steps of an accelerator, ahead of the device by at most the depth of its queue, so the
  time counted is the host's; decoding ends by then and the tokens already queued finish.

On the CPU both are the same. A monotonic clock is used (``time.monotonic``), so a change of
the wall clock does not end or extend a generation.
"""

from __future__ import annotations

import time

__all__ = ["Deadline"]


def _now() -> float:
    return time.monotonic()


class Deadline:
    """The moment ``seconds`` after it is built; ``None`` seconds: never."""

    def __init__(self, seconds: float | None) -> None:
        self.end = None if seconds is None else _now() + seconds

    def passed(self) -> bool:
        """Whether more than the given seconds have passed (a host clock read, no sync)."""
        return self.end is not None and _now() > self.end
