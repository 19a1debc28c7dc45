"""The training batches (``addnorm.data.batches``): the date pairs teacher-force with BOS
and EOS, come from the train split, and resume their order from a saved state; the digits'
dataset and the diffusion's draws.

Provenance: the teacher-forcing shift (``tgt_in[:, 1:] == tgt_out[:, :-1]``, an identity),
the split's own dates, the batches drawn before the state was saved, and torch's own draws
from a generator seeded alike.
"""

from __future__ import annotations

import datetime as dt

import pytest
import torch

from addnorm.data.batches import DateBatches, DiffusionDraws, LabelledImages, image_batch
from addnorm.data.dates import dates_in_split
from addnorm.data.tokenizers import date_source_tokenizer, date_target_tokenizer


def test_date_batches_teacher_force_with_bos_and_eos():
    src_tok, tgt_tok = date_source_tokenizer(), date_target_tokenizer()
    batches = DateBatches(src_tok, tgt_tok, batch_size=6, seed=3)
    batch = batches.next_batch()
    assert torch.equal(batch["tgt_in"][:, 1:], batch["tgt_out"][:, :-1])
    assert (batch["tgt_in"][:, 0] == tgt_tok.bos_id).all()
    assert (batch["tgt_out"][:, -1] == tgt_tok.eos_id).all()
    train = set(dates_in_split("train"))
    for row in batch["tgt_out"].tolist():
        assert dt.date.fromisoformat(tgt_tok.decode(row)) in train


def test_date_batches_resume_their_order_from_state():
    src_tok, tgt_tok = date_source_tokenizer(), date_target_tokenizer()
    batches = DateBatches(src_tok, tgt_tok, batch_size=4, seed=0)
    batches.next_batch()
    state = batches.state_dict()
    expected = batches.next_batch()
    batches.load_state_dict(state)
    assert torch.equal(batches.next_batch()["src"], expected["src"])


def test_diffusion_draws_take_t_noise_and_drop_in_order_from_the_generator():
    """Restated: t uniform on 0..n_steps-1, then standard normal noise like the images, then
    the label dropout's uniforms, from one generator (the reference: the same calls)."""
    batch = {"images": torch.zeros(6, 2, 4, 4)}
    draws = DiffusionDraws(50, class_dropout=0.5)(batch, torch.Generator().manual_seed(8))
    reference = torch.Generator().manual_seed(8)
    assert torch.equal(draws["t"], torch.randint(0, 50, (6,), generator=reference))
    assert torch.equal(draws["noise"], torch.randn(6, 2, 4, 4, generator=reference))
    assert torch.equal(draws["drop"], torch.rand(6, generator=reference) < 0.5)
    assert "drop" not in DiffusionDraws(50)(batch, torch.Generator().manual_seed(8))


def test_labelled_images_are_a_dataset_of_image_and_label():
    images, labels = torch.randn(4, 1, 2, 2), torch.tensor([3, 1, 0, 2], dtype=torch.int32)
    data = LabelledImages(images, labels)
    assert len(data) == 4 and data[1][1] == 1 and torch.equal(data[1][0], images[1])
    batch = image_batch([data[i] for i in (2, 0)])
    assert torch.equal(batch["images"], images[[2, 0]])
    assert batch["labels"].tolist() == [0, 3] and batch["labels"].dtype == torch.int64
    with pytest.raises(ValueError, match=r"labels \(N,\)"):
        LabelledImages(images, labels[:3])
