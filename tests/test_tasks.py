"""The two tasks' losses, metrics and batches, checked with stand-in models.

Provenance: F.cross_entropy restated by hand on the non-padding positions; the identity that a
uniform prediction over V symbols costs log2(V) bits per character; the teacher-forcing shift.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from addnorm.data.batches import DateBatches
from addnorm.data.dates import dates_in_split
from addnorm.data.tokenizers import date_source_tokenizer, date_target_tokenizer
from addnorm.training.config import TrainConfig
from addnorm.training.lm_task import LMTask
from addnorm.training.run import train_run
from addnorm.training.translate_task import TranslateTask, seq2seq_loss


class FixedLogits(nn.Module):
    """Returns the same logits whatever the input (a stand-in for a model)."""

    def __init__(self, logits: torch.Tensor) -> None:
        super().__init__()
        self.logits = nn.Parameter(logits)

    def forward(self, *ids: torch.Tensor) -> torch.Tensor:
        return self.logits


def test_seq2seq_loss_averages_only_the_non_padding_targets():
    torch.manual_seed(0)
    logits = torch.randn(2, 3, 5, dtype=torch.float64)
    targets = torch.tensor([[3, 4, 2], [4, 2, 0]])  # row 2 ends in one <pad> (id 0)
    batch = {"src": torch.zeros(2, 1, dtype=torch.long), "tgt_in": targets, "tgt_out": targets}
    loss, n_tokens = seq2seq_loss(FixedLogits(logits), batch, label_smoothing=0.0, pad_id=0)
    log_probs = logits.log_softmax(-1)
    kept = [(b, i) for b in range(2) for i in range(3) if targets[b, i] != 0]
    expected = -sum(log_probs[b, i, targets[b, i]] for b, i in kept) / len(kept)
    assert n_tokens == 5
    torch.testing.assert_close(loss.double(), expected, rtol=1e-6, atol=1e-6)


def test_label_smoothing_is_cross_entropys_own():
    logits = torch.randn(1, 2, 4)
    targets = torch.tensor([[1, 3]])
    batch = {"src": targets, "tgt_in": targets, "tgt_out": targets}
    loss, _ = seq2seq_loss(FixedLogits(logits), batch, label_smoothing=0.1, pad_id=0)
    expected = F.cross_entropy(logits[0], targets[0], label_smoothing=0.1)
    torch.testing.assert_close(loss, expected)


class UniformLM(nn.Module):
    """Predicts every one of V characters with probability 1 / V."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.vocab = vocab
        self.unused = nn.Parameter(torch.zeros(1))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return torch.zeros(*ids.shape, self.vocab)


def test_a_uniform_lm_scores_log2_of_the_vocabulary_in_bits_per_character():
    task = LMTask()
    vocab = task.tokenizer.vocab_size
    model = UniformLM(vocab)
    metrics = task.evaluate(model, seq_len=32, max_windows=3)
    assert metrics["val_chars"] == 3 * 32
    assert metrics["val_bpc"] == pytest.approx(math.log2(vocab), rel=1e-6)


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


def test_translate_task_fills_in_its_vocabularies_and_never_shares_embeddings():
    task = TranslateTask()
    cfg = task.prepare(task.default_model_config())
    assert cfg.src_vocab_size == task.src_tok.vocab_size
    assert cfg.tgt_vocab_size == task.tgt_tok.vocab_size
    assert (cfg.pad_id, cfg.bos_id, cfg.eos_id) == (0, 1, 2)  # the tokenizers' specials
    assert cfg.share_embeddings is False


def test_held_out_examples_are_fixed_and_from_their_split():
    task = TranslateTask()
    first, again = task.held_out("test", 50), task.held_out("test", 50)
    assert first == again
    test_dates = {d.isoformat() for d in dates_in_split("test")}
    assert all(e.target in test_dates for e in first)


def test_lm_task_refuses_windows_longer_than_learned_positions():
    task = LMTask()
    cfg = task.prepare(task.default_model_config())
    with pytest.raises(ValueError, match="seq_len"):
        task.check(replace(cfg, positions="learned", max_len=8), TrainConfig(seq_len=16))


def test_a_short_lm_run_beats_the_uniform_bits_per_character(tmp_path):
    # Any learning at all (even of character frequencies) beats log2(V), the uniform cost.
    task = LMTask()
    model_cfg = replace(task.default_model_config(), d_model=32, n_heads=2, n_layers=1, d_ff=64)
    train_cfg = TrainConfig(
        max_steps=40,
        batch_size=8,
        seq_len=32,
        lr=3e-3,
        warmup=5,
        eval_size=20,
        checkpoint_every=0,
    )
    summary = train_run("lm", model_cfg, train_cfg, tmp_path)
    assert summary.metrics["val_bpc"] < math.log2(task.tokenizer.vocab_size) - 1.0


@pytest.mark.slow
def test_the_default_translate_run_reaches_98_percent_exact_match(tmp_path):
    # The acceptance bar for the default run (task defaults, 2 CPU cores, <= 5 min).
    task = TranslateTask()
    summary = train_run(
        "translate", task.default_model_config(), task.default_train_config(), tmp_path
    )
    assert summary.metrics["test_exact_match"] >= 0.98
