"""The data order of training: a seeded, resumable sampler of a map-style ``Dataset``, and the
trainer's batch source built on it.

:class:`SeededSampler` draws item keys with replacement from its own ``random.Random``, whose
state (:func:`rng_state`, JSON) is the data order a checkpoint saves; it is a
``torch.utils.data.Sampler``, so ``DataLoader(dataset, sampler=..., batch_size=B)`` draws the
trainer's items. :class:`SampledBatches` is the trainer's batch source: the same ``Dataset``
users hand to a ``DataLoader``, that sampler, a collate function and, for batches that draw
more than their items (a diffusion's timesteps and noise), a function of a torch generator
seeded from the sampler's next 63 random bits.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import torch
from torch.utils.data import Sampler, default_collate

from addnorm.utils.checks import check_int

__all__ = ["BatchDraws", "SampledBatches", "SeededSampler", "rng_state", "set_rng_state"]


def rng_state(rng: random.Random) -> dict:
    """``rng``'s state as JSON: ``{"version", "internal", "gauss_next"}``."""
    version, internal, gauss = rng.getstate()
    return {"version": version, "internal": list(internal), "gauss_next": gauss}


def set_rng_state(rng: random.Random, state: dict) -> None:
    """Put ``rng`` in the state :func:`rng_state` returned."""
    rng.setstate((state["version"], tuple(state["internal"]), state["gauss_next"]))


class SeededSampler(Sampler[int]):
    """Endless keys of a dataset's items, drawn with replacement from this sampler's own
    ``random.Random``: uniformly from ``0 .. n - 1`` (``rng.randrange(n)``), or by ``draw``
    for items that are not equally likely.

    Args:
        n: how many keys are drawn from (keys ``0 .. n - 1``).
        seed: seeds the order.
        draw: ``rng -> key``, one key drawn from the generator (None: ``rng.randrange(n)``).
    """

    def __init__(self, n: int, seed: int, *,
                 draw: Callable[[random.Random], int] | None = None) -> None:
        self.n = check_int("n", n, min_value=1)
        self.rng = random.Random(check_int("seed", seed, min_value=0))
        self._draw = draw

    def draw(self) -> int:
        """The next key."""
        return self.rng.randrange(self.n) if self._draw is None else self._draw(self.rng)

    def __iter__(self) -> Iterator[int]:
        while True:
            yield self.draw()

    def generator(self) -> torch.Generator:
        """A CPU torch generator seeded by the next 63 random bits (for what a batch draws
        beyond its items)."""
        return torch.Generator().manual_seed(self.rng.getrandbits(63))

    def state_dict(self) -> dict:
        """The order: ``{"rng": rng_state(...)}`` (JSON)."""
        return {"rng": rng_state(self.rng)}

    def load_state_dict(self, state: dict) -> None:
        """Continue the order saved by ``state_dict``."""
        set_rng_state(self.rng, state["rng"])


class BatchDraws(Protocol):
    """What a batch draws beyond its items: ``(batch, generator) -> more tensors``."""

    def __call__(self, batch: dict[str, torch.Tensor], generator: torch.Generator
                 ) -> dict[str, torch.Tensor]: ...


class SampledBatches:
    """Endless training batches of a map-style dataset: ``batch_size`` keys from ``sampler``,
    their items collated, and (with ``draws``) what the batch draws beyond them from a
    generator seeded by the sampler. The state is the sampler's, so a resumed run sees the
    same batches.

    Args:
        dataset: any map-style dataset (``dataset[key]``).
        sampler: the order.
        batch_size: items per batch.
        collate: a list of items -> the batch, a dict of tensors (torch's ``default_collate``
            by default).
        draws: ``(batch, generator) -> tensors`` added to the batch, or None.
    """

    def __init__(
        self,
        dataset: Any,
        sampler: SeededSampler,
        *,
        batch_size: int,
        collate: Callable[[list[Any]], dict[str, torch.Tensor]] = default_collate,
        draws: BatchDraws | None = None,
    ) -> None:
        self.dataset, self.sampler = dataset, sampler
        self.batch_size = check_int("batch_size", batch_size, min_value=1)
        self.collate, self.draws = collate, draws

    @property
    def rng(self) -> random.Random:
        """The sampler's random generator (the data order)."""
        return self.sampler.rng

    def next_batch(self) -> dict[str, torch.Tensor]:
        """The next batch (CPU tensors, first dim ``batch_size``)."""
        keys = [self.sampler.draw() for _ in range(self.batch_size)]
        batch = self.collate([self.dataset[key] for key in keys])
        if self.draws is not None:
            batch.update(self.draws(batch, self.sampler.generator()))
        return batch

    def state_dict(self) -> dict:
        """The data order: the state of the sampler's random generator."""
        return self.sampler.state_dict()

    def load_state_dict(self, state: dict) -> None:
        """Continue the data order saved by ``state_dict``."""
        self.sampler.load_state_dict(state)
