"""The ``lm`` task's text: :class:`TextData`, what the task needs of it, and its two kinds:
:class:`BundledText` (the pydoc topics, by character) and :class:`UserText` (a user's files
tokenized into a :class:`~addnorm.data.TokenCorpus`, or the record of one, opened again when
training or scoring needs it).

:func:`text_data` makes the text an ``LMTask`` is given, :func:`text_data_for` the text a
task config names and :func:`text_data_from_dict` the text a checkpoint saved.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import torch

from addnorm.data.fingerprint import DataRecord
from addnorm.data.hf_tokenizer import HFTokenizer, TextTokenizer, tokenizer_from_dict
from addnorm.data.text import TextCorpus
from addnorm.data.token_corpus import TokenCorpus
from addnorm.data.tokenizers import SPECIALS, CharTokenizer
from addnorm.tasks.data_source import DataSource, is_data_source, record_files

__all__ = [
    "SAMPLE_PROMPTS",
    "BundledText",
    "TextData",
    "UserText",
    "text_data",
    "text_data_for",
    "text_data_from_dict",
]

SAMPLE_PROMPTS = ("The ", "def ", "class ")


class TextData(DataSource, Protocol):
    """The text a language model trains on.

    Attributes:
        tokenizer: what turns it into ids.
        unit: what its ids are called in messages ("characters", "tokens").
    """

    tokenizer: TextTokenizer
    unit: str

    def corpus(self, cache_dir: str | None = None) -> TextCorpus | TokenCorpus:
        """The ids of its train and validation splits, opened on first use (a user's token
        file in ``cache_dir``; inference from a checkpoint never needs them)."""
        ...

    def prompts(self) -> tuple[str, ...]:
        """The starts the samples of a finished run continue."""
        ...

    def scores(self, nats: float, count: int, windows: torch.Tensor) -> dict[str, float]:
        """The held-out figures of ``nats`` (summed cross-entropy) over ``count`` targets,
        the last ``count`` ids of ``windows`` (N, L + 1) without their first column."""
        ...


class BundledText:
    """The pydoc topics (:class:`~addnorm.data.text.TextCorpus`), one id per character.

    Args:
        tokenizer: its tokenizer (a checkpoint's); None builds it from the text.
        prompts: the sample prompts; None: ``SAMPLE_PROMPTS``.
    """

    record = None
    unit = "characters"

    def __init__(self, tokenizer: TextTokenizer | None = None, *,
                 prompts: Sequence[str] | None = None) -> None:
        self._corpus: TextCorpus | None = None
        self.tokenizer: TextTokenizer = tokenizer or self.corpus().tokenizer
        self._prompts = SAMPLE_PROMPTS if prompts is None else tuple(prompts)

    def corpus(self, cache_dir: str | None = None) -> TextCorpus:
        """The topics' splits (built on first use; ``cache_dir`` is not needed)."""
        if self._corpus is None:
            self._corpus = TextCorpus()
        return self._corpus

    def train_size(self) -> int:
        """Characters of the train split."""
        return len(self.corpus().ids("train"))

    def prompts(self) -> tuple[str, ...]:
        """The given prompts, or ``SAMPLE_PROMPTS``."""
        return self._prompts

    def scores(self, nats: float, count: int, windows: torch.Tensor) -> dict[str, float]:
        """Bits per character and the characters scored."""
        return {"val_bpc": nats / count / math.log(2), "val_chars": count}

    def to_dict(self) -> dict:
        """The tokenizer."""
        return {"tokenizer": self.tokenizer.to_dict()}

    def run_files(self) -> dict[str, str]:
        """None: the text ships with Python."""
        return {}


class UserText:
    """A user's text, tokenized (:class:`~addnorm.data.TokenCorpus`).

    Args:
        tokenizer: the tokenizer its ids come from.
        record: the record of its files.
        corpus: the corpus, if already open; None opens ``record``'s files (checked
            unchanged) on first use.
        prompts: the sample prompts; None takes them from the held-out text on first use.
    """

    unit = "tokens"

    def __init__(self, tokenizer: TextTokenizer, record: DataRecord, *,
                 corpus: TokenCorpus | None = None,
                 prompts: Sequence[str] | None = None) -> None:
        self.tokenizer, self.record, self._corpus = tokenizer, record, corpus
        self._prompts = None if prompts is None else tuple(prompts)

    def corpus(self, cache_dir: str | None = None) -> TokenCorpus:
        """The corpus; the recorded files are opened again on the first call (checked
        unchanged: ``DataChangedError`` names what changed; their token file in
        ``cache_dir``)."""
        if self._corpus is None:
            self._corpus = TokenCorpus.reopen(self.record, self.tokenizer, cache_dir=cache_dir)
        return self._corpus

    def train_size(self) -> int:
        """Tokens of the train split."""
        return self.corpus().n_train

    def prompts(self) -> tuple[str, ...]:
        """The given prompts, or the first words of the first full line after three evenly
        spaced points of the held-out text (read on the first call)."""
        if self._prompts is None:
            self._prompts = _prompts_from(self.corpus())
        return self._prompts

    def scores(self, nats: float, count: int, windows: torch.Tensor) -> dict[str, float]:
        """Bits per character, byte and token, the tokens, bytes and characters scored, and
        the order-0 byte entropy of the corpus and of its held-out text."""
        corpus = self.corpus()
        bits = nats / math.log(2)
        targets = windows[:, 1:].numpy()  # (N, L): the ids scored, in text order
        n_bytes = int(corpus.token_bytes()[targets].sum())
        n_chars = _characters(self.tokenizer, targets.reshape(-1))
        details = corpus.record.details
        return {
            "val_bpc": bits / n_chars,
            "val_bits_per_byte": bits / n_bytes,
            "val_bits_per_token": bits / count,
            "val_tokens": count,
            "val_bytes": n_bytes,
            "val_chars": n_chars,
            "corpus_byte_entropy": float(details["byte_entropy"]),
            "val_byte_entropy": float(details["val_byte_entropy"]),
        }

    def to_dict(self) -> dict:
        """The tokenizer, the record and the sample prompts."""
        return {"tokenizer": self.tokenizer.to_dict(), "data": self.record.to_dict(),
                "prompts": list(self.prompts())}

    def run_files(self) -> dict[str, str]:
        """``data.json`` (the record) and, for a BPE or a file's tokenizer,
        ``tokenizer.json`` (loadable with ``tokenizers.Tokenizer.from_file``)."""
        files = record_files(self.record)
        if isinstance(self.tokenizer, HFTokenizer):
            files["tokenizer.json"] = self.tokenizer.to_json()
        return files


def text_data(
    tokenizer: TextTokenizer | None = None,
    data: TextData | TokenCorpus | DataRecord | None = None,
    prompts: Sequence[str] | None = None,
) -> TextData:
    """The text ``LMTask(tokenizer, data=data, prompts=prompts)`` trains on: ``data`` itself
    (a :class:`TextData`), a :class:`~addnorm.data.TokenCorpus` (``tokenizer`` None: its
    own), the :class:`~addnorm.data.fingerprint.DataRecord` of one (with the tokenizer it
    was encoded with), or None: the bundled topics."""
    if data is None:
        return BundledText(tokenizer, prompts=prompts)
    if isinstance(data, TokenCorpus):
        return UserText(tokenizer or data.tokenizer, data.record, corpus=data, prompts=prompts)
    if isinstance(data, DataRecord):
        if tokenizer is None:
            raise TypeError("a DataRecord needs the tokenizer it was encoded with")
        return UserText(tokenizer, data, prompts=prompts)
    if is_data_source(data):
        if tokenizer is not None or prompts is not None:
            raise TypeError("a TextData carries its own tokenizer and prompts")
        return data
    raise TypeError(f"data must be a TokenCorpus, a DataRecord or None, got {data!r}")


def text_data_for(task_cfg: Any) -> TextData:
    """The text an ``LMTaskConfig`` names: the topics, or its ``data`` tokenized as it asks
    (:meth:`TokenCorpus.build`: once, then from its cache)."""
    if task_cfg.data is None:
        return BundledText()
    corpus = TokenCorpus.build(
        task_cfg.data,
        task_cfg.tokenizer,
        vocab_size=task_cfg.vocab_size,
        val_fraction=task_cfg.val_fraction,
        cache_dir=task_cfg.cache_dir,
        follow_links=task_cfg.follow_links,
    )
    return UserText(corpus.tokenizer, corpus.record, corpus=corpus)


def text_data_from_dict(data: dict) -> TextData:
    """The text a checkpoint's task data names (``to_dict``'s output)."""
    prompts = data.get("prompts")
    if prompts is not None and not (
        isinstance(prompts, list) and all(isinstance(p, str) and p for p in prompts)
    ):
        raise ValueError("prompts must be a list of non-empty strings")
    record = DataRecord.from_dict(data["data"]) if data.get("data") is not None else None
    return text_data(tokenizer_from_dict(data["tokenizer"]), record, prompts)


def _characters(tokenizer: TextTokenizer, ids: np.ndarray) -> int:
    """How many characters the ids ``ids`` (consecutive, in text order) stand for: one per
    non-special id of a character tokenizer; the length of their decoded text otherwise."""
    if isinstance(tokenizer, CharTokenizer):
        return int((ids >= len(SPECIALS)).sum())
    assert isinstance(tokenizer, HFTokenizer)
    return len(tokenizer.tokenizer.decode(ids.tolist(), skip_special_tokens=True))


def _prompts_from(corpus: TextCorpus | TokenCorpus, n: int = 3) -> tuple[str, ...]:
    """``n`` sample prompts from the held-out text: the first words (at most 24 characters)
    of the first full line after ``n`` evenly spaced points of it."""
    val = corpus.ids("val")
    prompts = []
    for k in range(n):
        start = len(val) * k // n
        text = corpus.tokenizer.decode([int(i) for i in val[start : start + 256]])
        if k > 0 and "\n" in text.rstrip("\n"):
            text = text[text.index("\n") + 1 :]
        line = text.lstrip("\n").split("\n")[0]
        prompt = line[:24].rsplit(" ", 1)[0] if len(line) > 24 and " " in line[:24] else line[:24]
        if prompt.strip():
            prompts.append(prompt)
    return tuple(prompts) or SAMPLE_PROMPTS
