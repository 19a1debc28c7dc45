"""The token-and-position embedding: the paper's formula (sections 3.4-3.5) against the encodings
module, and positions counted past leading padding."""

from __future__ import annotations

import math

import pytest
import torch
from tiny_transformers import (
    F64,
    PAD,
    POSITIONS,
    ids,
    language_model,
    transformer,
)
from tolerances import FLOAT64_EXACT

from addnorm.encodings import sinusoidal_encoding
from addnorm.transformer.embedding import positions_from_padding


@pytest.mark.parametrize("positions", POSITIONS)
@torch.no_grad()
def test_forward_without_leading_padding_equals_explicit_per_row_positions(positions):
    """Identity: when no padding precedes a real token, ``cumsum(~padding) - 1`` is
    ``arange(L)`` on every real token, so the forward's ``positions=None`` shortcut (cached
    tables, no range-check sync) gives the logits of explicit per-row positions."""
    model = language_model(positions)
    tokens = torch.tensor([[5, 6, 7, 8, 9], [7, 8, 9, PAD, PAD]])
    padding = tokens == PAD
    pos = positions_from_padding(padding)
    h = model.blocks(model.embed(tokens, pos), padding_mask=padding, causal=True, positions=pos)
    torch.testing.assert_close(model(tokens)[~padding], model.to_logits(h)[~padding],
                               **FLOAT64_EXACT)


@torch.no_grad()
def test_embedding_is_scaled_tokens_plus_sinusoidal_positions():
    """Paper, sections 3.4-3.5: E[ids] * sqrt(d_model) + PE(pos)."""
    model = transformer()
    tokens = ids(2, 5)
    positions = torch.arange(5).expand(2, 5)
    expected = model.src_embed.tokens.weight[tokens] * math.sqrt(32) + sinusoidal_encoding(
        torch.arange(5), 32, dtype=F64
    )
    torch.testing.assert_close(model.src_embed(tokens, positions), expected, **FLOAT64_EXACT)
