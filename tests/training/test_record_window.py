"""addnorm.training.record_window: what a metrics record covers.

Provenance: the definitions of the module docstring, on hand-picked numbers whose sums are
exact in binary (halves and quarters): the mean loss of the steps since the record before, the
targets over the seconds since then, the training time of every invocation.
"""

from __future__ import annotations

from addnorm.training.record_window import RecordWindow


def test_a_record_holds_the_mean_loss_and_throughput_since_the_record_before():
    window = RecordWindow()
    window.start()
    assert window.add(1.5, 10, closes=False) == 1.5
    assert window.losses == (1.5, 1)
    assert window.add(0.5, 30, closes=True) == 1.0  # (1.5 + 0.5) / 2
    assert window.losses == (0.0, 0)  # closed at the record's step
    record = window.record(step=2, loss=1.0, lr=0.25, grad_norm=3.0, now=4.0,
                           elapsed_before=100.0, scores={"probe_acc": 0.75})
    assert record == {"step": 2, "loss": 1.0, "lr": 0.25, "grad_norm": 3.0,
                      "tokens_per_s": 10.0, "elapsed_s": 104.0, "probe_acc": 0.75}
    window.restart(4.0)
    window.add(2.0, 8, closes=True)
    later = window.record(step=3, loss=2.0, lr=0.25, grad_norm=1.0, now=6.0,
                          elapsed_before=100.0, scores={})
    assert later["tokens_per_s"] == 4.0  # 8 targets in the 2 s since the record before


def test_the_losses_cross_a_checkpoint_and_the_throughput_starts_again():
    window = RecordWindow()
    window.losses = (3.0, 2)  # a checkpoint's loss_window
    window.start()
    assert window.add(0.0, 5, closes=True) == 1.0  # (3.0 + 0.0) / 3
    record = window.record(step=9, loss=1.0, lr=0.5, grad_norm=0.0, now=0.5,
                           elapsed_before=7.0, scores={})
    assert record["tokens_per_s"] == 10.0 and record["elapsed_s"] == 7.5
