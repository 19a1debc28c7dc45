"""classifier_free_guidance: uncond + s (cond - uncond) on the guided channels only."""

from __future__ import annotations

import torch
from tolerances import FLOAT64_EXACT

from addnorm.dit import classifier_free_guidance


def halves() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    cond = torch.randn(2, 4, 3, 3, dtype=torch.float64)
    uncond = torch.randn(2, 4, 3, 3, dtype=torch.float64)
    return cond, uncond, torch.cat([cond, uncond])


def test_scale_1_gives_the_conditional_and_0_the_unconditional_output():
    cond, uncond, out = halves()
    # float64; scale 1 rounds uncond + (cond - uncond), a few u from cond: FLOAT64_EXACT.
    guided = classifier_free_guidance(out, 1.0, n_guided=4)[:2]
    torch.testing.assert_close(guided, cond, **FLOAT64_EXACT)
    unguided = classifier_free_guidance(out, 0.0, n_guided=4)[:2]
    torch.testing.assert_close(unguided, uncond, **FLOAT64_EXACT)


def test_guided_channels_follow_the_formula_and_the_rest_pass_through():
    cond, uncond, out = halves()
    guided = classifier_free_guidance(out, 4.0, n_guided=2)
    expected = uncond[:, :2] + 4.0 * (cond[:, :2] - uncond[:, :2])
    torch.testing.assert_close(guided[:2, :2], expected, **FLOAT64_EXACT)  # float64
    torch.testing.assert_close(guided[2:, :2], expected, **FLOAT64_EXACT)  # both halves alike
    assert torch.equal(guided[:, 2:], out[:, 2:])  # each half keeps its own other channels
