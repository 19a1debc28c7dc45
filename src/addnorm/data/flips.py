"""Random horizontal flips of a DiT's training images, the augmentation of the DiT reference
(``RandomHorizontalFlip`` in its ImageNet data pipeline): each image of a batch is mirrored
left to right with probability 1/2.

Off by default (``DiTTaskConfig.flip``): a flip keeps the class of photos of things, but not
of writing (a mirrored "2" is no digit of the class), and the data cannot tell which kind it
holds. The flips are drawn from the batch's own generator after what it already draws (the
timesteps, noise and label dropout, :class:`~addnorm.data.batches.DiffusionDraws`), so a run
without flips draws exactly what it drew before, and a resumed run with them sees the same
flips.
"""

from __future__ import annotations

import torch

from addnorm.data.sampler import BatchDraws, SampledBatches

__all__ = ["FlippedDraws", "with_flips"]


class FlippedDraws:
    """``draws`` (the batch's other draws, or None), then one coin per image: ``flipped``
    (B,) bool, True with probability 1/2, and the batch's ``images`` (B, C, H, W) with those
    rows mirrored along the width."""

    def __init__(self, draws: BatchDraws | None) -> None:
        self.draws = draws

    def __call__(self, batch: dict[str, torch.Tensor], generator: torch.Generator
                 ) -> dict[str, torch.Tensor]:
        out = {} if self.draws is None else self.draws(batch, generator)
        images = batch["images"]  # (B, C, H, W)
        flipped = torch.rand(images.shape[0], generator=generator) < 0.5  # (B,)
        out["images"] = torch.where(flipped[:, None, None, None], images.flip(-1), images)
        out["flipped"] = flipped
        return out


def with_flips(batches: SampledBatches) -> SampledBatches:
    """``batches`` with random horizontal flips added to its draws (:class:`FlippedDraws`);
    the same source, changed in place."""
    batches.draws = FlippedDraws(batches.draws)
    return batches
