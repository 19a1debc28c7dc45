"""Tokenizers run by Hugging Face's ``tokenizers`` library, and what the language-model and
translation tasks need of a tokenizer (:class:`~addnorm.data.tokenizers.TextTokenizer`, the
interface :class:`~addnorm.data.tokenizers.CharTokenizer` and :class:`HFTokenizer` both meet,
is importable from here too).

:class:`HFTokenizer` is a ``tokenizers.Tokenizer`` (a ``tokenizer.json``) with the special ids
and padded batches (padded by ``tokenizers`` itself), built one of two ways: for a user's
text, a byte-level BPE trained here on a stream of texts or a user's file, with ``<pad>``,
``<bos>`` and ``<eos>`` ids added where the file has none by a common name (saved whole in a
checkpoint); or a pretrained model's own, as saved, which frames texts as its file says
(BERT's ``[CLS] ... [SEP]``) with a ``padding_mask`` (:meth:`HFTokenizer.encode_for_model`).
Its files are read by :mod:`addnorm.data.tokenizer_files`; ``tokenizers`` is imported when a
tokenizer of this kind is built or read.

Shapes legend: B batch, L the longest encoding in the batch.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import torch

from addnorm.data.fingerprint import DataError
from addnorm.data.tokenizer_files import read_pretrained_tokenizer, read_tokenizer_json
from addnorm.data.tokenizers import SPECIALS, CharTokenizer, TextTokenizer
from addnorm.utils.checks import check_int

if TYPE_CHECKING:
    from tokenizers import Tokenizer

__all__ = [
    "DEFAULT_BPE_VOCAB_SIZE",
    "MAX_VOCAB_SIZE",
    "MIN_BPE_VOCAB_SIZE",
    "SPECIAL_TOKENS",
    "EncodedBatch",
    "HFTokenizer",
    "TextTokenizer",
    "check_bpe_vocab_size",
    "describe_tokenizer",
    "token_byte_lengths",
    "tokenizer_from_dict",
]

# The special tokens a trained BPE starts with (ids 0, 1, 2: <pad> is 0, as everywhere here).
SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>")
# A byte-level BPE holds the 256 bytes and the specials before its first merge.
MIN_BPE_VOCAB_SIZE = 256 + len(SPECIAL_TOKENS)
# The largest vocabulary the tasks take: above every published tokenizer (Gemma 3's has
# 262,144 tokens), and at d_model 512 its embedding alone is 2 GiB of float32 weights.
MAX_VOCAB_SIZE = 2**20
DEFAULT_BPE_VOCAB_SIZE = 2048  # a BPE trained for a user's text when no size is given
# Names a tokenizer.json may give its padding, start and end tokens (first found wins).
_NAMES = {
    "pad": ("<pad>", "[PAD]", "<|pad|>", "<|padding|>"),
    "bos": ("<bos>", "<s>", "[CLS]", "<|startoftext|>", "<|begin_of_text|>"),
    "eos": ("<eos>", "</s>", "[SEP]", "<|endoftext|>", "<|end_of_text|>"),
}


class EncodedBatch(NamedTuple):
    """Token ids of a batch of texts for a model, right-padded.

    Attributes:
        ids: (B, L) long.
        padding_mask: (B, L) bool, True = padding.
        token_type_ids: (B, L) long, the segment ids the tokenizer assigns (0 for one text).
    """

    ids: torch.Tensor
    padding_mask: torch.Tensor
    token_type_ids: torch.Tensor


class HFTokenizer:
    """A ``tokenizers.Tokenizer`` with the special ids and the padded batches the tasks and
    the pretrained models use.

    Args:
        tokenizer: the tokenizer. Its own special tokens named ``<pad>``, ``[PAD]``, ``<s>``,
            ``</s>``, ``<|endoftext|>`` ... are used; missing ones are added to it, unless
            ``add_missing`` is False (a pretrained model's vocabulary, kept as saved: its
            padding token is ``pad_token`` alone, and a role it lacks has no id).
        source: where it came from, for messages and the data record ("bpe", a file path).
        pad_token: with ``add_missing`` False, the padding token's text (None: none).
        max_len: encodings are cut to this many tokens (None: nothing is cut).

    The file's own padding and truncation settings (often a fixed length) are replaced: a
    batch is padded to its longest row.
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        *,
        source: str = "tokenizer.json",
        add_missing: bool = True,
        pad_token: str | None = None,
        max_len: int | None = None,
    ) -> None:
        if max_len is not None:
            check_int("max_len", max_len, min_value=1)
        self.tokenizer, self.source, self.max_len = tokenizer, source, max_len
        tokenizer.no_padding()
        tokenizer.no_truncation()
        if max_len is not None:
            tokenizer.enable_truncation(max_len)
        ids = {role: _first_id(tokenizer, names) for role, names in _NAMES.items()}
        if not add_missing:
            ids["pad"] = None if pad_token is None else tokenizer.token_to_id(pad_token)
            if pad_token is not None and ids["pad"] is None:
                raise ValueError(f"pad_token {pad_token!r} is not in the vocabulary of {source}")
        for role, name in zip(("pad", "bos", "eos"), SPECIAL_TOKENS, strict=True):
            taken = {v for r, v in ids.items() if r != role}
            if add_missing and (ids[role] is None or ids[role] in taken):
                tokenizer.add_special_tokens([name])
                ids[role] = tokenizer.token_to_id(name)
        self._ids = ids
        self._specials = frozenset(tokenizer.get_added_tokens_decoder())

    @classmethod
    def train_bpe(
        cls, texts: Iterable[str], vocab_size: int, *, length: int | None = None
    ) -> HFTokenizer:
        """A byte-level BPE (GPT-2's pre-tokenizer and byte alphabet, so any text encodes and
        decodes exactly) of ``vocab_size`` ids, ``SPECIAL_TOKENS`` first, trained by
        ``tokenizers`` on ``texts`` as they come (``length``: how many, for its bookkeeping).
        Fewer ids result when the texts hold fewer merges."""
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        check_bpe_vocab_size(vocab_size)
        tokenizer = Tokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=list(SPECIAL_TOKENS),
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        tokenizer.train_from_iterator(texts, trainer=trainer, length=length)
        return cls(tokenizer, source="bpe")

    @classmethod
    def from_file(cls, path: str | os.PathLike, *, what: str = "tokenizer") -> HFTokenizer:
        """A user's ``tokenizer.json``. Raises :class:`DataError` starting with ``what`` and
        the path if it is missing, not a regular file, not a tokenizer ``tokenizers`` reads,
        or holds more than ``MAX_VOCAB_SIZE`` ids."""
        text = read_tokenizer_json(path, what)
        return cls.from_json(text, source=str(Path(path).absolute()),
                             what=f"{what} {os.fspath(path)}")

    @classmethod
    def from_json(cls, text: str, *, source: str = "tokenizer.json", what: str = "tokenizer"
                  ) -> HFTokenizer:
        """The tokenizer a ``tokenizer.json`` text describes; :class:`DataError` if
        ``tokenizers`` cannot read it or it holds more than ``MAX_VOCAB_SIZE`` ids."""
        from tokenizers import Tokenizer

        try:
            tokenizer = Tokenizer.from_str(text)
        except Exception as err:  # tokenizers raises a bare Exception for a malformed file
            reason = " ".join(str(err).split())[:200]
            raise DataError(f"{what}: does not parse as a tokenizer.json ({reason})") from None
        size = tokenizer.get_vocab_size(with_added_tokens=True)
        if size + len(SPECIAL_TOKENS) > MAX_VOCAB_SIZE:
            raise DataError(f"{what}: a vocabulary of {size} tokens, more than the "
                            f"{MAX_VOCAB_SIZE} a model here takes")
        return cls(tokenizer, source=source)

    @classmethod
    def from_pretrained(
        cls, path: str | os.PathLike, *, max_len: int | None = None, pad_token: str | None = None
    ) -> HFTokenizer:
        """A pretrained model's own tokenizer, its vocabulary as saved (nothing added).

        ``path`` is the model's folder or its ``tokenizer.json``; ``pad_token`` names the
        padding token (default: the folder's, else the file's padding setting's,
        :func:`~addnorm.data.tokenizer_files.read_pretrained_tokenizer`); without one,
        :meth:`encode_for_model` pads with id 0, which its mask marks as padding (GPT-2's).
        FileNotFoundError without a ``tokenizer.json``; ValueError if ``tokenizers`` cannot
        read it or ``pad_token`` is not in it.
        """
        tokenizer, file, pad_token = read_pretrained_tokenizer(path, pad_token)
        return cls(tokenizer, source=str(file), add_missing=False, pad_token=pad_token,
                   max_len=max_len)

    @property
    def pad_id(self) -> int:
        """The padding id."""
        return self._role("pad")

    @property
    def bos_id(self) -> int:
        """The start id."""
        return self._role("bos")

    @property
    def eos_id(self) -> int:
        """The end id."""
        return self._role("eos")

    def special_id(self, role: str) -> int | None:
        """The id of the ``"pad"``, ``"bos"`` or ``"eos"`` token; None where a pretrained
        model's vocabulary has none."""
        return self._ids[role]

    def _role(self, role: str) -> int:
        found = self._ids[role]
        if found is None:
            raise ValueError(f"the tokenizer {self.source} has no {role} token")
        return found

    @property
    def vocab_size(self) -> int:
        """Number of ids, added tokens included."""
        return int(self.tokenizer.get_vocab_size(with_added_tokens=True))

    def encode(self, text: str, *, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        """Ids of ``text`` (no special tokens of the file's own post-processing), optionally
        framed by ``bos_id`` / ``eos_id``."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        ids = self.tokenizer.encode(text, add_special_tokens=False).ids
        return ([self.bos_id] if add_bos else []) + list(ids) + ([self.eos_id] if add_eos else [])

    def encode_many(self, texts: Sequence[str]) -> list[list[int]]:
        """The ids of each of ``texts`` (no specials), encoded in parallel by ``tokenizers``."""
        return [list(e.ids) for e in self.tokenizer.encode_batch(list(texts),
                                                                 add_special_tokens=False)]

    def decode(self, ids: Iterable[int], *, until_eos: bool = True) -> str:
        """The text of ``ids`` (up to the first ``eos_id`` unless ``until_eos`` is False),
        special tokens and ids outside the vocabulary left out."""
        values, size = [int(i) for i in ids], self.vocab_size
        if until_eos and self._ids["eos"] in values:
            values = values[: values.index(self._ids["eos"])]
        kept = [i for i in values if 0 <= i < size]
        return str(self.tokenizer.decode(kept, skip_special_tokens=True))

    def encode_batch(
        self, texts: Sequence[str], *, add_bos: bool = False, add_eos: bool = False
    ) -> torch.Tensor:
        """A LongTensor (B, L) of ``texts`` right-padded with ``pad_id`` to the longest."""
        if len(texts) == 0:
            return torch.zeros((0, 0), dtype=torch.long)
        ids, real, _ = self._padded(texts, add_special_tokens=False, pad_id=self.pad_id)
        column = (len(texts), 1)
        if add_bos:
            ids = torch.cat([ids.new_full(column, self.bos_id), ids], dim=1)  # (B, L)
        if add_eos:  # each row's end goes right after its last token
            ends = real.sum(dim=1) + int(add_bos)  # (B,)
            ids = torch.cat([ids, ids.new_full(column, self.pad_id)], dim=1)  # (B, L)
            ids[torch.arange(len(texts)), ends] = self.eos_id
        return ids

    def encode_for_model(self, texts: Sequence[str]) -> EncodedBatch:
        """Ids, padding mask and token types of ``texts`` for a pretrained model: framed by
        the file's own post-processing (BERT's ``[CLS] ... [SEP]``), cut to ``max_len``,
        right-padded to the longest with the padding token (id 0 without one).

        Shapes:
            returns: ids, padding_mask, token_type_ids, each (B, L)
        """
        if isinstance(texts, str) or not isinstance(texts, Sequence) or not texts:
            raise TypeError("texts must be a non-empty sequence of str (a list of texts)")
        for i, text in enumerate(texts):
            if not isinstance(text, str):
                raise TypeError(f"texts[{i}] must be a str, got {type(text).__name__}")
        pad = self._ids["pad"]
        ids, real, types = self._padded(texts, add_special_tokens=True,
                                        pad_id=0 if pad is None else pad)
        return EncodedBatch(ids, ~real, types)

    def _padded(
        self, texts: Sequence[str], *, add_special_tokens: bool, pad_id: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(ids, real, token types)`` of ``texts``, each (B, L), padded on the right by
        ``tokenizers`` to the longest (``real``: True at a token, False at padding). Padding is
        switched on for this call only: a saved tokenizer.json, and ``encode_many``, have none."""
        token = self.tokenizer.id_to_token(pad_id) or ""
        self.tokenizer.enable_padding(pad_id=pad_id, pad_token=token)
        try:
            encodings = self.tokenizer.encode_batch(list(texts),
                                                    add_special_tokens=add_special_tokens)
        finally:
            self.tokenizer.no_padding()
        shape = (len(encodings), len(encodings[0].ids))
        fields = (("ids", torch.long), ("attention_mask", torch.bool), ("type_ids", torch.long))
        ids, real, types = (  # (B, L) each
            torch.tensor([getattr(e, name) for e in encodings], dtype=dtype).reshape(shape)
            for name, dtype in fields)
        return ids, real, types

    def is_byte_level(self) -> bool:
        """Whether its decoder is byte-level (each token's characters are bytes)."""
        decoder = json.loads(self.to_json()).get("decoder") or {}
        return decoder.get("type") == "ByteLevel"

    def special_ids(self) -> frozenset[int]:
        """The ids of the added (special) tokens."""
        return self._specials

    def to_json(self) -> str:
        """The ``tokenizer.json`` text (the special tokens added here included)."""
        return str(self.tokenizer.to_str())

    def to_dict(self) -> dict[str, Any]:
        """JSON holding the whole ``tokenizer.json`` and the special ids."""
        return {
            "tokenizer_json": self.to_json(),
            "source": self.source,
            "pad_id": self.pad_id,
            "bos_id": self.bos_id,
            "eos_id": self.eos_id,
        }

    @classmethod
    def from_dict(cls, data: dict) -> HFTokenizer:
        """Rebuild a tokenizer written by ``to_dict``; ValueError if it is not one."""
        if not isinstance(data, dict) or not isinstance(data.get("tokenizer_json"), str):
            raise ValueError("tokenizer data must be a dict with a 'tokenizer_json' string")
        tok = cls.from_json(data["tokenizer_json"], source=str(data.get("source", "")))
        saved = tuple(data.get(k) for k in ("pad_id", "bos_id", "eos_id"))
        if saved != (tok.pad_id, tok.bos_id, tok.eos_id):
            raise ValueError(f"tokenizer special ids {saved} do not match its tokenizer.json")
        return tok

    def __eq__(self, other: object) -> bool:
        return isinstance(other, HFTokenizer) and self.to_json() == other.to_json()

    def __hash__(self) -> int:
        return hash(self.to_json())

    def __repr__(self) -> str:
        return f"HFTokenizer(vocab_size={self.vocab_size}, source={self.source!r})"


def check_bpe_vocab_size(vocab_size: object) -> int:
    """``vocab_size`` as the ids of a byte-level BPE (``DEFAULT_BPE_VOCAB_SIZE`` for None); a
    :class:`DataError` outside ``MIN_BPE_VOCAB_SIZE`` .. ``MAX_VOCAB_SIZE``."""
    if vocab_size is None:
        return DEFAULT_BPE_VOCAB_SIZE
    size = check_int("vocab_size", vocab_size, min_value=1)
    if not MIN_BPE_VOCAB_SIZE <= size <= MAX_VOCAB_SIZE:
        raise DataError(f"vocab_size {size}: a byte-level BPE needs {MIN_BPE_VOCAB_SIZE} to "
                        f"{MAX_VOCAB_SIZE} ids (256 bytes and {MIN_BPE_VOCAB_SIZE - 256} "
                        "special tokens at least)")
    return size


def _first_id(tokenizer: Tokenizer, names: tuple[str, ...]) -> int | None:
    for name in names:
        found = tokenizer.token_to_id(name)
        if found is not None:
            return int(found)
    return None


def tokenizer_from_dict(data: dict) -> CharTokenizer | HFTokenizer:
    """A :class:`CharTokenizer` or :class:`HFTokenizer` from its ``to_dict``."""
    if isinstance(data, dict) and "tokenizer_json" in data:
        return HFTokenizer.from_dict(data)
    return CharTokenizer.from_dict(data)


def describe_tokenizer(tokenizer: TextTokenizer) -> dict[str, Any]:
    """A short JSON description for a data record: the kind, the size and where it came
    from (no vocabulary)."""
    if not isinstance(tokenizer, HFTokenizer):
        return {"kind": "char", "vocab_size": tokenizer.vocab_size}
    if tokenizer.source == "bpe":
        return {"kind": "bpe", "vocab_size": tokenizer.vocab_size}
    return {"kind": "tokenizer.json", "vocab_size": tokenizer.vocab_size, "file": tokenizer.source}


def token_byte_lengths(tokenizer: TextTokenizer) -> np.ndarray:
    """An int64 array (V,): the UTF-8 bytes each id stands for, 0 for special ids. Exact for
    a :class:`CharTokenizer` and a byte-level :class:`HFTokenizer` (each character of a token
    is one byte); for another ``tokenizer.json``, the bytes each id decodes to alone."""
    if isinstance(tokenizer, CharTokenizer):
        return np.array([0] * len(SPECIALS) + [len(c.encode("utf-8")) for c in tokenizer.chars],
                        dtype=np.int64)
    if not isinstance(tokenizer, HFTokenizer):
        raise TypeError(f"tokenizer must be a CharTokenizer or HFTokenizer, got {tokenizer!r}")
    tok, specials = tokenizer.tokenizer, tokenizer.special_ids()
    byte_level = tokenizer.is_byte_level()
    out = np.zeros(tokenizer.vocab_size, dtype=np.int64)
    for i in range(tokenizer.vocab_size):
        piece = None if i in specials else tok.id_to_token(i)
        if piece is not None:
            out[i] = len(piece) if byte_level else len(tok.decode([i]).encode("utf-8"))
    return out

