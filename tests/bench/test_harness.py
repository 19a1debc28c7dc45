"""addnorm.bench.harness: interleaved timing (the ratios, the table and the JSON:
test_report.py). Speed itself is never asserted."""

from __future__ import annotations

from addnorm.bench.harness import interleaved


def test_interleaved_times_the_implementations_in_alternating_rounds():
    calls: list[str] = []
    fns = {name: (lambda name=name: calls.append(name)) for name in "ABC"}
    record: list = []
    times = interleaved(fns, rounds=3, min_seconds=0.0, warmup=1, label="g", sub_label="c",
                        record=record)
    # One warm-up call each, then per round one blocked_autorange of each function, which
    # calls it several times in a row (its block-size estimate, then its blocks).
    assert calls[:3] == list("ABC")
    runs = [name for i, name in enumerate(calls[3:]) if i == 0 or calls[3 + i - 1] != name]
    assert runs == list("ABC") * 3
    assert set(times) == set("ABC")
    assert all(len(t) == 3 and min(t) >= 0 for t in times.values())  # one sample per round
    assert [(m.label, m.sub_label, m.description) for m in record] == [
        ("g", "c", name) for name in "ABC" * 3]
    assert times["B"] == tuple(m.median for m in record[1::3])  # each sample: its median
