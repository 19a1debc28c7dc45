"""``max_time``'s clock (``addnorm.generation.deadline``): a ``Deadline`` passes once more
than its seconds have gone by on the monotonic clock, never without seconds; the decode loops
read it once when the call begins and once after each token.

Provenance: a clock replaced by one that advances one second per reading (the deadline then
passes at a step known in advance), and the identity that ending at step n gives the tokens of
``max_new_tokens=n``. Whole-model calls against transformers' ``MaxTimeCriteria`` are in
tests/transformer/test_generate_hf_settings.py.
"""

from __future__ import annotations

import pytest
import torch
from gpt2_pair import models, prompt

import addnorm.generation.deadline as deadline_module
from addnorm.generation.deadline import Deadline


@pytest.mark.parametrize("strategy", ["greedy", "sample", "beam"])
@pytest.mark.parametrize("ticks", [1, 3, 6])
def test_max_time_ends_decoding_at_the_step_its_clock_passes(strategy, ticks, monkeypatch):
    # A clock that advances one second per reading: the deadline is read once when the call
    # begins and once after each token, so max_time = ticks - 0.5 ends decoding after `ticks`
    # tokens; the tokens are those of max_new_tokens=ticks (identity), beam search finishing
    # its live beams there.
    clock = iter(range(10**6))
    monkeypatch.setattr(deadline_module, "_now", lambda: next(clock))
    _, lm = models()
    ids, mask = prompt(7)
    names = {"attention_mask": mask, **{"greedy": {}, "sample": {"do_sample": True},
                "beam": {"num_beams": 3, "early_stopping": True}}[strategy]}
    torch.manual_seed(0)
    timed = lm.generate(ids, max_new_tokens=10, max_time=ticks - 0.5, **names)
    torch.manual_seed(0)
    assert torch.equal(timed, lm.generate(ids, max_new_tokens=ticks, **names))


def test_a_deadline_passes_once_more_than_its_seconds_have_gone_by(monkeypatch):
    clock = iter([100.0, 102.0, 102.5, 102.6])  # built at 100, then read three times
    monkeypatch.setattr(deadline_module, "_now", lambda: next(clock))
    deadline = Deadline(2.5)
    assert [deadline.passed() for _ in range(3)] == [False, False, True]  # 2, 2.5, 2.6 s


def test_without_seconds_a_deadline_never_passes_nor_reads_the_clock(monkeypatch):
    def no_clock() -> float:
        raise AssertionError("the clock was read")

    monkeypatch.setattr(deadline_module, "_now", no_clock)
    assert not Deadline(None).passed()


def test_the_clock_is_the_monotonic_one(monkeypatch):
    # A change of the wall clock neither ends nor extends a generation.
    monkeypatch.setattr(deadline_module.time, "time", lambda: 0.0)
    monkeypatch.setattr(deadline_module.time, "monotonic", lambda: 50.0)
    assert deadline_module._now() == 50.0 and Deadline(1.0).end == 51.0
