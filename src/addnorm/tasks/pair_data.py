"""What the ``translate`` task needs of its pairs, whichever they are: :class:`PairData` (the
bundled dates and a user's pairs, :mod:`addnorm.tasks.translate_data`, are its two kinds),
:class:`Example` (a held-out source and its answer), and the scores every kind reports
(:func:`exact_match`, :func:`answer_scores`).
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

from addnorm.data.hf_tokenizer import TextTokenizer
from addnorm.data.pairs import PairCorpus
from addnorm.data.sampler import SampledBatches
from addnorm.tasks.data_source import DataSource
from addnorm.tasks.task import Sizing
from addnorm.tasks.text_metrics import sequence_error_rates
from addnorm.transformer.config import TransformerConfig

__all__ = ["Example", "PairData", "answer_scores", "exact_match"]


class Example(NamedTuple):
    """A source text and its answer (a date example, or a user's held-out pair)."""

    source: str
    target: str


class PairData(DataSource, Protocol):
    """The pairs a translation model trains on and is scored on.

    Attributes:
        src_tok, tgt_tok: the tokenizers (the same object when shared).
        shared: whether one tokenizer serves both sides (and the embeddings are shared).
        max_new_tokens: the longest answer generated.
    """

    src_tok: TextTokenizer
    tgt_tok: TextTokenizer
    shared: bool
    max_new_tokens: int

    @property
    def corpus(self) -> PairCorpus:
        """A user's pairs; ValueError for the dates, which have none."""
        ...

    def check(self, cfg: TransformerConfig, batch_size: int) -> None:
        """Raise ValueError if ``cfg`` cannot take the pairs or a batch cannot be drawn."""
        ...

    def sizing(self, eval_size: int) -> Sizing:
        """The longest source with its answer, and the evaluation's batch."""
        ...

    def batches(self, batch_size: int, seed: int) -> SampledBatches:
        """The training batches (``src``, ``tgt_in``, ``tgt_out``)."""
        ...

    def held_out(self, split: str, n: int) -> list[Example]:
        """``n`` fixed held-out examples of ``split``: "test" (scored at the end) or "val"
        (scored while training, to keep the best; possibly empty for a user's pairs)."""
        ...

    def evaluation_sets(self, n: int) -> list[tuple[str, list[Example]]]:
        """The held-out examples scored at the end, by split name, ``n`` the test set's."""
        ...

    def scores(self, split: str, predictions: list[str], answers: list[str]
               ) -> dict[str, float]:
        """The held-out figures of a split's predictions."""
        ...

    def answer_problem(self, answer: str) -> str | None:
        """Why an answer is wrong on its face, or None."""
        ...


def exact_match(split: str, predictions: list[str], answers: list[str]) -> dict[str, float]:
    """``{split}_exact_match`` (the share of predictions equal to their answer) and
    ``n_{split}``."""
    hits = sum(p == a for p, a in zip(predictions, answers, strict=True))
    return {f"{split}_exact_match": hits / len(answers), f"n_{split}": len(answers)}


def answer_scores(split: str, predictions: list[str], answers: list[str],
                  tgt_tok: TextTokenizer) -> dict[str, float]:
    """Exact match and the error rates of :func:`~addnorm.tasks.text_metrics.
    sequence_error_rates`, the token error rate in ``tgt_tok``'s tokens (both texts encoded
    by it, without specials: a prediction as its canonical tokens, not the ids it was
    generated as)."""
    return {**exact_match(split, predictions, answers),
            **sequence_error_rates(split, predictions, answers, tgt_tok.encode)}
