"""The tasks' training batch sources, each a map-style ``Dataset`` drawn by a
:class:`~addnorm.data.sampler.SeededSampler` (:class:`~addnorm.data.sampler.SampledBatches`),
with a JSON data-order state: the sampler's ``random.Random``.

The bundled data's sources are here: the dates (:class:`DateBatches` over
:class:`~addnorm.data.dates.DateExamples`), character or token windows of a corpus
(:class:`TextBatches` over :class:`~addnorm.data.token_corpus.TextWindows`) and the digits
(:class:`DigitBatches` over :class:`LabelledImages`, with the diffusion's draws,
:class:`DiffusionDraws`); a user's pairs and images have theirs beside their corpora
(``PairBatches``, ``ImageBatches``). :class:`RankShard` is one rank's share of any of them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import torch
from torch.utils.data import default_collate

from addnorm.data.dates import DateExample, DateExamples
from addnorm.data.digits import load_digits
from addnorm.data.sampler import SampledBatches, SeededSampler
from addnorm.data.token_corpus import TextWindows
from addnorm.utils.checks import check_int, check_probability

if TYPE_CHECKING:
    from addnorm.data.hf_tokenizer import TextTokenizer

__all__ = [
    "DateBatches",
    "DiffusionDraws",
    "DigitBatches",
    "LabelledImages",
    "RankShard",
    "TextBatches",
    "WindowSource",
    "encode_date_pairs",
    "image_batch",
]


def encode_date_pairs(
    sources: list[str], targets: list[str], src_tok: TextTokenizer, tgt_tok: TextTokenizer
) -> dict[str, torch.Tensor]:
    """Tensors for teacher forcing, right-padded with ``pad_id`` (0).

    Returns ``src`` (B, S), ``tgt_in`` = ``<bos>`` + target (B, L) and ``tgt_out`` =
    target + ``<eos>`` (B, L): position i of ``tgt_in`` predicts position i of ``tgt_out``.
    """
    return {
        "src": src_tok.encode_batch(sources),
        "tgt_in": tgt_tok.encode_batch(targets, add_bos=True),
        "tgt_out": tgt_tok.encode_batch(targets, add_eos=True),
    }


class DateBatches(SampledBatches):
    """Endless batches of train-split dates, each in a randomly chosen format
    (:meth:`DateExamples.draw <addnorm.data.dates.DateExamples.draw>`).

    Args:
        src_tok, tgt_tok: the date task's tokenizers.
        batch_size: examples per batch.
        seed: seeds the data order.
    """

    def __init__(
        self, src_tok: TextTokenizer, tgt_tok: TextTokenizer, *, batch_size: int, seed: int
    ) -> None:
        self.src_tok, self.tgt_tok = src_tok, tgt_tok
        examples = DateExamples("train")
        super().__init__(examples, SeededSampler(len(examples), seed, draw=examples.draw),
                         batch_size=batch_size, collate=self._encode)

    def _encode(self, examples: list[DateExample]) -> dict[str, torch.Tensor]:
        """``src`` (B, S), ``tgt_in`` (B, L), ``tgt_out`` (B, L); see ``encode_date_pairs``."""
        return encode_date_pairs([e.source for e in examples], [e.target for e in examples],
                                 self.src_tok, self.tgt_tok)


class WindowSource(Protocol):
    """A corpus whose train split :class:`TextBatches` draws windows of:
    :class:`~addnorm.data.text.TextCorpus` (the bundled text) and
    :class:`~addnorm.data.token_corpus.TokenCorpus` (a user's)."""

    def ids(self, split: str):
        """The ids of one split, in text order (1-d)."""
        ...


class TextBatches(SampledBatches):
    """Endless batches of random windows of a corpus's train split: items of
    :class:`~addnorm.data.token_corpus.TextWindows`, every window but the last drawn
    uniformly (as the trainer always drew them, so earlier runs resume bit for bit).

    Args:
        corpus: the text (:class:`WindowSource`).
        batch_size: windows per batch.
        length: tokens (characters, with a character tokenizer) per window (the model's
            context).
        seed: seeds the data order.

    Batches: ``ids`` (B, L) and the next tokens ``targets`` (B, L).
    """

    def __init__(self, corpus: WindowSource, *, batch_size: int, length: int, seed: int
                 ) -> None:
        self.corpus = corpus
        self.length = check_int("length", length, min_value=1)
        windows = TextWindows(corpus, length)
        if len(windows) < 2:
            raise ValueError(f"length ({length}) must be < the train split "
                             f"({len(corpus.ids('train'))} ids) minus one")
        super().__init__(windows, SeededSampler(len(windows) - 1, seed), batch_size=batch_size)


class LabelledImages(torch.utils.data.Dataset):
    """Images and their class ids as a map-style dataset: item ``i`` is ``(image, label)``,
    the image as stored (C, S, S), the label an int.

    Args:
        images: (N, C, S, S).
        labels: (N,) class ids.
    """

    def __init__(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        if images.ndim != 4 or labels.shape != (images.shape[0],) or images.shape[0] < 1:
            raise ValueError(f"images must be (N, C, S, S) and labels (N,), N >= 1, got "
                             f"{tuple(images.shape)} and {tuple(labels.shape)}")
        self.images, self.labels = images, labels.long()

    def __len__(self) -> int:
        return self.labels.shape[0]

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return self.images[index], int(self.labels[index])


def image_batch(items: list[tuple[torch.Tensor, int]]) -> dict[str, torch.Tensor]:
    """``(image, label)`` items as ``images`` (B, C, S, S) and ``labels`` (B,) long."""
    images, labels = default_collate(items)
    return {"images": images, "labels": labels}


class DiffusionDraws:
    """What a diffusion's training batch draws beyond its images, in this order from one
    generator: ``t`` (B,) long, uniform on 0 .. n_steps - 1; ``noise`` like the images,
    standard normal; with ``class_dropout``, ``drop`` (B,) bool, True with that probability
    (the label replaced by the null class).

    Args:
        n_steps: the diffusion's timesteps.
        class_dropout: the label-dropout probability, or None: no ``drop`` (the model draws
            its own).
    """

    def __init__(self, n_steps: int, class_dropout: float | None = None) -> None:
        self.n_steps = check_int("n_steps", n_steps, min_value=1)
        self.class_dropout = None if class_dropout is None else check_probability(
            "class_dropout", class_dropout)

    def __call__(self, batch: dict[str, torch.Tensor], generator: torch.Generator
                 ) -> dict[str, torch.Tensor]:
        images = batch["images"]  # (B, C, S, S)
        n = images.shape[0]
        draws = {
            "t": torch.randint(0, self.n_steps, (n,), generator=generator),
            "noise": torch.randn(images.shape, generator=generator),
        }
        if self.class_dropout is not None:
            draws["drop"] = torch.rand(n, generator=generator) < self.class_dropout
        return draws


class DigitBatches(SampledBatches):
    """Endless batches of train-split digits, with the diffusion timesteps and noise they are
    trained with (:class:`DiffusionDraws`), all drawn from this source's own random generator
    (its state is the data order a checkpoint saves, so a resumed run sees exactly the same
    batches).

    Args:
        batch_size: images per batch.
        n_steps: the diffusion's number of timesteps; t is uniform on 0 .. n_steps - 1.
        seed: seeds the data order.

    Batches: ``images`` (B, 1, 8, 8) in [-1, 1], ``labels`` (B,) long, ``t`` (B,) long,
    ``noise`` (B, 1, 8, 8) standard normal.
    """

    def __init__(self, *, batch_size: int, n_steps: int, seed: int) -> None:
        train = load_digits("train")
        digits = LabelledImages(train.images(), train.labels)
        super().__init__(digits, SeededSampler(len(digits), seed), batch_size=batch_size,
                         collate=image_batch, draws=DiffusionDraws(n_steps))


class RankShard:
    """One rank's share of another batch source's global batches, for data-parallel training.

    Every rank draws the same global batch (the source's own data order, as one process would)
    and keeps run number ``rank`` of its rows cut into ``world_size`` consecutive runs whose
    lengths differ by at most one (``torch.tensor_split``). Padded batches keep the global
    batch's length, so each row is exactly as one process would see it.
    The state is the source's, so a checkpoint resumes with any number of ranks.

    Args:
        source: the global batch source (``next_batch``, ``state_dict``, ``load_state_dict``).
        rank: this rank, 0 .. world_size - 1.
        world_size: how many ranks share each batch.
    """

    def __init__(self, source, *, rank: int, world_size: int) -> None:
        self.world_size = check_int("world_size", world_size, min_value=1)
        self.rank = check_int("rank", rank, min_value=0)
        if rank >= world_size:
            raise ValueError(f"rank ({rank}) must be < world_size ({world_size})")
        self.source = source

    def next_batch(self) -> dict[str, torch.Tensor]:
        """This rank's rows of the next global batch (every tensor cut along its first dim)."""
        batch = self.source.next_batch()
        rows = {name: value.shape[0] for name, value in batch.items()}
        if min(rows.values()) < self.world_size:
            raise ValueError(
                f"a global batch of {min(rows.values())} rows cannot be shared by "
                f"{self.world_size} ranks: use a batch size >= the number of processes"
            )
        return {
            name: torch.tensor_split(value, self.world_size)[self.rank]
            for name, value in batch.items()
        }

    def state_dict(self) -> dict:
        """The global data order (the same on every rank)."""
        return self.source.state_dict()

    def load_state_dict(self, state: dict) -> None:
        """Continue the global data order saved by ``state_dict``."""
        self.source.load_state_dict(state)
