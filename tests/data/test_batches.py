"""The training batches (``addnorm.data.batches``): the date pairs teacher-force with BOS
and EOS, come from the train split, and resume their order from a saved state.

Provenance: the teacher-forcing shift (``tgt_in[:, 1:] == tgt_out[:, :-1]``, an identity),
the split's own dates, and the batches drawn before the state was saved.
"""

from __future__ import annotations

import datetime as dt

import torch

from addnorm.data.batches import DateBatches
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
