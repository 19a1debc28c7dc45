"""DiT's 2-D sin-cos patch positions: golden values from the formula, worked by hand."""

from __future__ import annotations

import math

import pytest
import torch

from addnorm.dit.positions import sincos_2d_positions


def test_golden_values_first_half_encodes_the_column():
    # D = 8: Q = D/4 = 2 frequencies per axis, omega = 10000^(-k/2) = [1, 0.01].
    # Token n = i * w + j on a 2 x 3 grid; its code is
    # [sin(j omega) | cos(j omega) | sin(i omega) | cos(i omega)]  (column first, then row).
    def by_hand(i: int, j: int) -> list[float]:
        return [math.sin(j), math.sin(0.01 * j), math.cos(j), math.cos(0.01 * j),
                math.sin(i), math.sin(0.01 * i), math.cos(i), math.cos(0.01 * i)]

    pos = sincos_2d_positions(8, (2, 3))
    assert pos.shape == (6, 8) and pos.dtype == torch.float64
    for n in range(6):
        i, j = divmod(n, 3)
        torch.testing.assert_close(pos[n], torch.tensor(by_hand(i, j), dtype=torch.float64),
                                   rtol=0, atol=1e-15)  # sin/cos of <= 2: a few ulp
    # Token 1 (row 0, column 1), printed: the column half moves, the row half is position 0.
    expected = [0.8414709848, 0.0099998333, 0.5403023059, 0.9999500004, 0, 0, 1, 1]
    assert pos[1].tolist() == pytest.approx(expected, abs=1e-10)  # printed to 10 decimals


def test_each_half_depends_on_one_axis_only():
    # Invariant: tokens in the same grid column share the first half; same row, the second.
    pos = sincos_2d_positions(16, 4).reshape(4, 4, 16)  # (row, column, D)
    assert torch.equal(pos[:, :, :8], pos[:1, :, :8].expand(4, 4, 8))
    assert torch.equal(pos[:, :, 8:], pos[:, :1, 8:].expand(4, 4, 8))


def test_positions_stay_in_the_unit_interval_and_are_distinct():
    pos = sincos_2d_positions(32, 8)
    assert pos.abs().max() <= 1
    # Nearest distinct codes are 1.01 apart (measured); cdist's matmul form can leave ~1e-8
    # on equal codes, so 0.1 rather than 0 tells the two apart.
    assert torch.cdist(pos, pos).add(torch.eye(64, dtype=pos.dtype)).min() > 0.1


def test_d_model_must_be_divisible_by_4():
    with pytest.raises(ValueError, match=r"d_model \(10\) must be divisible by 4"):
        sincos_2d_positions(10, 2)
