"""addnorm.training.clock: training time is the wall clock less the time set aside.

Provenance: a fake monotonic clock (no test reads real time); the sums restated.
"""

from __future__ import annotations

from addnorm.training import clock
from addnorm.training.clock import TrainingClock


def test_time_set_aside_is_left_out(monkeypatch):
    now = [50.0]
    monkeypatch.setattr(clock.time, "monotonic", lambda: now[0])
    timer = TrainingClock()
    timer.start()
    now[0] += 3.0
    with timer.set_aside():
        now[0] += 10.0
    now[0] += 2.0
    assert timer.seconds() == 5.0
    timer.start()
    assert timer.seconds() == 0.0
