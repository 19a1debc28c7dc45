"""addnorm.bench.tolerances: the bf16 bound of a same-weights check."""

from __future__ import annotations

import pytest

from addnorm.bench.tolerances import BF16_U, bf16_bound


def test_bf16_bound_is_twice_the_worst_reference_with_one_rounding_as_floor():
    assert bf16_bound([0.01, 0.03], 1.0) == pytest.approx(0.06)
    assert bf16_bound([1e-9], 10.0) == pytest.approx(10 * BF16_U)
    assert bf16_bound([], 0.1) == pytest.approx(BF16_U)  # the floor's scale is at least 1
