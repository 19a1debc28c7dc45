"""Transformer (encoder-decoder): cached decoder steps equal full recomputation and a padded row
gives its logits alone. Oracles: invariants of the same model."""

from __future__ import annotations

import pytest
import torch
from tiny_transformers import (
    BOS,
    PAD,
    POSITIONS,
    SOURCE,
    ids,
    transformer,
)
from tolerances import FLOAT32_MODEL, FLOAT64_EXACT


@pytest.mark.parametrize("positions", POSITIONS)
@torch.no_grad()
def test_transformer_cached_steps_give_the_logits_of_full_recomputation(positions):
    model = transformer(positions)
    tokens = ids(2, 4)
    cache, first = model.start(SOURCE, max_new_tokens=5)
    steps = [first] + [model.step(tokens[:, i : i + 1], cache) for i in range(4)]
    target = torch.cat([torch.full((2, 1), BOS), tokens], dim=1)
    torch.testing.assert_close(torch.stack(steps, 1), model(SOURCE, target), **FLOAT64_EXACT)


@torch.no_grad()
def test_transformer_padded_row_gives_its_logits_alone():
    model = transformer("learned").float()
    target = torch.tensor([[BOS, 3, 4, 5], [BOS, 6, PAD, PAD]])
    batched = model(SOURCE, target)
    alone = model(SOURCE[1:, :3], target[1:, :2])
    # float32, two shapes so two kernel blockings: two float32 evaluations of one model.
    torch.testing.assert_close(batched[1, :2], alone[0], **FLOAT32_MODEL)
