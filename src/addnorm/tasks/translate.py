"""The ``translate`` task: date normalization on the encoder-decoder ``Transformer``, or a
user's sentence pairs (``TranslateTaskConfig.data``: TSV or JSON Lines; see
:class:`addnorm.data.PairCorpus`).

Dates: the source is a date as people write it, character by character
(``date_source_tokenizer``); the target its ISO 8601 form ``YYYY-MM-DD``
(``date_target_tokenizer``). A user's pairs: the tokenizers the config asks for (characters,
a byte-level BPE or a ``tokenizer.json``, per side or shared), trained on the train pairs.
Training teaches with ``<bos>`` + answer in and answer + ``<eos>`` out; evaluation decodes
greedily with the model's ``generate`` and counts exact matches on held-out pairs (test-split
dates; a user's held-out pairs, where chrF (sacrebleu's, 0-100) is also reported when
``sacrebleu`` is installed: the ``text`` extra).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging
import random
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from addnorm.data.batches import DateBatches
from addnorm.data.dates import (
    FIRST_YEAR,
    FORMATS,
    LAST_YEAR,
    dates_in_split,
    longest_source_length,
    random_examples,
)
from addnorm.data.fingerprint import DataRecord
from addnorm.data.hf_tokenizer import HFTokenizer, TextTokenizer, tokenizer_from_dict
from addnorm.data.pairs import PairBatches, PairCorpus
from addnorm.data.tokenizers import CharTokenizer, date_source_tokenizer, date_target_tokenizer
from addnorm.tasks.data_settings import check_data_settings
from addnorm.tasks.task import Sizing, TaskConfig
from addnorm.training.config import TrainConfig
from addnorm.training.sizes import RunSizeError
from addnorm.training.trainer import LossFn
from addnorm.transformer import Transformer
from addnorm.transformer.config import TRANSFORMER_PRESETS, TransformerConfig
from addnorm.utils.checks import check_int, check_probability

__all__ = [
    "PREDICT_BATCH_SIZE", "Example", "TranslateTask", "TranslateTaskConfig", "seq2seq_loss",
]

# Answers are 10 characters; one more step emits <eos>.
_MAX_NEW_TOKENS = 11
_EVAL_SEED = 20261121
# Held-out predictions stored in metrics.json.
_N_SAMPLES = 8
# Inputs translated per forward pass (also what ``addnorm translate`` reads at a time).
PREDICT_BATCH_SIZE = 500
_log = logging.getLogger(__name__)


class Example(NamedTuple):
    """A source text and its answer (a date example, or a user's held-out pair)."""

    source: str
    target: str


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
            validation dates), or at most this many of your held-out pairs.
        data: your sentence pairs to train on: a TSV file (source<TAB>target a line) or
            JSON Lines ({"source": ..., "target": ...} a line; named .jsonl, .ndjson or
            .json), or a folder or glob of them; none = the generated dates.
        valid: held-out pairs (same formats) scored at the end; none = the pairs of data
            whose source's CRC-32 falls in val_fraction of its range.
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
        data: the pairs: a :class:`~addnorm.data.PairCorpus` (a user's, read and tokenized),
            the :class:`~addnorm.data.fingerprint.DataRecord` of one (a run read back from
            its checkpoint: the files are read again, and checked unchanged, when training or
            scoring needs them; translating never does), or None: the generated dates.
        max_new_tokens: the longest answer generated (None: the dates' 11, or twice the
            longest target of the data, plus 2).
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
        data: PairCorpus | DataRecord | None = None,
        max_new_tokens: int | None = None,
    ) -> None:
        self._corpus: PairCorpus | None = None
        self.record: DataRecord | None = None
        if isinstance(data, PairCorpus):
            self._corpus, self.record = data, data.record
            src_tok, tgt_tok = src_tok or data.src_tok, tgt_tok or data.tgt_tok
        elif isinstance(data, DataRecord):
            if src_tok is None or tgt_tok is None:
                raise TypeError("a DataRecord needs the tokenizers it was encoded with")
            self.record = data
        elif data is not None:
            raise TypeError(f"data must be a PairCorpus, a DataRecord or None, got {data!r}")
        self.src_tok: TextTokenizer = src_tok or date_source_tokenizer()
        self.tgt_tok: TextTokenizer = tgt_tok or date_target_tokenizer()
        if max_new_tokens is None:
            max_new_tokens = _MAX_NEW_TOKENS if self._corpus is None else (
                2 * self._corpus.longest_target + 2
            )
        self.max_new_tokens = check_int("max_new_tokens", max_new_tokens, min_value=1)

    @property
    def corpus(self) -> PairCorpus:
        """A user's pairs (read again, and checked unchanged, for a run read back from its
        checkpoint); ValueError for the date task, which has none."""
        if self._corpus is None:
            if self.record is None:
                raise ValueError("the date task has no pairs corpus")
            self._corpus = PairCorpus.reopen(self.record, self.src_tok, self.tgt_tok)
        return self._corpus

    @property
    def shared(self) -> bool:
        """Whether one tokenizer serves both sides (a user's pairs with shared_vocab)."""
        return self.record is not None and self.src_tok is self.tgt_tok

    @staticmethod
    def default_model_config() -> TransformerConfig:
        """The "tiny" preset with the seeds' sinusoidal positions, no dropout and an unpadded
        encoder (vocabulary sizes filled in by ``prepare``).

        Sinusoidal, as the seed documents teach: with the default training settings (600
        steps), seeds 0, 1, 2 reached 99.65, 99.70 and 99.25% held-out test exact match
        (``position_encoding="rotary"``: 99.90, 99.70, 99.85%), every one above the 99% bar,
        and a sinusoidal step does less work than a rotary one. About half of a batch's source
        tokens are padding, which ``unpad`` leaves out of the encoder's position-wise work
        (the same values at every real token)."""
        return dataclasses.replace(
            TRANSFORMER_PRESETS["tiny"], dropout=0.0, share_embeddings=False,
            position_encoding="sinusoidal", unpad=True,
        )

    @staticmethod
    def default_train_config() -> TrainConfig:
        """Settings that reach >= 98% exact match within the default time budget on 2 cores.

        600 steps of 64 examples reached 99.80-99.90% (seed 0) and 99.65% (seed 1) held-out
        test exact match in our runs (800 steps: 99.95%); the loss reaches its floor by about
        step 300. The cosine schedule ends at ``max_steps``, so a short step budget lets a
        slow machine finish it well inside the 4-minute time budget instead of being stopped
        by the clock at a high learning rate (``addnorm bench --only small`` times one step).
        """
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
        """Label smoothing 0.1, the paper's value (it also helped here); 2000 test dates."""
        return TranslateTaskConfig()

    @staticmethod
    def presets() -> Mapping[str, TransformerConfig]:
        """The encoder-decoder's named configs (``TRANSFORMER_PRESETS``)."""
        return TRANSFORMER_PRESETS

    def prepare(self, cfg: TransformerConfig) -> TransformerConfig:
        """``cfg`` with this task's vocabulary sizes and special ids.

        The source and target vocabularies differ, so embeddings are never shared here
        (``share_embeddings`` is set to False; ``tie_output`` still ties the output layer to
        the target embedding).
        """
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
        user's train pairs must fill a batch. The pairs of a run read back from a checkpoint
        must be as recorded (``DataChangedError`` otherwise)."""
        if self.record is not None:
            corpus = self.corpus
            if cfg.position_encoding == "learned":
                needed = max(corpus.longest_source, corpus.longest_target + 2)
                if cfg.max_len < needed:
                    raise ValueError(
                        f"max_len ({cfg.max_len}) must be >= {needed} with learned positions "
                        f"(the longest source has {corpus.longest_source} tokens, the longest "
                        f"target {corpus.longest_target + 2} with <bos> and <eos>)"
                    )
            if len(corpus.train) < train_cfg.batch_size:
                raise ValueError(
                    f"the train split holds {len(corpus.train)} pairs, fewer than a batch "
                    f"(batch_size {train_cfg.batch_size})"
                )
            return
        if cfg.position_encoding == "learned":
            needed = max(longest_source_length(), _MAX_NEW_TOKENS + 1)
            if cfg.max_len < needed:
                raise ValueError(
                    f"max_len ({cfg.max_len}) must be >= {needed} with learned positions "
                    f"(the longest date input has {longest_source_length()} characters, "
                    f"the answer {_MAX_NEW_TOKENS + 1} tokens with <bos> and <eos>)"
                )

    def sizing(
        self, cfg: TransformerConfig, train_cfg: TrainConfig, task_cfg: TranslateTaskConfig
    ) -> Sizing:
        """The longest date with its answer; the evaluation translates ``eval_size`` dates
        ``PREDICT_BATCH_SIZE`` at a time. ``eval_size`` may not pass the distinct (test
        date, format) pairs it is drawn from (more would only repeat them): RunSizeError.
        A user's pairs: the longest source and target, and at most ``eval_size`` held-out
        pairs at a time."""
        if self.record is not None:
            corpus = self.corpus
            return Sizing(
                length=corpus.longest_source + corpus.longest_target + 2,
                eval_batch=min(task_cfg.eval_size, len(corpus.held_out), PREDICT_BATCH_SIZE),
            )
        distinct = len(dates_in_split("test")) * len(FORMATS)
        if task_cfg.eval_size > distinct:
            raise RunSizeError(
                "eval_size",
                task_cfg.eval_size,
                f"the translate task has {distinct} distinct test examples "
                f"({len(dates_in_split('test'))} dates in {len(FORMATS)} formats); ask for at "
                "most that many",
            )
        return Sizing(
            length=longest_source_length() + 12,
            eval_batch=min(task_cfg.eval_size, PREDICT_BATCH_SIZE),
        )

    def build_model(self, cfg: TransformerConfig) -> Transformer:
        """A fresh model for ``cfg`` (call ``prepare`` first)."""
        return Transformer(cfg)

    def batches(
        self, cfg: TransformerConfig, train_cfg: TrainConfig, task_cfg: TranslateTaskConfig
    ) -> DateBatches | PairBatches:
        """The training batch source, seeded by ``train_cfg.seed``."""
        if self.record is not None:
            self.check(cfg, train_cfg, task_cfg)
            return PairBatches(self.corpus, batch_size=train_cfg.batch_size, seed=train_cfg.seed)
        return DateBatches(
            self.src_tok, self.tgt_tok, batch_size=train_cfg.batch_size, seed=train_cfg.seed
        )

    def loss_fn(self, task_cfg: TranslateTaskConfig) -> LossFn:
        """``(model, batch) -> (loss, n_tokens)`` with the configured label smoothing."""
        smoothing, pad = task_cfg.label_smoothing, self.tgt_tok.pad_id

        def loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, int]:
            return seq2seq_loss(model, batch, label_smoothing=smoothing, pad_id=pad)

        return loss

    def held_out(self, split: str = "test", n: int = 2000) -> list[Example]:
        """``n`` fixed examples of ``split`` dates (the same in every run); for a user's
        pairs, the first ``n`` held-out pairs (whatever ``split``)."""
        if self.record is not None:
            return [Example(*p) for p in self.corpus.held_out[:n]]
        return [Example(*e) for e in
                random_examples(dates_in_split(split), random.Random(_EVAL_SEED), n)]

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
        """Exact-match accuracy on ``n`` held-out test examples (and on validation ones); for
        a user's pairs, on at most ``n`` held-out pairs, with their chrF when sacrebleu is
        installed."""
        if self.record is not None:
            return self._evaluate_pairs(model, n)
        metrics = {}
        for split in ("val", "test"):
            examples = self.held_out(split, n if split == "test" else max(n // 4, 1))
            predictions = self.predict(model, [e.source for e in examples])
            hits = sum(p == e.target for p, e in zip(predictions, examples, strict=True))
            metrics[f"{split}_exact_match"] = hits / len(examples)
            metrics[f"n_{split}"] = len(examples)
        return metrics

    def _evaluate_pairs(self, model: Transformer, n: int) -> dict[str, float]:
        examples = self.held_out("test", n)
        predictions = self.predict(model, [e.source for e in examples])
        answers = [e.target for e in examples]
        hits = sum(p == a for p, a in zip(predictions, answers, strict=True))
        metrics = {"test_exact_match": hits / len(examples), "n_test": len(examples)}
        try:
            from sacrebleu.metrics import CHRF
        except ImportError:
            _log.warning("chrF left out: it needs sacrebleu (pip install 'addnorm[text]')")
        else:
            metrics["test_chrf"] = float(CHRF().corpus_score(predictions, [answers]).score)
        return metrics

    def probe(self, task_cfg: TranslateTaskConfig) -> None:
        """No probe during training: the held-out figures come at the end (and the loss
        curve shows the way there)."""
        return None

    def evaluate_run(self, model: Transformer, task_cfg: TranslateTaskConfig) -> dict[str, float]:
        """The held-out figures of a finished run (``evaluate`` with ``eval_size``)."""
        return self.evaluate(model, n=task_cfg.eval_size)

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
        if self.record is not None or _is_supported_date(answer):
            return None
        return f"not a valid date from {FIRST_YEAR} to {LAST_YEAR}"

    @classmethod
    def from_config(cls, task_cfg: TranslateTaskConfig) -> TranslateTask:
        """The task a new run trains: the dates, or ``task_cfg.data`` read and tokenized as
        it asks (:meth:`PairCorpus.build`)."""
        if task_cfg.data is None:
            return cls()
        corpus = PairCorpus.build(
            task_cfg.data,
            valid=task_cfg.valid,
            tokenizer=task_cfg.tokenizer,
            vocab_size=task_cfg.vocab_size,
            shared_vocab=task_cfg.shared_vocab,
            val_fraction=task_cfg.val_fraction,
            follow_links=task_cfg.follow_links,
            header=task_cfg.header,
        )
        return cls(data=corpus)

    @staticmethod
    def config_from_dict(data: dict) -> TransformerConfig:
        """The model config saved by ``TransformerConfig.to_dict``."""
        return TransformerConfig.from_dict(data)

    def to_dict(self) -> dict:
        """What a checkpoint needs to rebuild this task: its tokenizers and, for a user's
        pairs, the record of the data and the longest answer it generates."""
        out: dict[str, Any] = {
            "src_tokenizer": self.src_tok.to_dict(), "tgt_tokenizer": self.tgt_tok.to_dict()
        }
        if self.record is not None:
            out.update(data=self.record.to_dict(), max_new_tokens=self.max_new_tokens,
                       shared_vocab=self.shared)
        return out

    @classmethod
    def from_dict(cls, data: dict) -> TranslateTask:
        """Rebuild from ``to_dict``'s output."""
        src_tok = tokenizer_from_dict(data["src_tokenizer"])
        tgt_tok = src_tok if data.get("shared_vocab") else tokenizer_from_dict(
            data["tgt_tokenizer"]
        )
        if data.get("data") is None:
            return cls(src_tok, tgt_tok)
        return cls(src_tok, tgt_tok, data=DataRecord.from_dict(data["data"]),
                   max_new_tokens=data["max_new_tokens"])

    def run_files(self) -> dict[str, str]:
        """For a user's pairs: ``data.json`` (the data's record) and the tokenizers of a BPE
        or a file (``tokenizer.json`` when shared, else ``source_tokenizer.json`` and
        ``target_tokenizer.json``); nothing for the dates."""
        if self.record is None:
            return {}
        files = {"data.json": json.dumps(self.record.to_dict(), indent=1) + "\n"}
        if self.shared and isinstance(self.src_tok, HFTokenizer):
            files["tokenizer.json"] = self.src_tok.to_json()
        elif not self.shared:
            for name, tok in (("source", self.src_tok), ("target", self.tgt_tok)):
                if isinstance(tok, HFTokenizer):
                    files[f"{name}_tokenizer.json"] = tok.to_json()
        return files


def _is_supported_date(answer: str) -> bool:
    """Whether ``answer`` is a real YYYY-MM-DD date from ``FIRST_YEAR`` to ``LAST_YEAR``."""
    if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", answer):
        return False
    try:
        day = dt.date.fromisoformat(answer)
    except ValueError:
        return False
    return FIRST_YEAR <= day.year <= LAST_YEAR
