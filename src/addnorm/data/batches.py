"""Training batch sources for the tasks, each with a JSON data-order state.

A batch source has ``next_batch() -> dict[str, Tensor]`` and ``state_dict()`` /
``load_state_dict()``; all its randomness comes from its own ``random.Random``, whose state
is the data order a checkpoint saves.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Protocol

import torch

from addnorm.data.dates import dates_in_split, random_examples
from addnorm.data.digits import load_digits
from addnorm.utils.checks import check_int

if TYPE_CHECKING:
    from addnorm.data.hf_tokenizer import TextTokenizer

__all__ = [
    "DateBatches", "DigitBatches", "RankShard", "TextBatches", "WindowSource", "encode_date_pairs",
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


def _rng_state(rng: random.Random) -> dict:
    version, internal, gauss = rng.getstate()
    return {"version": version, "internal": list(internal), "gauss_next": gauss}


def _set_rng_state(rng: random.Random, state: dict) -> None:
    rng.setstate((state["version"], tuple(state["internal"]), state["gauss_next"]))


class DateBatches:
    """Endless batches of train-split dates, each in a randomly chosen format.

    Args:
        src_tok, tgt_tok: the date task's tokenizers.
        batch_size: examples per batch.
        seed: seeds the data order.
    """

    def __init__(
        self, src_tok: TextTokenizer, tgt_tok: TextTokenizer, *, batch_size: int, seed: int
    ) -> None:
        self.src_tok, self.tgt_tok = src_tok, tgt_tok
        self.batch_size = check_int("batch_size", batch_size, min_value=1)
        self.rng = random.Random(check_int("seed", seed, min_value=0))
        self.dates = dates_in_split("train")

    def next_batch(self) -> dict[str, torch.Tensor]:
        """``src`` (B, S), ``tgt_in`` (B, L), ``tgt_out`` (B, L); see ``encode_date_pairs``."""
        pairs = list(random_examples(self.dates, self.rng, self.batch_size))
        sources, targets = zip(*pairs, strict=True)
        return encode_date_pairs(list(sources), list(targets), self.src_tok, self.tgt_tok)

    def state_dict(self) -> dict:
        """The data order: the state of this source's random generator."""
        return {"rng": _rng_state(self.rng)}

    def load_state_dict(self, state: dict) -> None:
        """Continue the data order saved by ``state_dict``."""
        _set_rng_state(self.rng, state["rng"])


class WindowSource(Protocol):
    """A corpus that draws training windows: :class:`~addnorm.data.text.TextCorpus` (the
    bundled text) and :class:`~addnorm.data.token_corpus.TokenCorpus` (a user's)."""

    def random_windows(self, rng: random.Random, batch_size: int, length: int) -> torch.Tensor:
        """A LongTensor (B, length + 1) of windows at offsets drawn from ``rng``."""
        ...


class TextBatches:
    """Endless batches of random windows of a corpus's train split.

    Args:
        corpus: the text (:class:`WindowSource`).
        batch_size: windows per batch.
        length: tokens (characters, with a character tokenizer) per window (the model's
            context).
        seed: seeds the data order.
    """

    def __init__(self, corpus: WindowSource, *, batch_size: int, length: int, seed: int
                 ) -> None:
        self.corpus = corpus
        self.batch_size = check_int("batch_size", batch_size, min_value=1)
        self.length = check_int("length", length, min_value=1)
        self.rng = random.Random(check_int("seed", seed, min_value=0))

    def next_batch(self) -> dict[str, torch.Tensor]:
        """``ids`` (B, L) and the next characters ``targets`` (B, L)."""
        windows = self.corpus.random_windows(self.rng, self.batch_size, self.length)
        return {"ids": windows[:, :-1], "targets": windows[:, 1:]}

    def state_dict(self) -> dict:
        """The data order: the state of this source's random generator."""
        return {"rng": _rng_state(self.rng)}

    def load_state_dict(self, state: dict) -> None:
        """Continue the data order saved by ``state_dict``."""
        _set_rng_state(self.rng, state["rng"])


class DigitBatches:
    """Endless batches of train-split digits, with the diffusion timesteps and noise they are
    trained with, all drawn from this source's own random generator (its state is the data
    order a checkpoint saves, so a resumed run sees exactly the same batches).

    Args:
        batch_size: images per batch.
        n_steps: the diffusion's number of timesteps; t is uniform on 0 .. n_steps - 1.
        seed: seeds the data order.

    Batches: ``images`` (B, 1, 8, 8) in [-1, 1], ``labels`` (B,) long, ``t`` (B,) long,
    ``noise`` (B, 1, 8, 8) standard normal.
    """

    def __init__(self, *, batch_size: int, n_steps: int, seed: int) -> None:
        self.batch_size = check_int("batch_size", batch_size, min_value=1)
        self.n_steps = check_int("n_steps", n_steps, min_value=1)
        self.rng = random.Random(check_int("seed", seed, min_value=0))
        train = load_digits("train")
        self.images, self.labels = train.images(), train.labels

    def next_batch(self) -> dict[str, torch.Tensor]:
        n = len(self.labels)
        index = torch.tensor([self.rng.randrange(n) for _ in range(self.batch_size)])  # (B,)
        draws = torch.Generator().manual_seed(self.rng.getrandbits(63))  # t and noise
        images = self.images[index]  # (B, 1, 8, 8)
        return {
            "images": images,
            "labels": self.labels[index],
            "t": torch.randint(0, self.n_steps, (self.batch_size,), generator=draws),
            "noise": torch.randn(images.shape, generator=draws),
        }

    def state_dict(self) -> dict:
        """The data order: the state of this source's random generator."""
        return {"rng": _rng_state(self.rng)}

    def load_state_dict(self, state: dict) -> None:
        """Continue the data order saved by ``state_dict``."""
        _set_rng_state(self.rng, state["rng"])


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
