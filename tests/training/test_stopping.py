"""addnorm.training.stopping: stop signals and the time cap, as ``fit`` sees them.

Provenance: the module's contract restated: the first SIGINT/SIGTERM records its
``stopped_by``, a second raises KeyboardInterrupt, the handlers that were installed before
are put back; the time cap compares the wall clock (a fake one here, so no test reads real
time) with ``max_minutes``; an early stop (a stand-in) stops with its reason and hears of a
time cap's stop, never of a signal's.
"""

from __future__ import annotations

import os
import signal
import threading

import pytest

from addnorm.training import stopping
from addnorm.training.stopping import STOP_SIGNALS, StopRequests


def test_the_first_signal_asks_for_a_stop_and_a_second_interrupts_at_once():
    before = {s: signal.getsignal(s) for s in STOP_SIGNALS}
    with StopRequests(None) as stops:
        assert not stops.agreed() and stops.stopped_by == "max_steps"
        os.kill(os.getpid(), signal.SIGTERM)
        assert stops.requested == "terminate"
        assert stops.agreed() and stops.stopped_by == "terminate"
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
        assert stops.interrupted() == "terminate"  # the first signal names the stop
    assert {s: signal.getsignal(s) for s in STOP_SIGNALS} == before


def test_an_interrupt_without_a_signal_is_an_interrupt():
    with StopRequests(None) as stops:
        assert stops.interrupted() == "interrupt"


def test_the_time_cap_stops_once_max_minutes_have_passed(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(stopping.time, "monotonic", lambda: now[0])
    with StopRequests(max_minutes=0.5) as stops:
        now[0] += 29.9
        assert not stops.agreed()
        now[0] += 0.1
        assert stops.agreed() and stops.stopped_by == "max_minutes"


class Patience:
    """Stops early from its third question on, and notes the stops it hears of."""

    def __init__(self) -> None:
        self.asked, self.heard = 0, []

    def stop_reason(self):
        self.asked += 1
        return "patience" if self.asked >= 3 else None

    def stopping(self, reason, step):
        self.heard.append((reason, step))


def test_an_early_stop_stops_and_hears_of_the_time_cap_but_not_of_a_signal(monkeypatch):
    early = Patience()
    with StopRequests(max_minutes=None, early=early) as stops:
        assert not stops.agreed(1) and not stops.agreed(2)
        assert stops.agreed(3) and stops.stopped_by == "patience"
    assert early.heard == [("patience", 3)]
    now = [1000.0]
    monkeypatch.setattr(stopping.time, "monotonic", lambda: now[0])
    early = Patience()
    with StopRequests(max_minutes=0.5, early=early) as stops:
        now[0] += 30.0
        assert stops.agreed(7) and stops.stopped_by == "max_minutes"
    assert early.heard == [("max_minutes", 7)]
    early = Patience()
    with StopRequests(max_minutes=None, early=early) as stops:
        os.kill(os.getpid(), signal.SIGINT)
        assert stops.agreed(2) and stops.stopped_by == "interrupt"
    assert early.heard == [] and early.asked == 0  # a signal is the trainer's to handle


def test_outside_the_main_thread_no_handler_is_installed():
    seen = {}

    def run():
        with StopRequests(None) as stops:
            seen["handler"] = signal.getsignal(signal.SIGINT)
            seen["agreed"] = stops.agreed()

    before = signal.getsignal(signal.SIGINT)
    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert seen == {"handler": before, "agreed": False}
