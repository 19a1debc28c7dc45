"""``addnorm demo``: trains the two main jobs, then prints the table of answers and the
accuracy (budgets made tiny for the test); the smoothed loss floor it reports is what cross
entropy reaches at best (``F.cross_entropy`` with the same label smoothing agrees).
"""

from __future__ import annotations

import pytest

from addnorm.tasks.trained import load_trained


def test_demo_trains_then_prints_the_table_and_accuracy(tmp_path, capsys):
    from addnorm.cli.demo import DEMO_FORMATS, run_demo

    assert run_demo(tmp_path / "demo", max_steps=1, eval_size=4, progress=False) == 0
    capsys.readouterr()
    # The demo replaces its own run directory (make demo run twice works).
    assert run_demo(tmp_path / "demo", max_steps=2, eval_size=4, progress=False) == 0
    assert load_trained(tmp_path / "demo")[2].step == 2
    out = capsys.readouterr().out
    assert "held-out exact match" in out and "년" in out  # Korean row included
    table_rows = [line for line in out.splitlines() if line.rstrip().endswith(("ok", "WRONG"))]
    assert len(table_rows) == len(DEMO_FORMATS)
    assert (tmp_path / "demo" / "loss.png").exists()


def test_the_smoothed_loss_floor_is_what_cross_entropy_reaches_at_best():
    # Logits equal to the log of the smoothed target reach the floor; F.cross_entropy agrees.
    import math

    import torch
    import torch.nn.functional as F

    from addnorm.cli.demo import smoothed_loss_floor

    smoothing, n = 0.1, 15
    target = torch.full((n,), smoothing / n)
    target[3] += 1.0 - smoothing
    loss = F.cross_entropy(target.log()[None], torch.tensor([3]), label_smoothing=smoothing)
    # float32 cross-entropy over 15 classes against a float64 closed form: 15 u of the terms'
    # absolute sum (sum_bound, ~2x the loss) plus the target's rounding: ~2e-6 at worst.
    assert smoothed_loss_floor(smoothing, n) == pytest.approx(loss.item(), rel=1e-5)
    assert smoothed_loss_floor(0.0, n) == 0.0
    assert math.isfinite(smoothed_loss_floor(0.5, 2))
