"""The lm task (``addnorm.tasks.lm``) on the bundled text: its metrics, its checks of the
window length, and a short run.

Provenance: the identity that a uniform prediction over V symbols costs log2(V) bits per
character; a short run beats that uniform cost.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from tolerances import u
from torch import nn

from addnorm.tasks.lm import LMTask, LMTaskConfig
from addnorm.tasks.run import train_run
from addnorm.training.config import TrainConfig


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
    # float32 log-softmax (a few u) averaged over 96 characters: <= 96 u relative (sum_bound).
    assert metrics["val_bpc"] == pytest.approx(math.log2(vocab), rel=100 * u(torch.float32))


def test_lm_task_refuses_windows_longer_than_learned_positions():
    task = LMTask()
    cfg = task.prepare(task.default_model_config())
    with pytest.raises(ValueError, match="seq_len"):
        task.check(
            replace(cfg, position_encoding="learned", max_len=8), TrainConfig(),
            LMTaskConfig(seq_len=16),
        )


def test_a_short_lm_run_beats_the_uniform_bits_per_character(tmp_path):
    # Any learning at all (even of character frequencies) beats log2(V), the uniform cost.
    task = LMTask()
    model_cfg = replace(task.default_model_config(), d_model=32, n_heads=2, n_layers=1, d_ff=64)
    train_cfg = TrainConfig(max_steps=40, batch_size=8, lr=3e-3, warmup=5, checkpoint_every=0)
    task_cfg = LMTaskConfig(seq_len=32, eval_size=20)
    summary = train_run("lm", model_cfg, train_cfg, tmp_path, task_cfg=task_cfg)
    # Measured 4.74 bits against log2(V) = 6.74: the bar 5.74 sits a whole bit above it.
    assert summary.metrics["val_bpc"] < math.log2(task.tokenizer.vocab_size) - 1.0


def test_the_validation_is_the_final_evaluation_of_the_validation_windows():
    # The text has no test split beside its validation split: the same windows, the same
    # figures (an identity), ranked by val_bpc, lower is better; kept by default on a user's
    # text only.
    task = LMTask()
    model = UniformLM(task.tokenizer.vocab_size)
    config = LMTaskConfig(seq_len=32, eval_size=3)
    validation = task.validation(config)
    assert validation.score(model) == task.evaluate_run(model, config)
    assert (validation.metric, validation.higher_is_better) == ("val_bpc", False)
    assert not validation.keep_by_default and validation.unavailable is None


def test_lm_check_refuses_windows_as_long_as_the_validation_split():
    task = LMTask()
    cfg = task.prepare(task.default_model_config())
    n_val = len(task.corpus.ids("val"))
    task.check(cfg, TrainConfig(), LMTaskConfig(seq_len=n_val - 1))
    with pytest.raises(ValueError, match="validation split"):
        task.check(cfg, TrainConfig(), LMTaskConfig(seq_len=n_val))
