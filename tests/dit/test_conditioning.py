"""ConditionEmbedder: one block's c = timestep_embed(t) + class_embed(y), label drops given.

Oracle: its two parts called alone (the shared layout's formula, computed per block).
"""

from __future__ import annotations

import torch

from addnorm.dit.conditioning import ConditionEmbedder
from addnorm.dit.labels import label_drops


def embedder() -> ConditionEmbedder:
    torch.manual_seed(0)
    return ConditionEmbedder(16, n_classes=5, class_dropout=0.1, downscale_freq_shift=1.0)


def test_c_is_the_timestep_embedding_plus_the_label_row():
    emb = embedder().eval()
    t, y = torch.tensor([0.0, 17.5, 999.0]), torch.tensor([0, 5, 3])  # 5: the null class
    expected = emb.timestep_embed(t) + emb.class_embed.table.weight[y]
    assert torch.equal(emb(t, y), expected)  # the same float32 operations
    assert emb.timestep_embed.downscale_freq_shift == 1.0  # diffusers' sinusoids


def test_given_drops_are_used_in_training_and_none_drawn():
    emb = embedder().train()
    t, y = torch.tensor([1.0, 2.0, 3.0]), torch.tensor([0, 1, 2])
    drops = torch.tensor([True, False, True])
    state = torch.get_rng_state()
    got = emb(t, y, force_drop_ids=drops)
    assert torch.equal(torch.get_rng_state(), state)  # no draw of its own
    assert torch.equal(got, emb.eval()(t, torch.tensor([5, 1, 5])))


def test_label_drops_forced_drawn_or_none():
    y = torch.zeros(4, dtype=torch.long)
    forced = torch.tensor([True, False, False, True])
    assert label_drops(y, 0.1, training=True, force_drop_ids=forced) is forced
    assert label_drops(y, 0.1, training=False) is None
    assert label_drops(y, 0.0, training=True) is None
    # In training: uniform draws below the probability (the draw ClassEmbedder makes).
    draw = label_drops(y, 0.5, training=True, generator=torch.Generator().manual_seed(0))
    assert torch.equal(draw, torch.rand(4, generator=torch.Generator().manual_seed(0)) < 0.5)
