"""Character-level text that ships with Python: the ``pydoc_data.topics`` help pages.

The corpus is the dict ``pydoc_data.topics.topics`` joined in sorted key order (so it is the
same text in every process of one Python version), and split into train / validation / test
as three contiguous blocks: the first 90%, the next 5%, the last 5% of the characters.
"""

from __future__ import annotations

import random

import torch

from addnorm.data.tokenizers import CharTokenizer
from addnorm.utils.checks import check_choice, check_int

__all__ = ["TEXT_SPLITS", "TextCorpus", "load_topics_text"]

TEXT_SPLITS = ("train", "val", "test")
_SPLIT_FRACTIONS = (0.90, 0.05, 0.05)


def load_topics_text() -> str:
    """The pydoc topics joined in sorted key order, each followed by a blank line."""
    from pydoc_data.topics import topics

    return "".join(topics[key].strip("\n") + "\n\n" for key in sorted(topics))


class TextCorpus:
    """A character corpus, its tokenizer (built from all its characters) and its three splits.

    Args:
        text: the corpus; ``None`` loads ``load_topics_text()``.
    """

    def __init__(self, text: str | None = None) -> None:
        self.text = load_topics_text() if text is None else text
        if not isinstance(self.text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        if len(self.text) < 100:
            raise ValueError(f"text must hold at least 100 characters, got {len(self.text)}")
        self.tokenizer = CharTokenizer(sorted(set(self.text)))
        ids = torch.tensor(self.tokenizer.encode(self.text), dtype=torch.long)
        n_train = int(len(ids) * _SPLIT_FRACTIONS[0])
        n_val = int(len(ids) * _SPLIT_FRACTIONS[1])
        self._splits = {
            "train": ids[:n_train],
            "val": ids[n_train : n_train + n_val],
            "test": ids[n_train + n_val :],
        }

    def ids(self, split: str) -> torch.Tensor:
        """The LongTensor of ids of one split, in corpus order."""
        check_choice("split", split, TEXT_SPLITS)
        return self._splits[split]

    def random_windows(self, rng: random.Random, batch_size: int, length: int) -> torch.Tensor:
        """A LongTensor (B, length + 1) of training windows starting at random offsets.

        Column 0..length-1 is the input, column 1..length the next-character target.
        """
        check_int("batch_size", batch_size, min_value=1)
        check_int("length", length, min_value=1)
        data = self._splits["train"]
        if len(data) <= length + 1:
            raise ValueError(f"length ({length}) must be < the train split ({len(data)} chars)")
        starts = [rng.randrange(len(data) - length - 1) for _ in range(batch_size)]
        return torch.stack([data[s : s + length + 1] for s in starts])

    def eval_windows(self, split: str, length: int, *, max_windows: int | None = None):
        """Non-overlapping windows (N, length + 1) that tile ``split`` from its start."""
        check_int("length", length, min_value=1)
        data = self.ids(split)
        n = (len(data) - 1) // length
        if max_windows is not None:
            n = min(n, check_int("max_windows", max_windows, min_value=1))
        if n == 0:
            raise ValueError(f"split {split!r} ({len(data)} chars) is shorter than {length + 1}")
        return torch.stack([data[i * length : i * length + length + 1] for i in range(n)])
