"""ClassEmbedder: label dropout to the null class, forced or random, and its errors."""

from __future__ import annotations

import pytest
import torch

from addnorm.dit.labels import ClassEmbedder


def embedder(class_dropout: float = 0.1) -> ClassEmbedder:
    torch.manual_seed(0)
    return ClassEmbedder(5, 8, class_dropout=class_dropout)


def test_the_table_has_a_null_row_only_with_label_dropout():
    # DiT: nn.Embedding(num_classes + (dropout_prob > 0), D).
    assert embedder(0.1).table.num_embeddings == 6
    assert embedder(0.0).table.num_embeddings == 5


@pytest.mark.parametrize("training", [True, False])
def test_forced_drops_replace_exactly_those_labels_by_the_null_id(training):
    emb = embedder(0.1).train(training)
    y = torch.tensor([0, 1, 2, 3, 4])
    drop = torch.tensor([True, False, True, False, False])
    expected = emb.table.weight[torch.tensor([5, 1, 5, 3, 4])]  # null id = n_classes = 5
    assert torch.equal(emb(y, force_drop_ids=drop), expected)


def test_training_drops_labels_at_the_configured_rate_reproducibly():
    emb = embedder(0.25).train()
    y = torch.zeros(4000, dtype=torch.long)
    first = emb(y, generator=torch.Generator().manual_seed(7))
    again = emb(y, generator=torch.Generator().manual_seed(7))
    assert torch.equal(first, again)
    dropped = (first == emb.table.weight[5]).all(dim=1).float().mean().item()
    assert dropped == pytest.approx(0.25, abs=0.03)  # binomial sd 0.0068: 4.4 sd
    # The draws are those of torch.rand(B) < p, DiT's rule, from the same generator.
    expected = torch.rand(4000, generator=torch.Generator().manual_seed(7)) < 0.25
    assert torch.equal((first == emb.table.weight[5]).all(dim=1), expected)


def test_eval_mode_never_drops():
    emb = embedder(0.5).eval()
    y = torch.arange(5)
    assert torch.equal(emb(y), emb.table.weight[:5])


def test_forcing_a_drop_without_a_null_class_raises():
    with pytest.raises(ValueError, match=r"class_dropout is 0, so there is no null class"):
        embedder(0.0)(torch.tensor([1]), force_drop_ids=torch.tensor([True]))


@pytest.mark.parametrize(("class_dropout", "bad", "high"), [(0.1, 6, 5), (0.0, 5, 4), (0.1, -1, 5)])
def test_class_ids_out_of_range_raise_naming_them(class_dropout, bad, high):
    with pytest.raises(ValueError, match=rf"class id {bad} outside \[0, {high}\]"):
        embedder(class_dropout)(torch.tensor([0, bad]))


def test_float_labels_are_refused():
    with pytest.raises(TypeError, match=r"y must be an integer tensor of class ids"):
        embedder()(torch.tensor([1.0]))
