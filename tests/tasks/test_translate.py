"""The translate task (``addnorm.tasks.translate``) on the bundled dates: its loss, label
smoothing (in both text tasks' losses), vocabularies, held-out examples, the checks of a
learned position table, the figures printed under the headline, and (slow) the default run's
exact match.

Provenance: F.cross_entropy restated by hand on the non-padding positions, and
``F.cross_entropy``'s own label smoothing, on a stand-in model with fixed logits.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from tolerances import FLOAT32_ROUNDED
from torch import nn

from addnorm.data.dates import dates_in_split, longest_source_length
from addnorm.tasks.lm import LMTask, LMTaskConfig
from addnorm.tasks.run import train_run
from addnorm.tasks.translate import TranslateTask, TranslateTaskConfig, seq2seq_loss
from addnorm.training.config import TrainConfig


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
    # The loss is taken in float32, the oracle in float64: FLOAT32_ROUNDED.
    torch.testing.assert_close(loss.double(), expected, **FLOAT32_ROUNDED)


def test_label_smoothing_is_cross_entropys_own():
    logits = torch.randn(1, 2, 4)
    targets = torch.tensor([[1, 3]])
    batch = {"src": targets, "tgt_in": targets, "tgt_out": targets}
    loss, _ = seq2seq_loss(FixedLogits(logits), batch, label_smoothing=0.1, pad_id=0)
    expected = F.cross_entropy(logits[0], targets[0], label_smoothing=0.1)
    # float32 (the tasks' losses are), two evaluations of one formula over V = 4: a few u each.
    torch.testing.assert_close(loss, expected, **FLOAT32_ROUNDED)


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


def test_the_finished_run_prints_the_error_rates_it_has():
    metrics = {"test_exact_match": 0.75, "test_sequence_error_rate": 0.25,
               "test_token_error_rate": 0.0625, "val_token_error_rate": 0.5}
    assert TranslateTask.figures_text(metrics) == (
        "test_sequence_error_rate: 0.2500 (the share of answers not exactly right)\n"
        "test_token_error_rate: 0.0625 (edits per answer token, in the target tokenizer's "
        "tokens)\n"
    )
    assert TranslateTask.figures_text({"test_exact_match": 1.0}) == ""  # none: nothing


def test_the_validation_scores_the_dates_validation_split_as_the_final_evaluation_does():
    # The validation figures of evaluate (a quarter of eval_size validation dates), never
    # the test dates: an identity on the same model.
    task = TranslateTask()
    torch.manual_seed(0)
    model = task.build_model(replace(task.prepare(task.default_model_config()), d_model=32,
                                     n_heads=2, d_ff=64, n_encoder_layers=1,
                                     n_decoder_layers=1))
    validation = task.validation(TranslateTaskConfig(eval_size=40))
    final = task.evaluate(model, n=40)
    assert validation.score(model) == {k: v for k, v in final.items() if k.startswith("val_")
                                        or k == "n_val"}
    assert final["n_val"] == 10 and validation.metric == "val_exact_match"
    assert validation.higher_is_better and not validation.keep_by_default


@pytest.mark.slow
def test_the_default_translate_run_reaches_98_percent_exact_match(tmp_path):
    # What the default run promises (task defaults, 2 CPU cores, within its 4-minute cap).
    task = TranslateTask()
    summary = train_run(
        "translate", task.default_model_config(), task.default_train_config(), tmp_path
    )
    assert summary.metrics["test_exact_match"] >= 0.98


@pytest.mark.parametrize("smoothing", [0.0, 0.3])
def test_the_configured_label_smoothing_reaches_both_tasks_losses(smoothing):
    torch.manual_seed(0)
    logits = torch.randn(2, 3, 6)
    targets = torch.tensor([[3, 4, 5], [5, 4, 3]])  # no padding
    expected = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), label_smoothing=smoothing)
    seq2seq = {"src": targets, "tgt_in": targets, "tgt_out": targets}
    loss, _ = TranslateTask().loss_fn(TranslateTaskConfig(label_smoothing=smoothing))(
        FixedLogits(logits), seq2seq
    )
    # float32, two evaluations of one formula (V = 6, 6 tokens): a few u each.
    torch.testing.assert_close(loss, expected, **FLOAT32_ROUNDED)
    lm_loss = LMTask().loss_fn(LMTaskConfig(label_smoothing=smoothing))
    loss, _ = lm_loss(FixedLogits(logits), {"ids": targets, "targets": targets})
    torch.testing.assert_close(loss, expected, **FLOAT32_ROUNDED)


def test_translate_check_refuses_a_learned_position_table_shorter_than_the_inputs():
    task = TranslateTask()
    cfg = task.prepare(replace(task.default_model_config(), position_encoding="learned"))
    longest = longest_source_length()
    settings = TrainConfig(), TranslateTaskConfig()
    task.check(replace(cfg, max_len=longest), *settings)
    with pytest.raises(ValueError, match=f"max_len \\({longest - 1}\\) must be >= {longest}"):
        task.check(replace(cfg, max_len=longest - 1), *settings)
    task.check(replace(cfg, position_encoding="rotary", max_len=5), *settings)  # no table


def test_a_learned_table_of_the_checked_size_takes_an_input_of_the_longest_length():
    # The model's own length check agrees with the task's bound, one character either side.
    task = TranslateTask()
    n = longest_source_length()
    tiny = replace(task.default_model_config(), d_model=16, n_heads=2, d_ff=32)
    cfg = task.prepare(replace(tiny, position_encoding="learned", max_len=n))
    task.check(cfg, TrainConfig(), TranslateTaskConfig())
    model = task.build_model(cfg)
    task.predict(model, ["1" * n])
    with pytest.raises(ValueError, match="max_len"):
        task.predict(model, ["1" * (n + 1)])
