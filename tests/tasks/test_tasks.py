"""The two tasks' losses, metrics and batches, checked with stand-in models.

Provenance: F.cross_entropy restated by hand on the non-padding positions; the identity that a
uniform prediction over V symbols costs log2(V) bits per character; the teacher-forcing shift.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import shutil
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from tolerances import FLOAT32_ROUNDED, u
from torch import nn

from addnorm.data.batches import DateBatches
from addnorm.data.dates import dates_in_split, longest_source_length
from addnorm.data.tokenizers import date_source_tokenizer, date_target_tokenizer
from addnorm.tasks.lm import SAMPLE_PROMPTS, LMTask, LMTaskConfig
from addnorm.tasks.run import load_trained, resume_configs, train_run
from addnorm.tasks.translate import TranslateTask, TranslateTaskConfig, seq2seq_loss
from addnorm.training.checkpoint import load_checkpoint
from addnorm.training.config import TrainConfig
from addnorm.training.metrics import read_metrics


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


def test_lm_check_refuses_windows_as_long_as_the_validation_split():
    task = LMTask()
    cfg = task.prepare(task.default_model_config())
    n_val = len(task.corpus.ids("val"))
    task.check(cfg, TrainConfig(), LMTaskConfig(seq_len=n_val - 1))
    with pytest.raises(ValueError, match="validation split"):
        task.check(cfg, TrainConfig(), LMTaskConfig(seq_len=n_val))


def tiny_lm_run(tmp_path, *, seq_len=16, **train):
    task = LMTask()
    model_cfg = replace(task.default_model_config(), d_model=32, n_heads=2, n_layers=1, d_ff=64)
    settings = dict(max_steps=6, batch_size=4, lr=3e-3, warmup=2)
    settings.update(train)
    task_cfg = LMTaskConfig(seq_len=seq_len, eval_size=4)
    return train_run("lm", model_cfg, TrainConfig(**settings), tmp_path, task_cfg=task_cfg)


def test_with_an_ema_the_run_is_scored_and_loaded_with_the_ema_weights(tmp_path):
    summary = tiny_lm_run(tmp_path, ema_decay=0.5)
    assert summary.metrics["weights"] == "ema"
    task, model, checkpoint = load_trained(tmp_path)
    for name, value in model.state_dict().items():
        assert torch.equal(value, checkpoint.tensors["ema"][name])
    assert task.evaluate_run(model, LMTaskConfig(seq_len=16, eval_size=4)) == {
        k: summary.metrics[k] for k in ("val_bpc", "val_chars")
    }
    _, raw, _ = load_trained(tmp_path, weights="raw")
    for name, value in raw.state_dict().items():
        assert torch.equal(value, checkpoint.tensors["model"][name])
    assert any(
        not torch.equal(checkpoint.tensors["ema"][n], checkpoint.tensors["model"][n])
        for n in checkpoint.tensors["model"]
    )


def test_without_an_ema_the_run_is_scored_with_its_trained_weights(tmp_path):
    summary = tiny_lm_run(tmp_path)
    assert summary.metrics["weights"] == "raw"
    task, model, checkpoint = load_trained(tmp_path)
    assert "ema" not in checkpoint.tensors
    assert (
        task.evaluate_run(model, LMTaskConfig(seq_len=16, eval_size=4))["val_bpc"]
        == (summary.metrics["val_bpc"])
    )


def test_an_lm_run_stores_samples_that_continue_their_prompts(tmp_path):
    summary = tiny_lm_run(tmp_path)
    samples = json.loads((tmp_path / "metrics.json").read_text())["samples"]
    assert samples == summary.metrics["samples"]
    assert [s["prompt"] for s in samples] == list(SAMPLE_PROMPTS)
    task, model, _ = load_trained(tmp_path)
    assert [(s["prompt"], s["text"]) for s in samples] == task.samples(model)


def test_a_translate_run_stores_held_out_predictions(tmp_path):
    task = TranslateTask()
    model_cfg = replace(task.default_model_config(), d_model=16, n_heads=2, d_ff=32)
    train_cfg = TrainConfig(max_steps=2, batch_size=4, warmup=1)
    summary = train_run(
        "translate", model_cfg, train_cfg, tmp_path, task_cfg=TranslateTaskConfig(eval_size=4)
    )
    samples = summary.metrics["samples"]
    loaded, model, _ = load_trained(tmp_path)
    assert [s["prediction"] for s in samples] == loaded.predict(
        model, [s["input"] for s in samples]
    )
    test_dates = {d.isoformat() for d in dates_in_split("test")}
    assert samples and all(s["answer"] in test_dates for s in samples)


def test_a_failed_check_leaves_the_previous_run_in_place(tmp_path):
    tiny_lm_run(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(ValueError, match="validation split"):
        tiny_lm_run(tmp_path, seq_len=10**7)
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert load_trained(tmp_path)[2].step == 6


def test_resuming_another_tasks_checkpoint_is_refused_before_training(tmp_path):
    tiny_lm_run(tmp_path)
    checkpoint = load_checkpoint(tmp_path)
    with pytest.raises(ValueError, match="'lm' run"):
        resume_configs(checkpoint, {}, task_name="translate")
    task = TranslateTask()
    with pytest.raises(ValueError, match="'lm' run"):
        train_run(
            "translate",
            task.default_model_config(),
            TrainConfig(),
            tmp_path,
            resume=checkpoint,
        )
    assert load_checkpoint(tmp_path).step == 6


def test_a_checkpoint_recording_the_retired_schedule_d_model_resumes_like_one_without(tmp_path):
    # Checkpoints written before the schedule (then LRSchedule) dropped its unused d_model
    # field store it.
    tiny_lm_run(tmp_path / "new")
    shutil.copytree(tmp_path / "new", tmp_path / "old")
    for name in ("new", "old"):
        checkpoint = load_checkpoint(tmp_path / name)
        if name == "old":
            state = checkpoint.state | {"schedule": checkpoint.state["schedule"] | {"d_model": 32}}
            checkpoint = replace(checkpoint, state=state)
        model_cfg, train_cfg, task_cfg = resume_configs(
            checkpoint, {"max_steps": 8}, task_name="lm"
        )
        train_run(
            "lm", model_cfg, train_cfg, tmp_path / name, task_cfg=task_cfg, resume=checkpoint
        )
    new, old = (read_metrics(tmp_path / name / "metrics.jsonl") for name in ("new", "old"))
    assert old[-1]["step"] == 8
    assert [(r["step"], r["loss"], r["lr"]) for r in old] == [
        (r["step"], r["loss"], r["lr"]) for r in new
    ]


def test_a_checkpoint_holding_former_train_fields_resumes_like_one_without(tmp_path):
    # Checkpoints written while TrainConfig held every task's settings store seq_len in a
    # translate run's train_config, which that task never read.
    task = TranslateTask()
    model_cfg = replace(task.default_model_config(), d_model=16, n_heads=2, d_ff=32,
                        n_encoder_layers=1, n_decoder_layers=1)
    train_cfg = TrainConfig(max_steps=3, batch_size=4, warmup=1, schedule="constant",
                            log_every=1, checkpoint_every=0)
    train_run("translate", model_cfg, train_cfg, tmp_path / "new",
              task_cfg=TranslateTaskConfig(eval_size=4))
    shutil.copytree(tmp_path / "new", tmp_path / "old")
    for name in ("new", "old"):
        checkpoint = load_checkpoint(tmp_path / name)
        if name == "old":
            saved = checkpoint.state["train_config"] | {"seq_len": 128}
            checkpoint = replace(checkpoint, state=checkpoint.state | {"train_config": saved})
        model_cfg, train_cfg, task_cfg = resume_configs(
            checkpoint, {"max_steps": 5}, task_name="translate"
        )
        assert task_cfg == TranslateTaskConfig(eval_size=4)
        train_run("translate", model_cfg, train_cfg, tmp_path / name, resume=checkpoint)
    new, old = (read_metrics(tmp_path / name / "metrics.jsonl") for name in ("new", "old"))
    assert old[-1]["step"] == 5
    assert [(r["step"], r["loss"]) for r in old] == [(r["step"], r["loss"]) for r in new]
    assert "seq_len" not in load_checkpoint(tmp_path / "old").state["train_config"]
