"""A pretrained model's own tokenizer: its ``tokenizer.json``, read by Hugging Face's
``tokenizers`` library (imported when a tokenizer is built; the ``transformers`` extra).

Shapes legend: B batch, L the longest encoding in the batch.

Batches are right-padded to their longest row, as sentence-transformers and BERT feed them,
and come with ``padding_mask`` (True = padding), the models' convention; a tokenizer without a
padding token (GPT-2's) fills with id 0, which the mask marks as padding.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import torch

from addnorm.utils.checks import check_int

__all__ = ["EncodedBatch", "PretrainedTokenizer"]


class EncodedBatch(NamedTuple):
    """Token ids of a batch of texts, right-padded.

    Attributes:
        ids: (B, L) long.
        padding_mask: (B, L) bool, True = padding.
        token_type_ids: (B, L) long, the segment ids the tokenizer assigns (0 for one text).
    """

    ids: torch.Tensor
    padding_mask: torch.Tensor
    token_type_ids: torch.Tensor


class PretrainedTokenizer:
    """The tokenizer stored in a ``tokenizer.json`` (normaliser, pre-tokeniser, model and the
    special tokens it adds, such as BERT's ``[CLS] ... [SEP]``).

    Args:
        path: the ``tokenizer.json`` file.
        max_len: encodings are cut to this many tokens (None: the file's setting is dropped
            and nothing is cut).
        pad_token: the padding token's text (None: the file's padding token, if any).

    The file's own padding and truncation settings (often a fixed length) are replaced: a
    batch is padded to its longest row. A missing file raises ``FileNotFoundError``, a file
    ``tokenizers`` cannot read ``ValueError``.
    """

    def __init__(
        self, path: str | Path, *, max_len: int | None = None, pad_token: str | None = None
    ) -> None:
        from tokenizers import Tokenizer

        path = Path(path)
        if max_len is not None:
            check_int("max_len", max_len, min_value=1)
        if not path.is_file():
            raise FileNotFoundError(f"tokenizer file not found: {path}")
        try:
            self.tokenizer = Tokenizer.from_file(str(path))
        except Exception as err:  # tokenizers raises a bare Exception for a malformed file
            raise ValueError(f"cannot read {path} as a tokenizer.json: {err}") from None
        padding = self.tokenizer.padding
        if pad_token is None and padding is not None:
            pad_token = padding.get("pad_token")
        self.pad_id: int | None = None
        if pad_token is not None:
            self.pad_id = self.tokenizer.token_to_id(pad_token)
            if self.pad_id is None:
                raise ValueError(f"pad_token {pad_token!r} is not in the vocabulary of {path}")
        self.tokenizer.no_padding()
        self.tokenizer.no_truncation()
        if max_len is not None:
            self.tokenizer.enable_truncation(max_len)
        self.max_len = max_len

    @classmethod
    def from_dir(cls, directory: str | Path, *, max_len: int | None = None) -> PretrainedTokenizer:
        """The ``tokenizer.json`` of a model directory; its padding token from the file or from
        ``special_tokens_map.json`` (Hugging Face's layout)."""
        directory = Path(directory)
        pad_token = None
        specials = directory / "special_tokens_map.json"
        if specials.is_file():
            names = json.loads(specials.read_text(encoding="utf-8"))
            pad_token = _token_text(names.get("pad_token") if isinstance(names, dict) else None)
        return cls(directory / "tokenizer.json", max_len=max_len, pad_token=pad_token)

    @property
    def vocab_size(self) -> int:
        """Number of ids, added tokens included."""
        return int(self.tokenizer.get_vocab_size(with_added_tokens=True))

    def encode(self, text: str) -> list[int]:
        """The ids of one text, special tokens included."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        return list(self.tokenizer.encode(text).ids)

    def decode(self, ids: Sequence[int] | torch.Tensor) -> str:
        """The text of ``ids``, special tokens left out."""
        values = ids.tolist() if isinstance(ids, torch.Tensor) else [int(i) for i in ids]
        return str(self.tokenizer.decode(values, skip_special_tokens=True))

    def encode_batch(self, texts: Sequence[str]) -> EncodedBatch:
        """Ids, padding mask and token types of ``texts``, right-padded to the longest.

        Shapes:
            returns: ids, padding_mask, token_type_ids, each (B, L)
        """
        if isinstance(texts, str) or not isinstance(texts, Sequence) or not texts:
            raise TypeError("texts must be a non-empty sequence of str (a list of texts)")
        for i, text in enumerate(texts):
            if not isinstance(text, str):
                raise TypeError(f"texts[{i}] must be a str, got {type(text).__name__}")
        encodings = self.tokenizer.encode_batch(list(texts))
        width = max(len(e.ids) for e in encodings)
        fill = 0 if self.pad_id is None else self.pad_id
        ids = torch.full((len(texts), width), fill, dtype=torch.long)  # (B, L)
        types = torch.zeros((len(texts), width), dtype=torch.long)  # (B, L)
        padding = torch.ones((len(texts), width), dtype=torch.bool)  # (B, L)
        for row, encoding in enumerate(encodings):
            n = len(encoding.ids)
            ids[row, :n] = torch.tensor(encoding.ids, dtype=torch.long)
            types[row, :n] = torch.tensor(encoding.type_ids, dtype=torch.long)
            padding[row, :n] = False
        return EncodedBatch(ids, padding, types)


def _token_text(entry: Any) -> str | None:
    """A special token's text from ``special_tokens_map.json`` (a str or ``{"content": ...}``)."""
    if isinstance(entry, dict):
        entry = entry.get("content")
    return entry if isinstance(entry, str) else None
