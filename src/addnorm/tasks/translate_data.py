"""The ``translate`` task's pairs, of two kinds: :class:`BundledDates` (dates as people write
them, and their ISO 8601 answers, generated) and :class:`UserPairs` (a user's sentence pairs, a
:class:`~addnorm.data.PairCorpus`, or the record of one, read again when training or scoring
needs it). What the task needs of either (``PairData``) and their scores:
:mod:`addnorm.tasks.pair_data`.

:func:`pair_data` makes the pairs a ``TranslateTask`` is given, :func:`pair_data_for` the
pairs a task config names and :func:`pair_data_from_dict` the pairs a checkpoint saved.
"""

from __future__ import annotations

import datetime as dt
import logging
import random
import re
from typing import Any

from addnorm.data.batches import DateBatches
from addnorm.data.dates import (
    FIRST_YEAR,
    FORMATS,
    LAST_YEAR,
    DateExamples,
    dates_in_split,
    longest_source_length,
    random_examples,
)
from addnorm.data.fingerprint import DataRecord
from addnorm.data.hf_tokenizer import HFTokenizer, TextTokenizer, tokenizer_from_dict
from addnorm.data.pairs import PairBatches, PairCorpus
from addnorm.data.tokenizers import date_source_tokenizer, date_target_tokenizer
from addnorm.tasks.data_source import is_data_source, record_files
from addnorm.tasks.pair_data import Example, PairData, answer_scores
from addnorm.tasks.task import Sizing
from addnorm.training.sizes import RunSizeError
from addnorm.transformer.config import TransformerConfig
from addnorm.utils.checks import check_choice

__all__ = [
    "PREDICT_BATCH_SIZE",
    "BundledDates",
    "UserPairs",
    "pair_data",
    "pair_data_for",
    "pair_data_from_dict",
]

# Answers are 10 characters; one more step emits <eos>.
_MAX_NEW_TOKENS = 11
_EVAL_SEED = 20261121
# Inputs translated per forward pass (also what ``addnorm translate`` reads at a time).
PREDICT_BATCH_SIZE = 500
_log = logging.getLogger(__name__)


class BundledDates:
    """Date normalization: the source is a date as people write it, character by character
    (:func:`~addnorm.data.tokenizers.date_source_tokenizer`), the target its ISO 8601 form
    ``YYYY-MM-DD`` (:func:`~addnorm.data.tokenizers.date_target_tokenizer`); train,
    validation and test dates apart (:mod:`addnorm.data.dates`).

    Args:
        src_tok, tgt_tok: the tokenizers (a checkpoint's); None: the dates' own.
        max_new_tokens: the longest answer generated; None: 11 (10 characters and ``<eos>``).
    """

    record = None
    shared = False

    def __init__(self, src_tok: TextTokenizer | None = None,
                 tgt_tok: TextTokenizer | None = None, *,
                 max_new_tokens: int | None = None) -> None:
        self.src_tok: TextTokenizer = src_tok or date_source_tokenizer()
        self.tgt_tok: TextTokenizer = tgt_tok or date_target_tokenizer()
        self.max_new_tokens = _MAX_NEW_TOKENS if max_new_tokens is None else max_new_tokens

    @property
    def corpus(self) -> PairCorpus:
        """None to give: ValueError."""
        raise ValueError("the date task has no pairs corpus")

    def train_size(self) -> int:
        """The distinct train examples: train dates times formats and cases."""
        return len(DateExamples("train"))

    def check(self, cfg: TransformerConfig, batch_size: int) -> None:
        """A learned position table must hold the longest date and ``<bos>`` + answer +
        ``<eos>``."""
        if cfg.position_encoding == "learned":
            needed = max(longest_source_length(), _MAX_NEW_TOKENS + 1)
            if cfg.max_len < needed:
                raise ValueError(
                    f"max_len ({cfg.max_len}) must be >= {needed} with learned positions "
                    f"(the longest date input has {longest_source_length()} characters, "
                    f"the answer {_MAX_NEW_TOKENS + 1} tokens with <bos> and <eos>)"
                )

    def sizing(self, eval_size: int) -> Sizing:
        """The longest date with its answer; the evaluation translates ``eval_size`` dates
        ``PREDICT_BATCH_SIZE`` at a time. ``eval_size`` may not pass the distinct (test
        date, format) pairs it is drawn from (more would only repeat them): RunSizeError."""
        distinct = len(dates_in_split("test")) * len(FORMATS)
        if eval_size > distinct:
            raise RunSizeError(
                "eval_size",
                eval_size,
                f"the translate task has {distinct} distinct test examples "
                f"({len(dates_in_split('test'))} dates in {len(FORMATS)} formats); ask for at "
                "most that many",
            )
        return Sizing(length=longest_source_length() + 12,
                      eval_batch=min(eval_size, PREDICT_BATCH_SIZE))

    def batches(self, batch_size: int, seed: int) -> DateBatches:
        """Train dates, each in a random format (:class:`~addnorm.data.DateBatches`)."""
        return DateBatches(self.src_tok, self.tgt_tok, batch_size=batch_size, seed=seed)

    def held_out(self, split: str, n: int) -> list[Example]:
        """``n`` fixed examples of ``split`` dates (the same in every run)."""
        return [Example(*e) for e in
                random_examples(dates_in_split(split), random.Random(_EVAL_SEED), n)]

    def evaluation_sets(self, n: int) -> list[tuple[str, list[Example]]]:
        """A quarter of ``n`` validation dates, and ``n`` test dates."""
        return [(split, self.held_out(split, n if split == "test" else max(n // 4, 1)))
                for split in ("val", "test")]

    def scores(self, split: str, predictions: list[str], answers: list[str]
               ) -> dict[str, float]:
        """Exact match and the error rates (:func:`~addnorm.tasks.pair_data.answer_scores`;
        the tokens are characters)."""
        return answer_scores(split, predictions, answers, self.tgt_tok)

    def answer_problem(self, answer: str) -> str | None:
        """Not a real date from ``FIRST_YEAR`` to ``LAST_YEAR``; None if it is one."""
        if _is_supported_date(answer):
            return None
        return f"not a valid date from {FIRST_YEAR} to {LAST_YEAR}"

    def to_dict(self) -> dict:
        """The tokenizers."""
        return {"src_tokenizer": self.src_tok.to_dict(), "tgt_tokenizer": self.tgt_tok.to_dict()}

    def run_files(self) -> dict[str, str]:
        """None: the dates are generated."""
        return {}


class UserPairs:
    """A user's sentence pairs (:class:`~addnorm.data.PairCorpus`).

    Its held-out pairs are halved by source: the distinct sources in the order they first
    appear go alternately to the test pairs (the first, third, ...: scored at the end) and
    the validation pairs (scored while training, to keep the best), so every pair of a
    source is on one side and the test figures never score the pairs a best was chosen by.

    Args:
        src_tok, tgt_tok: the tokenizers (the same object when shared).
        record: the record of the files.
        corpus: the pairs, if already read; None reads ``record``'s files (checked
            unchanged) on first use.
        max_new_tokens: the longest answer generated; None: twice the corpus's longest
            target, plus 2 (11 with no corpus at hand).
    """

    def __init__(self, src_tok: TextTokenizer, tgt_tok: TextTokenizer, record: DataRecord, *,
                 corpus: PairCorpus | None = None, max_new_tokens: int | None = None) -> None:
        self.src_tok, self.tgt_tok, self.record = src_tok, tgt_tok, record
        self.shared = src_tok is tgt_tok
        self._corpus = corpus
        if max_new_tokens is None:
            max_new_tokens = _MAX_NEW_TOKENS if corpus is None else 2 * corpus.longest_target + 2
        self.max_new_tokens = max_new_tokens
        self._halves: dict[str, list[Example]] | None = None  # the held-out pairs, by split

    @property
    def corpus(self) -> PairCorpus:
        """The pairs (the recorded files read again, and checked unchanged, on first use)."""
        if self._corpus is None:
            self._corpus = PairCorpus.reopen(self.record, self.src_tok, self.tgt_tok)
        return self._corpus

    def train_size(self) -> int:
        """The train pairs."""
        return len(self.corpus.train)

    def check(self, cfg: TransformerConfig, batch_size: int) -> None:
        """A learned position table must hold the longest source and ``<bos>`` + target +
        ``<eos>``; the train pairs must fill a batch. The files of a run read back from a
        checkpoint must be as recorded (``DataChangedError`` otherwise)."""
        corpus = self.corpus
        if cfg.position_encoding == "learned":
            needed = max(corpus.longest_source, corpus.longest_target + 2)
            if cfg.max_len < needed:
                raise ValueError(
                    f"max_len ({cfg.max_len}) must be >= {needed} with learned positions "
                    f"(the longest source has {corpus.longest_source} tokens, the longest "
                    f"target {corpus.longest_target + 2} with <bos> and <eos>)"
                )
        if len(corpus.train) < batch_size:
            raise ValueError(
                f"the train split holds {len(corpus.train)} pairs, fewer than a batch "
                f"(batch_size {batch_size})"
            )

    def sizing(self, eval_size: int) -> Sizing:
        """The longest source and target, and at most ``eval_size`` held-out pairs at a
        time."""
        corpus = self.corpus
        return Sizing(
            length=corpus.longest_source + corpus.longest_target + 2,
            eval_batch=min(eval_size, len(corpus.held_out), PREDICT_BATCH_SIZE),
        )

    def batches(self, batch_size: int, seed: int) -> PairBatches:
        """Random train pairs (:class:`~addnorm.data.PairBatches`)."""
        return PairBatches(self.corpus, batch_size=batch_size, seed=seed)

    def held_out(self, split: str, n: int) -> list[Example]:
        """The first ``n`` held-out pairs of ``split``: "test" or "val" (the class
        docstring; "val" is empty when the held-out pairs have one source)."""
        check_choice("split", split, ("test", "val"))
        if self._halves is None:
            sources: dict[str, int] = {}
            for pair in self.corpus.held_out:
                sources.setdefault(pair.source, len(sources))
            self._halves = {
                "test": [Example(*p) for p in self.corpus.held_out if sources[p.source] % 2 == 0],
                "val": [Example(*p) for p in self.corpus.held_out if sources[p.source] % 2 == 1],
            }
        return self._halves[split][:n]

    def evaluation_sets(self, n: int) -> list[tuple[str, list[Example]]]:
        """At most ``n`` held-out test pairs."""
        return [("test", self.held_out("test", n))]

    def scores(self, split: str, predictions: list[str], answers: list[str]
               ) -> dict[str, float]:
        """Exact match and the error rates (:func:`~addnorm.tasks.pair_data.answer_scores`),
        and sacrebleu's chrF (0-100) when sacrebleu is installed (the ``text`` extra)."""
        metrics = answer_scores(split, predictions, answers, self.tgt_tok)
        try:
            from sacrebleu.metrics import CHRF
        except ImportError:
            _log.warning("chrF left out: it needs sacrebleu (pip install 'addnorm[text]')")
        else:
            metrics[f"{split}_chrf"] = float(CHRF().corpus_score(predictions, [answers]).score)
        return metrics

    def answer_problem(self, answer: str) -> str | None:
        """None: any answer may be right."""
        return None

    def to_dict(self) -> dict:
        """The tokenizers, the record, the longest answer and whether one tokenizer is
        shared."""
        return {"src_tokenizer": self.src_tok.to_dict(), "tgt_tokenizer": self.tgt_tok.to_dict(),
                "data": self.record.to_dict(), "max_new_tokens": self.max_new_tokens,
                "shared_vocab": self.shared}

    def run_files(self) -> dict[str, str]:
        """``data.json`` (the record) and the tokenizers of a BPE or a file
        (``tokenizer.json`` when shared, else ``source_tokenizer.json`` and
        ``target_tokenizer.json``)."""
        files = record_files(self.record)
        if self.shared and isinstance(self.src_tok, HFTokenizer):
            files["tokenizer.json"] = self.src_tok.to_json()
        elif not self.shared:
            for name, tok in (("source", self.src_tok), ("target", self.tgt_tok)):
                if isinstance(tok, HFTokenizer):
                    files[f"{name}_tokenizer.json"] = tok.to_json()
        return files


def pair_data(
    src_tok: TextTokenizer | None = None,
    tgt_tok: TextTokenizer | None = None,
    data: PairData | PairCorpus | DataRecord | None = None,
    max_new_tokens: int | None = None,
) -> PairData:
    """The pairs ``TranslateTask(src_tok, tgt_tok, data=data, max_new_tokens=...)`` trains
    on: ``data`` itself (a :class:`PairData`), a :class:`~addnorm.data.PairCorpus`
    (tokenizers None: its own), the :class:`~addnorm.data.fingerprint.DataRecord` of one
    (with the tokenizers it was encoded with), or None: the dates."""
    if data is None:
        return BundledDates(src_tok, tgt_tok, max_new_tokens=max_new_tokens)
    if isinstance(data, PairCorpus):
        return UserPairs(src_tok or data.src_tok, tgt_tok or data.tgt_tok, data.record,
                         corpus=data, max_new_tokens=max_new_tokens)
    if isinstance(data, DataRecord):
        if src_tok is None or tgt_tok is None:
            raise TypeError("a DataRecord needs the tokenizers it was encoded with")
        return UserPairs(src_tok, tgt_tok, data, max_new_tokens=max_new_tokens)
    if is_data_source(data):
        if (src_tok, tgt_tok, max_new_tokens) != (None, None, None):
            raise TypeError("a PairData carries its own tokenizers and max_new_tokens")
        return data
    raise TypeError(f"data must be a PairCorpus, a DataRecord or None, got {data!r}")


def pair_data_for(task_cfg: Any) -> PairData:
    """The pairs a ``TranslateTaskConfig`` names: the dates, or its ``data`` read and
    tokenized as it asks (:meth:`PairCorpus.build`)."""
    if task_cfg.data is None:
        return BundledDates()
    return pair_data(data=PairCorpus.build(
        task_cfg.data,
        valid=task_cfg.valid,
        tokenizer=task_cfg.tokenizer,
        vocab_size=task_cfg.vocab_size,
        shared_vocab=task_cfg.shared_vocab,
        val_fraction=task_cfg.val_fraction,
        follow_links=task_cfg.follow_links,
        header=task_cfg.header,
    ))


def pair_data_from_dict(data: dict) -> PairData:
    """The pairs a checkpoint's task data names (``to_dict``'s output)."""
    src_tok = tokenizer_from_dict(data["src_tokenizer"])
    tgt_tok = src_tok if data.get("shared_vocab") else tokenizer_from_dict(
        data["tgt_tokenizer"]
    )
    if data.get("data") is None:
        return pair_data(src_tok, tgt_tok)
    return pair_data(src_tok, tgt_tok, DataRecord.from_dict(data["data"]),
                     data["max_new_tokens"])


def _is_supported_date(answer: str) -> bool:
    """Whether ``answer`` is a real YYYY-MM-DD date from ``FIRST_YEAR`` to ``LAST_YEAR``."""
    if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", answer):
        return False
    try:
        day = dt.date.fromisoformat(answer)
    except ValueError:
        return False
    return FIRST_YEAR <= day.year <= LAST_YEAR

