"""modulate: x * (1 + scale) + shift per sample, broadcast over the tokens."""

from __future__ import annotations

import torch
from tolerances import FLOAT32_ROUNDED, FLOAT64_EXACT

from addnorm.dit.modulation import adaln_modulation, modulate


def test_zero_shift_and_scale_is_the_identity():
    x = torch.randn(2, 5, 4)
    assert torch.equal(modulate(x, torch.zeros(2, 4), torch.zeros(2, 4)), x)


def test_each_sample_is_scaled_and_shifted_by_its_own_vectors():
    # Oracle: the formula written per sample and token with explicit loops.
    x, shift, scale = torch.randn(2, 3, 4), torch.randn(2, 4), torch.randn(2, 4)
    out = modulate(x, shift, scale)
    for b in range(2):
        for n in range(3):  # float32, 3 roundings (or a fused multiply-add): FLOAT32_ROUNDED
            expected = x[b, n] * (1 + scale[b]) + shift[b]
            torch.testing.assert_close(out[b, n], expected, **FLOAT32_ROUNDED)


def test_adaln_modulation_is_silu_then_linear():
    mod = adaln_modulation(4, 6).double()  # float64: the same map, maybe another kernel
    c = torch.randn(3, 4, dtype=torch.float64)
    expected = torch.nn.functional.linear(torch.nn.functional.silu(c), mod[1].weight, mod[1].bias)
    assert mod[1].weight.shape == (24, 4)
    torch.testing.assert_close(mod(c), expected, **FLOAT64_EXACT)
