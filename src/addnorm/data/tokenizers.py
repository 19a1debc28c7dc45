"""What the tasks need of a tokenizer (:class:`TextTokenizer`), and character-level
tokenizers: one id per character, plus special tokens.

The special tokens come first, so ``<pad>`` is always id 0 (the ``pad_id`` the models and the
loss's ``ignore_index`` use). A character outside the vocabulary encodes as ``<unk>``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

import torch
from torch.nn.utils.rnn import pad_sequence

from addnorm.data.dates import source_characters

__all__ = [
    "SPECIALS",
    "CharTokenizer",
    "TextTokenizer",
    "date_source_tokenizer",
    "date_target_tokenizer",
]

SPECIALS = ("<pad>", "<bos>", "<eos>", "<unk>")


class TextTokenizer(Protocol):
    """What the language-model and translation tasks need of a tokenizer.

    Attributes:
        pad_id, bos_id, eos_id: the padding, start and end ids (three different ids).
    """

    @property
    def pad_id(self) -> int: ...

    @property
    def bos_id(self) -> int: ...

    @property
    def eos_id(self) -> int: ...

    @property
    def vocab_size(self) -> int:
        """Number of ids."""
        ...

    def encode(self, text: str, *, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        """Ids of ``text``, optionally framed by ``bos_id`` / ``eos_id``."""
        ...

    def decode(self, ids: Iterable[int]) -> str:
        """The text of ``ids``, up to the first ``eos_id``, special ids left out."""
        ...

    def encode_batch(
        self, texts: Sequence[str], *, add_bos: bool = False, add_eos: bool = False
    ) -> torch.Tensor:
        """A LongTensor (B, L) of ``texts`` right-padded with ``pad_id``."""
        ...

    def to_dict(self) -> dict:
        """JSON from which :func:`~addnorm.data.hf_tokenizer.tokenizer_from_dict` rebuilds
        the tokenizer."""
        ...


class CharTokenizer:
    """Maps text to ids character by character: ids 0..3 are ``SPECIALS``, then ``chars``.

    Args:
        chars: the vocabulary's characters, each a single character, no repeats.
    """

    def __init__(self, chars: Iterable[str]) -> None:
        chars = list(chars)
        for c in chars:
            if not isinstance(c, str) or len(c) != 1:
                raise ValueError(f"chars must hold single characters, got {c!r}")
        if len(set(chars)) != len(chars):
            raise ValueError("chars must not repeat a character")
        self.chars: tuple[str, ...] = tuple(chars)
        self._index = {c: i + len(SPECIALS) for i, c in enumerate(self.chars)}
        self.pad_id, self.bos_id, self.eos_id, self.unk_id = range(len(SPECIALS))

    @property
    def vocab_size(self) -> int:
        """Number of ids: the specials plus one per character."""
        return len(SPECIALS) + len(self.chars)

    def encode(self, text: str, *, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        """Ids of ``text``'s characters, optionally framed by ``<bos>`` / ``<eos>``."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        ids = [self._index.get(c, self.unk_id) for c in text]
        return ([self.bos_id] if add_bos else []) + ids + ([self.eos_id] if add_eos else [])

    def decode(self, ids: Iterable[int]) -> str:
        """The text of ``ids``: stops at the first ``<eos>``, drops the other special ids and
        ids outside the vocabulary."""
        out = []
        for i in ids:
            i = int(i)
            if i == self.eos_id:
                break
            if len(SPECIALS) <= i < self.vocab_size:
                out.append(self.chars[i - len(SPECIALS)])
        return "".join(out)

    def encode_batch(
        self, texts: Sequence[str], *, add_bos: bool = False, add_eos: bool = False
    ) -> torch.Tensor:
        """A LongTensor (B, L) of ``texts`` right-padded with ``pad_id`` to the longest one."""
        rows = [torch.tensor(self.encode(t, add_bos=add_bos, add_eos=add_eos), dtype=torch.long)
                for t in texts]
        if not rows:
            return torch.zeros((0, 0), dtype=torch.long)
        return pad_sequence(rows, batch_first=True, padding_value=self.pad_id)  # (B, L)

    def to_dict(self) -> dict[str, list[str]]:
        """A JSON-ready description; ``CharTokenizer.from_dict`` rebuilds the tokenizer."""
        return {"specials": list(SPECIALS), "chars": list(self.chars)}

    @classmethod
    def from_dict(cls, data: dict) -> CharTokenizer:
        """Rebuild a tokenizer written by ``to_dict``."""
        if not isinstance(data, dict) or not isinstance(data.get("chars"), list):
            raise ValueError("tokenizer data must be a dict with a 'chars' list")
        if data.get("specials", list(SPECIALS)) != list(SPECIALS):
            raise ValueError(f"tokenizer specials must be {list(SPECIALS)}, got {data['specials']}")
        return cls(data["chars"])

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CharTokenizer) and self.chars == other.chars

    def __hash__(self) -> int:
        return hash(self.chars)

    def __repr__(self) -> str:
        return f"CharTokenizer(vocab_size={self.vocab_size})"


def date_source_tokenizer() -> CharTokenizer:
    """The fixed source vocabulary of the date task: every character any format can write."""
    return CharTokenizer(source_characters())


def date_target_tokenizer() -> CharTokenizer:
    """The target vocabulary of the date task: the digits and '-'."""
    return CharTokenizer("-0123456789")
