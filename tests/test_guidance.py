"""guided_prediction: classifier-free guidance's formula, the one both families use.

Provenance: identities (scale 1 gives the conditional prediction, 0 the unconditional one),
the formula written out in float64, and the two families' modules holding this function.
"""

from __future__ import annotations

import pytest
import torch
from tolerances import FLOAT64_EXACT

from addnorm.diffusion import guidance as diffusion_guidance
from addnorm.dit import guidance as dit_guidance
from addnorm.guidance import guided_prediction


def test_scale_1_gives_the_conditional_and_0_the_unconditional_prediction():
    g = torch.Generator().manual_seed(0)
    cond, uncond = torch.randn(2, 3, 4, 4, generator=g, dtype=torch.float64).unbind(0)
    # float64; scale 1 rounds uncond + (cond - uncond), a few u from cond: FLOAT64_EXACT.
    torch.testing.assert_close(guided_prediction(cond, uncond, 1.0), cond, **FLOAT64_EXACT)
    assert torch.equal(guided_prediction(cond, uncond, 0.0), uncond)  # uncond + 0 * (...)


@pytest.mark.parametrize("scale", [-1.0, 1.5, 4.0])
def test_guided_prediction_is_uncond_plus_scale_times_the_difference(scale):
    g = torch.Generator().manual_seed(1)
    cond, uncond = torch.randn(2, 5, 2, generator=g, dtype=torch.float64).unbind(0)
    expected = uncond + scale * (cond - uncond)  # the same operations: the same bits
    assert torch.equal(guided_prediction(cond, uncond, scale), expected)


def test_dit_and_diffusion_guidance_use_this_one_formula():
    assert dit_guidance.guided_prediction is guided_prediction
    assert diffusion_guidance.guided_prediction is guided_prediction
