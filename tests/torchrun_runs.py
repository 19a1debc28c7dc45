"""What every torchrun equivalence test checks of its runs: ``ROOT/one`` trained by one
process and ``ROOT/two`` by two ranks of one global batch log the same losses, and the second
says it ran on two.

The CLI trains in float32, where Adam turns rounding noise on zero-gradient weights into
lr-sized steps (see TRAJECTORY_RTOL in tests/training/test_distributed.py), so the weights are
no measure here. The losses are: those weights do not change the function. Each logged loss is
a mean over about 1e3 float32 terms summed in another order (tolerances' sum bound: 1e3 *
2**-24, 6e-5 at worst, near sqrt(1e3) * 2**-24 = 2e-6 for blocked sums), plus the effect of
the other weights' rounding differences; ``LOSS_RTOL`` bounds both (measured on AVX-512: at
most 1.9e-7).
"""

from __future__ import annotations

import json
from pathlib import Path

from addnorm.training.metrics import read_metrics

LOSS_RTOL = 1e-4


def assert_two_ranks_train_as_one(root: Path, n_records: int) -> None:
    """``root/one`` and ``root/two`` logged ``n_records`` losses each, equal within
    ``LOSS_RTOL`` relative, and ``root/two`` recorded ``world_size`` 2."""
    losses = [[r["loss"] for r in read_metrics(root / run / "metrics.jsonl")]
              for run in ("one", "two")]
    assert len(losses[0]) == len(losses[1]) == n_records
    for x, y in zip(*losses, strict=True):
        assert abs(x - y) <= LOSS_RTOL * abs(x), losses
    assert json.loads((root / "two" / "metrics.json").read_text())["world_size"] == 2
