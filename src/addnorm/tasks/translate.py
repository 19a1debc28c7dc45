"""The ``translate`` task: the encoder-decoder ``Transformer`` on pairs
(:mod:`addnorm.tasks.translate_data`: date normalization, or a user's sentence pairs,
``TranslateTaskConfig.data``).

Training teaches with ``<bos>`` + answer in and answer + ``<eos>`` out; evaluation decodes
greedily with the model's ``generate`` and scores the held-out pairs: exact match, the error
rates of :mod:`addnorm.tasks.text_metrics` (token, character, word and sequence), and chrF on a
user's. Why the defaults are what they are: ``docs/task-defaults.md``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, cast

import torch
import torch.nn.functional as F
from torch import nn

from addnorm.data.fingerprint import DataRecord
from addnorm.data.hf_tokenizer import TextTokenizer
from addnorm.data.pairs import PairCorpus
from addnorm.data.sampler import SampledBatches
from addnorm.data.tokenizers import CharTokenizer
from addnorm.tasks.data_settings import check_data_settings
from addnorm.tasks.pair_data import Example, PairData
from addnorm.tasks.task import Sizing, TaskConfig
from addnorm.tasks.translate_data import (
    PREDICT_BATCH_SIZE,
    pair_data,
    pair_data_for,
    pair_data_from_dict,
)
from addnorm.training.best import Validation, validates
from addnorm.training.config import TrainConfig
from addnorm.training.trainer_io import LossFn
from addnorm.transformer import Transformer
from addnorm.transformer.config import TRANSFORMER_PRESETS, TransformerConfig
from addnorm.utils.checks import check_int, check_probability

__all__ = [
    "PREDICT_BATCH_SIZE", "Example", "TranslateTask", "TranslateTaskConfig", "seq2seq_loss",
]

# Held-out predictions stored in metrics.json.
_N_SAMPLES = 8
# The held-out figures ``addnorm train`` prints under the headline: name, format, meaning.
_FIGURES = (
    ("sequence_error_rate", ".4f", "the share of answers not exactly right"),
    ("token_error_rate", ".4f", "edits per answer token, in the target tokenizer's tokens"),
    ("char_error_rate", ".4f", "edits per answer character"),
    ("word_error_rate", ".4f", "edits per answer word, words split at whitespace"),
    ("chrf", ".2f", "sacrebleu's chrF, 0-100"),
)


def seq2seq_loss(
    model: nn.Module, batch: dict[str, torch.Tensor], *, label_smoothing: float, pad_id: int
) -> tuple[torch.Tensor, int]:
    """Mean cross-entropy of the target tokens (padding ignored) and their count."""
    logits = model(batch["src"], batch["tgt_in"])  # (B, L, V)
    targets = batch["tgt_out"]  # (B, L)
    loss = F.cross_entropy(
        logits.flatten(0, 1).float(),  # (B * L, V)
        targets.flatten(),  # (B * L,)
        ignore_index=pad_id,
        label_smoothing=label_smoothing,
    )
    return loss, int((targets != pad_id).sum())


@dataclass(frozen=True)
class TranslateTaskConfig(TaskConfig):
    """The translation task's own settings.

    Attributes:
        label_smoothing: F.cross_entropy's label_smoothing (the paper: 0.1).
        eval_size: held-out examples scored at the end: test dates (plus a quarter as many
            validation dates), or at most this many of your held-out test pairs; a quarter as
            many validation examples are scored while training (keep_best, patience).
        data: your sentence pairs to train on: a TSV file (source<TAB>target a line) or
            JSON Lines ({"source": ..., "target": ...} a line; named .jsonl, .ndjson or
            .json), or a folder or glob of them; none = the generated dates.
        valid: held-out pairs (same formats); none = the pairs of data whose source's
            CRC-32 falls in val_fraction of its range. Half of their sources (every other)
            are the test pairs scored at the end, the rest the validation pairs scored while
            training.
        tokenizer: char (one id per character), bpe (a byte-level BPE trained on the train
            pairs with the tokenizers library) or the path of a Hugging Face tokenizer.json;
            other than char needs data.
        vocab_size: the BPE's vocabulary, 259 to 2**20 ids (with tokenizer bpe; none = 2048).
        shared_vocab: one tokenizer for both sides, and shared embeddings.
        val_fraction: the share of data held out when valid is none, in (0, 0.5].
        follow_links: read the links in a data folder that lead outside it (without it they
            are skipped, and named).
        header: a TSV file's first line: auto (a header row when both fields are column
            names such as source and target, or languages; asked when unclear), yes (always
            a header, skipped) or no (always a pair).
    """

    resumable: ClassVar[tuple[str, ...]] = ("eval_size",)

    label_smoothing: float = 0.1
    eval_size: int = 2000
    data: str | None = None
    valid: str | None = None
    tokenizer: str = "char"
    vocab_size: int | None = None
    shared_vocab: bool = False
    val_fraction: float = 0.1
    follow_links: bool = False
    header: Literal["auto", "yes", "no"] = "auto"

    def __post_init__(self) -> None:
        check_probability("label_smoothing", self.label_smoothing)
        check_int("eval_size", self.eval_size, min_value=1)
        check_data_settings(self)


class TranslateTask:
    """Everything the trainer and the CLI need to know about the translation task.

    Args:
        src_tok, tgt_tok: the tokenizers; None takes the data's (the dates' for no data).
        data: the pairs (:func:`~addnorm.tasks.translate_data.pair_data`): a
            :class:`~addnorm.tasks.pair_data.PairData`, a :class:`~addnorm.data.PairCorpus`
            (a user's, read and tokenized), the :class:`~addnorm.data.fingerprint.DataRecord`
            of one (a run read back from its checkpoint: the files are read again, and
            checked unchanged, when training or scoring needs them; translating never does),
            or None: the generated dates.
        max_new_tokens: the longest answer generated (None: the dates' 11, or twice the
            longest target of the data, plus 2).

    Attributes:
        data: the pairs (:class:`~addnorm.tasks.pair_data.PairData`).
    """

    name: ClassVar[str] = "translate"
    description: ClassVar[str] = (
        "date normalization, or your sentence pairs (--data), as translation "
        "(encoder-decoder Transformer)"
    )
    metric: ClassVar[str] = "test_exact_match"
    # The dates' two vocabularies differ, so they never share embeddings; a user's pairs
    # share them with a shared vocabulary.
    owned_fields: ClassVar[frozenset[str]] = frozenset({
        "src_vocab_size", "tgt_vocab_size", "pad_id", "bos_id", "eos_id", "share_embeddings",
    })
    loss_label = "loss (label-smoothed cross-entropy, nats)"

    def __init__(
        self,
        src_tok: TextTokenizer | None = None,
        tgt_tok: TextTokenizer | None = None,
        *,
        data: PairData | PairCorpus | DataRecord | None = None,
        max_new_tokens: int | None = None,
    ) -> None:
        self.data = pair_data(src_tok, tgt_tok, data, max_new_tokens)
        self.src_tok: TextTokenizer = self.data.src_tok
        self.tgt_tok: TextTokenizer = self.data.tgt_tok
        self.max_new_tokens = check_int("max_new_tokens", self.data.max_new_tokens,
                                        min_value=1)

    @property
    def record(self) -> DataRecord | None:
        """The record of a user's pairs; None for the dates."""
        return self.data.record

    @property
    def corpus(self) -> PairCorpus:
        """A user's pairs (read again, and checked unchanged, for a run read back from its
        checkpoint); ValueError for the date task, which has none."""
        return self.data.corpus

    @property
    def shared(self) -> bool:
        """Whether one tokenizer serves both sides (a user's pairs with shared_vocab)."""
        return self.data.shared

    @staticmethod
    def default_model_config() -> TransformerConfig:
        """The "tiny" preset with the seeds' sinusoidal positions, no dropout and an unpadded
        encoder (``unpad``: about half of a batch's source tokens are padding, which it
        leaves out of the encoder's position-wise work); vocabulary sizes filled in by
        ``prepare``."""
        return dataclasses.replace(
            TRANSFORMER_PRESETS["tiny"], dropout=0.0, share_embeddings=False,
            position_encoding="sinusoidal", unpad=True,
        )

    @staticmethod
    def default_train_config() -> TrainConfig:
        """600 steps of 64 examples, a cosine schedule that ends at ``max_steps`` (so a slow
        machine finishes it inside the 4-minute time budget instead of being stopped by the
        clock at a high learning rate)."""
        return TrainConfig(
            max_steps=600,
            max_minutes=4.0,
            batch_size=64,
            lr=3e-3,
            schedule="cosine",
            warmup=100,
            checkpoint_every=250,
            log_every=10,
        )

    @staticmethod
    def default_task_config() -> TranslateTaskConfig:
        """Label smoothing 0.1, the paper's value; 2000 test dates."""
        return TranslateTaskConfig()

    @staticmethod
    def presets() -> Mapping[str, TransformerConfig]:
        """The encoder-decoder's named configs (``TRANSFORMER_PRESETS``)."""
        return TRANSFORMER_PRESETS

    def prepare(self, cfg: TransformerConfig) -> TransformerConfig:
        """``cfg`` with this task's vocabulary sizes and special ids, and
        ``share_embeddings`` set to whether one tokenizer serves both sides (never for the
        dates, whose vocabularies differ; ``tie_output`` still ties the output layer to the
        target embedding)."""
        return dataclasses.replace(
            cfg,
            src_vocab_size=self.src_tok.vocab_size,
            tgt_vocab_size=self.tgt_tok.vocab_size,
            share_embeddings=self.shared,
            pad_id=self.tgt_tok.pad_id,
            bos_id=self.tgt_tok.bos_id,
            eos_id=self.tgt_tok.eos_id,
        )

    def check(
        self, cfg: TransformerConfig, train_cfg: TrainConfig, task_cfg: TranslateTaskConfig
    ) -> None:
        """Raise ValueError if the configs cannot train this task: a learned position table
        must hold the longest input and the decoder's ``<bos>`` + answer + ``<eos>``; a
        user's train pairs must fill a batch; a run that keeps its best or has patience needs
        validation pairs. The pairs of a run read back from a checkpoint must be as recorded
        (``DataChangedError`` otherwise)."""
        self.data.check(cfg, train_cfg.batch_size)
        validates(train_cfg, self.validation(task_cfg))

    def sizing(
        self, cfg: TransformerConfig, train_cfg: TrainConfig, task_cfg: TranslateTaskConfig
    ) -> Sizing:
        """The longest input with its answer; the evaluation translates at most
        ``eval_size`` held-out examples ``PREDICT_BATCH_SIZE`` at a time (the dates refuse
        an ``eval_size`` beyond their distinct test examples: RunSizeError)."""
        return self.data.sizing(task_cfg.eval_size)

    def build_model(self, cfg: TransformerConfig) -> Transformer:
        """A fresh model for ``cfg`` (call ``prepare`` first)."""
        return Transformer(cfg)

    def batches(
        self, cfg: TransformerConfig, train_cfg: TrainConfig, task_cfg: TranslateTaskConfig
    ) -> SampledBatches:
        """The training batch source, seeded by ``train_cfg.seed``."""
        self.check(cfg, train_cfg, task_cfg)
        return self.data.batches(train_cfg.batch_size, train_cfg.seed)

    def loss_fn(self, task_cfg: TranslateTaskConfig) -> LossFn:
        """``(model, batch) -> (loss, n_tokens)`` with the configured label smoothing."""
        smoothing, pad = task_cfg.label_smoothing, self.tgt_tok.pad_id

        def loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, int]:
            return seq2seq_loss(model, batch, label_smoothing=smoothing, pad_id=pad)

        return loss

    def held_out(self, split: str = "test", n: int = 2000) -> list[Example]:
        """``n`` fixed examples of ``split`` dates (the same in every run); for a user's
        pairs, the first ``n`` held-out pairs (whatever ``split``)."""
        return self.data.held_out(split, n)

    @torch.no_grad()
    def predict(
        self, model: Transformer, texts: list[str], *, batch_size: int = PREDICT_BATCH_SIZE
    ) -> list[str]:
        """Greedy translations of ``texts`` (model put in eval mode)."""
        model.eval()
        device = next(model.parameters()).device
        out: list[str] = []
        config = dataclasses.replace(model.generation_config, max_new_tokens=self.max_new_tokens)
        for i in range(0, len(texts), batch_size):
            src = self.src_tok.encode_batch(texts[i : i + batch_size]).to(device)  # (B, S)
            ids = model.generate(src, config)  # (B, N)
            out.extend(self.tgt_tok.decode(row) for row in ids.tolist())
        return out

    def evaluate(self, model: Transformer, *, n: int = 2000) -> dict[str, float]:
        """Exact-match accuracy and the error rates (token, character, word, sequence:
        :func:`~addnorm.tasks.text_metrics.sequence_error_rates`) on ``n`` held-out test
        examples (and on a quarter as many validation dates); for a user's pairs, on at most
        ``n`` held-out pairs, with their chrF when sacrebleu is installed."""
        metrics: dict[str, float] = {}
        for split, examples in self.data.evaluation_sets(n):
            predictions = self.predict(model, [e.source for e in examples])
            metrics.update(self.data.scores(split, predictions, [e.target for e in examples]))
        return metrics

    def probe(self, task_cfg: TranslateTaskConfig) -> None:
        """No probe during training: the held-out figures come at the end (and the loss
        curve shows the way there)."""
        return None

    def evaluate_run(self, model: Transformer, task_cfg: TranslateTaskConfig) -> dict[str, float]:
        """The held-out figures of a finished run (``evaluate`` with ``eval_size``)."""
        return self.evaluate(model, n=task_cfg.eval_size)

    def validation(self, task_cfg: TranslateTaskConfig) -> Validation:
        """While training: exact match (``val_exact_match``, higher is better; with the
        data's other figures) on a quarter of ``eval_size`` validation examples: the dates'
        validation split (the validation figures ``evaluate`` reports), or a user's
        validation pairs (:class:`~addnorm.tasks.translate_data.UserPairs`), never the test
        pairs. A run on a user's pairs keeps its best by default."""
        examples = self.held_out("val", max(task_cfg.eval_size // 4, 1))
        sources, answers = [e.source for e in examples], [e.target for e in examples]

        def score(model: nn.Module) -> dict[str, float]:
            predictions = self.predict(cast(Transformer, model), sources)
            return self.data.scores("val", predictions, answers)

        unavailable = None if examples else (
            "the held-out pairs have one source, all of it test pairs; add pairs, raise "
            "val_fraction or give a valid file")
        return Validation("val_exact_match", higher_is_better=True, score=score,
                          keep_by_default=self.data.record is not None, unavailable=unavailable)

    def run_samples(self, model: Transformer) -> list[dict[str, str]]:
        """A few held-out test inputs with the model's predictions and the answers."""
        examples = self.held_out("test", _N_SAMPLES)
        predictions = self.predict(model, [e.source for e in examples])
        return [
            {"input": e.source, "prediction": p, "answer": e.target}
            for e, p in zip(examples, predictions, strict=True)
        ]

    @staticmethod
    def samples_text(samples: list[dict[str, Any]]) -> str:
        """Nothing: ``addnorm translate`` shows the model at work."""
        return ""

    @staticmethod
    def figures_text(metrics: Mapping[str, Any]) -> str:
        """The test split's error rates (and chrF, where scored) under the headline exact
        match; nothing for figures a run lacks."""
        lines = [f"test_{key}: {metrics[f'test_{key}']:{form}} ({what})"
                 for key, form, what in _FIGURES if f"test_{key}" in metrics]
        return "".join(line + "\n" for line in lines)

    def source_alphabet(self) -> frozenset[str] | None:
        """The characters an input may hold (a character tokenizer's), or None: any text
        encodes (a BPE or a tokenizer.json)."""
        return frozenset(self.src_tok.chars) if isinstance(self.src_tok, CharTokenizer) else None

    def input_problem(self, text: str, max_len: int) -> str | None:
        """Why the model cannot take ``text`` beyond its characters (``addnorm translate``
        checks those): more tokens than ``max_len``; None if it can."""
        if isinstance(self.src_tok, CharTokenizer) or not text.strip():
            return None
        n = len(self.src_tok.encode(text))
        if n <= max_len:
            return None
        return f"{n} tokens; the model takes at most {max_len} (its max_len)"

    def answer_problem(self, answer: str) -> str | None:
        """Why an answer is wrong on its face: for the date task, not a real date from
        ``FIRST_YEAR`` to ``LAST_YEAR``; None otherwise (a user's pairs: any answer)."""
        return self.data.answer_problem(answer)

    @classmethod
    def from_config(cls, task_cfg: TranslateTaskConfig) -> TranslateTask:
        """The task a new run trains: the pairs ``task_cfg`` names
        (:func:`~addnorm.tasks.translate_data.pair_data_for`)."""
        return cls(data=pair_data_for(task_cfg))

    @staticmethod
    def config_from_dict(data: dict) -> TransformerConfig:
        """The model config saved by ``TransformerConfig.to_dict``."""
        return TransformerConfig.from_dict(data)

    def to_dict(self) -> dict:
        """What a checkpoint needs to rebuild this task: its tokenizers and, for a user's
        pairs, the record of the data and the longest answer it generates."""
        return self.data.to_dict()

    @classmethod
    def from_dict(cls, data: dict) -> TranslateTask:
        """Rebuild from ``to_dict``'s output."""
        return cls(data=pair_data_from_dict(data))

    def run_files(self) -> dict[str, str]:
        """For a user's pairs: ``data.json`` (the data's record) and the tokenizers of a BPE
        or a file (``tokenizer.json`` when shared, else ``source_tokenizer.json`` and
        ``target_tokenizer.json``); nothing for the dates."""
        return self.data.run_files()
