"""Tests for addnorm.learned_positions: the learned table adds the rows of its positions, is
initialised as GPT-2's, and refuses positions it has no row for.

Provenance: nn.Embedding rows indexed by the positions (the oracle); the GPT-2 / nanoGPT
initialisation rule with sampling bounds; SPEC claim 8 for the refusals.
"""

from __future__ import annotations

import pytest
import torch

from addnorm.learned_positions import LearnedPositionalEmbedding


def test_learned_adds_table_rows_by_offset_and_positions():
    # Oracle: nn.Embedding rows indexed by the positions.
    torch.manual_seed(0)
    module = LearnedPositionalEmbedding(16, 4)
    x = torch.randn(2, 3, 4)
    weight = module.embedding.weight
    torch.testing.assert_close(module(x, offset=5), x + weight[5:8])
    positions = torch.tensor([[0, 1, 2], [7, 8, 15]])
    torch.testing.assert_close(module(x, positions=positions), x + weight[positions])
    whole_floats = positions.double()  # whole-number floats are accepted
    # (all three: the same rows and one float32 add, equal, so float32 defaults fit)
    torch.testing.assert_close(module(x, positions=whole_floats), x + weight[positions])


def test_learned_table_is_initialised_with_std_0_02():
    # Rule (GPT-2/nanoGPT): N(0, 0.02^2). n = 65536 draws (seeded): the sample std's own
    # relative std is 1/sqrt(2n) = 0.28%, so rel=0.03 is ~11 sigma; the mean's std is
    # 0.02/sqrt(n) = 7.8e-5, so 0.001 is ~13 sigma.
    torch.manual_seed(0)
    weight = LearnedPositionalEmbedding(1024, 64).embedding.weight
    assert weight.std().item() == pytest.approx(0.02, rel=0.03)
    assert abs(weight.mean().item()) < 0.001


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"offset": 14}, r"offset \(14\) \+ sequence length \(3\) = 17 exceeds max_len \(16\)"),
        ({"positions": torch.tensor([0, 1, 16])}, r"position 16 .*max_len \(16\)"),
        ({"positions": torch.tensor([0, -1, 2])}, r"positions must be >= 0, got -1"),
        ({"positions": torch.tensor([0.0, 1.5, 2.0])}, r"whole numbers .* got 1.5"),
        # Range checked on the float values (1e20 would wrap around as a long).
        ({"positions": torch.tensor([0.0, 1.0, 1e20])}, r"position 1\.0\d*e\+20 is out of range"),
        ({"positions": torch.tensor([0.0, 1.0, -1e20])}, r"must be >= 0, got -1\.0\d*e\+20"),
    ],
)
def test_learned_rejects_positions_it_has_no_row_for(kwargs, match):
    # SPEC claim 8: a learned table cannot represent unseen positions; say so clearly.
    module = LearnedPositionalEmbedding(16, 4)
    with pytest.raises(ValueError, match=match):
        module(torch.zeros(1, 3, 4), **kwargs)
