"""Sentence pairs from a user's files, for the translation task: read and checked line by
line (:mod:`addnorm.data.pair_files`, the formats and what is refused), split into train and
held-out pairs by a recorded rule, tokenized per side or shared.

:meth:`PairCorpus.build` reads a file (or a folder or glob of them) and an optional held-out
file; without one, a pair is held out when the CRC-32 of its source falls in the first
``val_fraction`` of its range, so repeated sources fall on one side and the split is the same
in every process and run. Its tokenizers: characters (from the train pairs), a byte-level BPE
(``tokenizers``, trained on the train pairs) or a ``tokenizer.json``, per side or one shared.

:class:`TranslationPairs` is a ``torch.utils.data.Dataset`` of a corpus's pairs, whose
``collate`` pads a batch for a ``DataLoader``; :class:`PairBatches` is the trainer's batch
source of the same dataset, drawn by a seeded sampler.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Sequence
from typing import Any

import torch

from addnorm.data.batches import encode_date_pairs
from addnorm.data.fingerprint import DataError, DataRecord, reopening
from addnorm.data.hf_tokenizer import (
    HFTokenizer,
    TextTokenizer,
    check_bpe_vocab_size,
    describe_tokenizer,
)
from addnorm.data.pair_files import (
    JSONL_SUFFIXES,
    MAX_SIDE_CHARS,
    Pair,
    PairFiles,
    pair_format,
    parse_pair_line,
    read_pairs,
)
from addnorm.data.sampler import SampledBatches, SeededSampler
from addnorm.data.tokenizers import CharTokenizer
from addnorm.utils.checks import check_choice, check_float

__all__ = [
    "JSONL_SUFFIXES",
    "MAX_SIDE_CHARS",
    "Pair",
    "PairBatches",
    "PairCorpus",
    "TranslationPairs",
    "parse_pair_line",
    "read_pairs",
]

# The held-out rule: CRC-32 of the source (UTF-8) modulo _BUCKETS, below val_fraction of it.
_BUCKETS = 1_000_000
_SPLITS = ("train", "val")


class PairCorpus:
    """Train and held-out pairs with their tokenizers and the record of their files.

    Build one with :meth:`build` (or :meth:`reopen`); the constructor takes the parts.

    Args:
        train, held_out: the pairs.
        src_tok, tgt_tok: the source and target tokenizers (the same object when shared);
            their ``pad_id`` must agree.
        record: the files, split and tokenizers (:class:`DataRecord`).
    """

    def __init__(
        self,
        train: Sequence[Pair],
        held_out: Sequence[Pair],
        src_tok: TextTokenizer,
        tgt_tok: TextTokenizer,
        record: DataRecord,
    ) -> None:
        if src_tok.pad_id != tgt_tok.pad_id:
            raise DataError(
                f"the source and target tokenizers pad with different ids ({src_tok.pad_id}, "
                f"{tgt_tok.pad_id}); one model pads both with one id"
            )
        self.train, self.held_out = list(train), list(held_out)
        self.src_tok, self.tgt_tok, self.record = src_tok, tgt_tok, record
        self.shared = src_tok is tgt_tok
        pairs = [*self.train, *self.held_out]
        self.longest_source = _longest(src_tok, [p.source for p in pairs])
        self.longest_target = _longest(tgt_tok, [p.target for p in pairs])

    @classmethod
    def build(
        cls,
        path: str | os.PathLike,
        *,
        valid: str | os.PathLike | None = None,
        tokenizer: str | os.PathLike = "char",
        vocab_size: int | None = None,
        shared_vocab: bool = False,
        val_fraction: float = 0.1,
        follow_links: bool = False,
        header: str = "auto",
    ) -> PairCorpus:
        """The pairs of ``path`` (training) and ``valid`` (held out; None: the pairs of
        ``path`` the CRC-32 rule holds out at ``val_fraction``), tokenized by ``tokenizer``:
        ``"char"``, ``"bpe"`` (``vocab_size`` ids, default 2048) or a ``tokenizer.json``
        path; one per side, or one for both with ``shared_vocab``. ``follow_links``: read a
        folder's links leading outside it; ``header``: what each TSV file's first line is
        (:mod:`addnorm.data.tsv_header`). Raises :class:`DataError` for pairs or settings
        that cannot be used (naming the file and line)."""
        check_float("val_fraction", val_fraction, min_value=0.0, min_inclusive=False,
                    max_value=0.5)
        if os.fspath(tokenizer) != "bpe" and vocab_size is not None:
            raise DataError(f"vocab_size ({vocab_size}) applies to the bpe tokenizer only")
        data = PairFiles.of(path, "data", follow_links)
        held = None if valid is None else PairFiles.of(valid, "valid", follow_links)
        train, held_out, split = _split(data, held, val_fraction, header)
        src_tok, tgt_tok = _tokenizers(train, tokenizer, vocab_size, shared_vocab)
        record = _record(data, held, split, src_tok, tgt_tok, cls._format(data))
        record.details.update(_reading(data, follow_links, header))
        return cls(train, held_out, src_tok, tgt_tok, record)

    @classmethod
    def reopen(cls, record: DataRecord, src_tok: TextTokenizer, tgt_tok: TextTokenizer
               ) -> PairCorpus:
        """The pairs ``record`` describes, with the run's saved tokenizers. Raises
        :class:`DataChangedError` naming what changed if a file no longer fingerprints as
        recorded (or is gone)."""
        valid = record.details.get("valid")
        follow, header = record.details.get("follow_links", False), record.details.get(
            "header", "auto")
        with reopening(record):
            data = PairFiles.of(record.path, "data", bool(follow))
            held = None if valid is None else PairFiles.of(valid["path"], "valid", bool(follow))
        record.check_unchanged(data.fingerprint, files=data.files, root=data.root)
        if held is not None and valid is not None:
            DataRecord.from_dict(valid).check_unchanged(held.fingerprint, files=held.files,
                                                         root=held.root)
        fraction = float(record.split.get("val_fraction") or 0.1)
        train, held_out, _ = _split(data, held, fraction, str(header))
        return cls(train, held_out, src_tok, tgt_tok, record)

    @staticmethod
    def _format(files: PairFiles) -> str:
        return "+".join(sorted({pair_format(p) for p in files.files}))

    def pairs(self, split: str) -> list[Pair]:
        """The "train" or "val" (held-out) pairs, in file order."""
        check_choice("split", split, _SPLITS)
        return self.train if split == "train" else self.held_out

    def collate(self, items: Sequence[dict[str, str] | Pair]) -> dict[str, torch.Tensor]:
        """A batch of pairs (``TranslationPairs`` items) as padded tensors for teacher
        forcing: ``src`` (B, S), ``tgt_in`` = ``<bos>`` + target (B, L), ``tgt_out`` = target
        + ``<eos>`` (B, L); see :func:`addnorm.data.batches.encode_date_pairs`."""
        pairs = [Pair(i["source"], i["target"]) if isinstance(i, dict) else i for i in items]
        return encode_date_pairs(
            [p.source for p in pairs], [p.target for p in pairs], self.src_tok, self.tgt_tok
        )

    def __repr__(self) -> str:
        return (f"PairCorpus({self.record.path!r}, train={len(self.train)}, "
                f"held_out={len(self.held_out)}, shared={self.shared})")


def _longest(tokenizer: TextTokenizer, texts: list[str]) -> int:
    if isinstance(tokenizer, HFTokenizer):
        return max((len(r) for r in tokenizer.encode_many(texts)), default=0)
    return max((len(t) for t in texts), default=0)


def _split(data: PairFiles, held: PairFiles | None, val_fraction: float, header: str = "auto"
           ) -> tuple[list[Pair], list[Pair], dict[str, Any]]:
    pairs = data.read("data", header)
    if held is not None:
        given = held.read("valid", header)
        return pairs, given, {"held_out": "the valid file", "train_pairs": len(pairs),
                              "val_pairs": len(given)}
    bound = int(val_fraction * _BUCKETS)
    train: list[Pair] = []
    held_out: list[Pair] = []
    for pair in pairs:
        side = held_out if zlib.crc32(pair.source.encode("utf-8")) % _BUCKETS < bound else train
        side.append(pair)
    split = {
        "val_fraction": val_fraction,
        "rule": f"held out: pairs whose source's CRC-32 (UTF-8) mod {_BUCKETS} < {bound}",
        "train_pairs": len(train),
        "val_pairs": len(held_out),
    }
    if not held_out or not train:
        empty = "held-out" if not held_out else "train"
        raise DataError(
            f"data {data.path}: the {empty} split of its {len(pairs)} pairs is empty at "
            f"val_fraction {val_fraction}; add pairs, change val_fraction or give a valid file"
        )
    return train, held_out, split


def _tokenizers(
    train: list[Pair], tokenizer: str | os.PathLike, vocab_size: int | None, shared: bool
) -> tuple[TextTokenizer, TextTokenizer]:
    kind = os.fspath(tokenizer)
    sources, targets = [p.source for p in train], [p.target for p in train]
    tok: TextTokenizer
    if kind == "char":
        if shared:
            tok = CharTokenizer(sorted(set("".join(sources)) | set("".join(targets))))
            return tok, tok
        return (CharTokenizer(sorted(set("".join(sources)))),
                CharTokenizer(sorted(set("".join(targets)))))
    if kind == "bpe":
        size = check_bpe_vocab_size(vocab_size)
        if shared:
            tok = HFTokenizer.train_bpe(iter([*sources, *targets]), size)
            return tok, tok
        return (HFTokenizer.train_bpe(iter(sources), size),
                HFTokenizer.train_bpe(iter(targets), size))
    file_tok = HFTokenizer.from_file(tokenizer)
    if shared:
        return file_tok, file_tok
    return file_tok, HFTokenizer.from_json(file_tok.to_json(), source=file_tok.source)


def _reading(data: PairFiles, follow_links: bool, header: str) -> dict[str, Any]:
    """How the files were read, where it is not the default (a resumed run reads them the
    same way), and the links left out."""
    out: dict[str, Any] = {"follow_links": True} if follow_links else {}
    if header != "auto":
        out["header"] = header
    if data.skipped_links:
        out["links_skipped"] = list(data.skipped_links)
    return out


def _record(data: PairFiles, held: PairFiles | None, split: dict[str, Any], src_tok: TextTokenizer,
            tgt_tok: TextTokenizer, fmt: str) -> DataRecord:
    shared = src_tok is tgt_tok
    tokenizer = {"shared": describe_tokenizer(src_tok)} if shared else {
        "source": describe_tokenizer(src_tok), "target": describe_tokenizer(tgt_tok)
    }
    details: dict[str, Any] = {"format": fmt}
    if held is not None:
        details["valid"] = DataRecord(held.path, "pairs", held.fingerprint).to_dict()
    return DataRecord(data.path, "pairs", data.fingerprint, split, tokenizer, details)


class TranslationPairs(torch.utils.data.Dataset):
    """A corpus's pairs of one split as a map-style dataset: item ``i`` is ``{"source": str,
    "target": str}``; ``DataLoader(pairs, batch_size=..., collate_fn=corpus.collate)`` gives
    padded tensor batches.

    Args:
        corpus: a :class:`PairCorpus`.
        split: "train" or "val" (held out).
    """

    def __init__(self, corpus: PairCorpus, split: str = "train") -> None:
        self.corpus, self.items = corpus, corpus.pairs(split)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> dict[str, str]:
        pair = self.items[index]
        return {"source": pair.source, "target": pair.target}


class PairBatches(SampledBatches):
    """Endless batches of random train pairs: items of :class:`TranslationPairs` drawn with
    replacement by a :class:`~addnorm.data.sampler.SeededSampler` (its state is the data
    order a checkpoint saves), padded by the corpus's ``collate``.

    Args:
        corpus: the pairs and tokenizers.
        batch_size: pairs per batch.
        seed: seeds the data order.

    Batches: ``src`` (B, S), ``tgt_in`` (B, L), ``tgt_out`` (B, L), right-padded.
    """

    def __init__(self, corpus: PairCorpus, *, batch_size: int, seed: int) -> None:
        self.corpus = corpus
        pairs = TranslationPairs(corpus, "train")
        super().__init__(pairs, SeededSampler(len(pairs), seed), batch_size=batch_size,
                         collate=corpus.collate)
