"""How the next token is picked from the logits (``addnorm.generation.sampling``): greedy's
argmax with the logits as its scores, top-k's distribution, and the temperature's division.
(The edges, vanishing temperatures and nuclei: tests/test_generation_edges.py.)

Provenance: ``argmax`` and ``torch.softmax`` in float64 on the same logits (references), and
``softmax`` being unchanged by a shift of each row (identity).
"""

from __future__ import annotations

import torch
from tolerances import FLOAT64_EXACT

from addnorm.generation.config import GenerationConfig
from addnorm.generation.sampling import divide_by_temperature, filtered_probs, pick_token


def logits(seed: int = 0) -> torch.Tensor:
    return torch.randn(3, 10, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_greedy_picks_the_argmax_and_scores_with_the_logits():
    x = logits()
    token, scores = pick_token(x, GenerationConfig(), None, torch.zeros(3, dtype=torch.bool),
                               want_scores=True)
    assert torch.equal(token, x.argmax(dim=-1)) and scores is x


def test_top_k_keeps_the_k_likeliest_and_renormalises_over_them():
    x = logits(1)
    probs, keep = filtered_probs(x, GenerationConfig(strategy="sample", top_k=4))
    top = x.topk(4, dim=-1).indices
    assert keep is not None and torch.equal(keep, torch.zeros_like(keep).scatter(1, top, True))
    expected = torch.softmax(x.masked_fill(~keep, float("-inf")), dim=-1)
    torch.testing.assert_close(probs, expected, **FLOAT64_EXACT)


def test_the_temperature_divides_and_below_one_shifts_each_row_first():
    x = logits(2)
    torch.testing.assert_close(divide_by_temperature(x, 2.0), x / 2.0, **FLOAT64_EXACT)
    shifted = divide_by_temperature(x, 0.5)
    assert torch.equal(shifted.amax(dim=-1), torch.zeros(3, dtype=torch.float64))
    torch.testing.assert_close(torch.softmax(shifted, dim=-1), torch.softmax(x / 0.5, dim=-1),
                               **FLOAT64_EXACT)
