"""``PretrainedTokenizer``, the former name of a pretrained model's tokenizer: deprecated, use
:meth:`HFTokenizer.from_pretrained <addnorm.data.hf_tokenizer.HFTokenizer.from_pretrained>`
and its ``encode_for_model``, which this delegates to (same ids, masks and token types).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path

import torch

from addnorm.data.hf_tokenizer import EncodedBatch, HFTokenizer

__all__ = ["EncodedBatch", "PretrainedTokenizer"]


class PretrainedTokenizer:
    """Deprecated: ``HFTokenizer.from_pretrained(path, max_len=..., pad_token=...)``.

    ``encode`` and ``encode_batch`` frame texts with the file's special tokens, as
    ``HFTokenizer.encode_for_model`` does; ``pad_id`` is None without a padding token.
    """

    def __init__(
        self, path: str | Path, *, max_len: int | None = None, pad_token: str | None = None
    ) -> None:
        warnings.warn(
            "PretrainedTokenizer is deprecated: use HFTokenizer.from_pretrained(path) and its "
            "encode_for_model(texts)", DeprecationWarning, stacklevel=2,
        )
        self.wrapped = HFTokenizer.from_pretrained(path, max_len=max_len, pad_token=pad_token)
        self.tokenizer = self.wrapped.tokenizer
        self.max_len = max_len
        self.pad_id = self.wrapped.special_id("pad")

    @classmethod
    def from_dir(cls, directory: str | Path, *, max_len: int | None = None) -> PretrainedTokenizer:
        """The ``tokenizer.json`` of a model directory (and ``special_tokens_map.json``)."""
        return cls(directory, max_len=max_len)

    @property
    def vocab_size(self) -> int:
        return self.wrapped.vocab_size

    def encode(self, text: str) -> list[int]:
        """The ids of one text, special tokens included."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        return self.wrapped.encode_for_model([text]).ids[0].tolist()

    def decode(self, ids: Sequence[int] | torch.Tensor) -> str:
        """The text of ``ids``, special tokens left out."""
        values = ids.tolist() if isinstance(ids, torch.Tensor) else [int(i) for i in ids]
        return self.wrapped.decode(values, until_eos=False)

    def encode_batch(self, texts: Sequence[str]) -> EncodedBatch:
        """``HFTokenizer.encode_for_model(texts)``."""
        return self.wrapped.encode_for_model(texts)
