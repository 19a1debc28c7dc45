"""norm-examples: seed 003's worked example (SPEC section 3, claim 4)."""

import torch
from torch import nn

from addnorm.experiments import norm_examples


def test_batchnorm_and_layernorm_match_the_seed_digits():
    outcome = norm_examples.run(quick=True)
    numbers = outcome.numbers
    assert outcome.supported
    assert numbers["batch_mean"] == [2.0, 4.0]  # SPEC: mu = [2, 4]
    # sigma^2 = [2/3, 8/3], computed in float64: a few u (1.1e-16) of 8/3.
    assert abs(numbers["batch_var"][0] - 2 / 3) < 1e-12
    assert abs(numbers["batch_var"][1] - 8 / 3) < 1e-12
    # -1.2247449 lies 5e-6 from the rounding boundary -1.22475, far beyond any rounding.
    assert [round(v, 4) for v in numbers["batch_norm"][0]] == [-1.2247, -1.2247]
    assert all(row == [-1.0, 1.0] for row in numbers["layer_norm"])


class AnnotatedLayerNorm(nn.Module):
    """The Annotated Transformer's LayerNorm: unbiased std, eps outside the square root."""

    def __init__(self, d_model: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.a_2, self.b_2 = nn.Parameter(torch.ones(d_model)), nn.Parameter(torch.zeros(d_model))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean, std = x.mean(-1, keepdim=True), x.std(-1, keepdim=True)
        return self.a_2 * (x - mean) / (std + self.eps) + self.b_2


def test_a_layernorm_with_the_unbiased_std_is_not_supported():
    outcome = norm_examples.run(quick=True, layer_norm_factory=lambda: AnnotatedLayerNorm(2))
    assert outcome.verdict == "not supported"
    # rows [x, 2x]: unbiased std x / sqrt(2) -> [-1/sqrt(2), 1/sqrt(2)] (up to eps)
    assert abs(outcome.numbers["layer_norm"][0][1] - 2**-0.5) < 1e-5
