"""A user's images as training data: :class:`ImageDataset`, a ``torch.utils.data.Dataset``
of one split of an :class:`~addnorm.data.images.ImageCorpus` at one size, for a
``DataLoader``; and :class:`ImageBatches`, the trainer's batch source for the DiT: such a
dataset drawn by a seeded sampler, with the timesteps, noise and label-dropout draw of each
batch from the same generator.
"""

from __future__ import annotations

import torch

from addnorm.data.batches import DiffusionDraws, LabelledImages, image_batch
from addnorm.data.images import ImageCorpus, to_model_scale
from addnorm.data.sampler import SampledBatches, SeededSampler

__all__ = ["ImageBatches", "ImageDataset"]


class ImageDataset(LabelledImages):
    """One split of an :class:`ImageCorpus` at one size, as a map-style dataset: item ``i``
    is ``(image, label)``, the image float32 (C, S, S) on the DiT's [-1, 1] scale
    (:func:`to_model_scale`), the label an int class id. ``DataLoader(dataset,
    batch_size=..., shuffle=True)`` gives (B, C, S, S) and (B,) batches.

    Args:
        corpus: the images.
        split: ``"train"`` or ``"val"`` (held out).
        image_size: S, the side every image is cropped and resized to.
    """

    def __init__(self, corpus: ImageCorpus, split: str = "train", *, image_size: int) -> None:
        pixels, labels = corpus.split(split, image_size)
        super().__init__(to_model_scale(pixels), labels)
        self.corpus = corpus


class ImageBatches(SampledBatches):
    """Endless batches of random train images for the DiT, with the timesteps, noise and
    label-dropout draws they are trained with (:class:`~addnorm.data.batches.DiffusionDraws`),
    all from this source's own random generator (its state is the data order a checkpoint
    saves: a resumed run sees the same batches; and ``torchrun`` ranks, each keeping its rows
    of the same global batch, see what one process sees, the label dropout included).

    Args:
        images: the train images: an :class:`ImageDataset` (or any
            :class:`~addnorm.data.batches.LabelledImages`), or a tensor (N, C, S, S) of them
            on the [-1, 1] scale.
        labels: with a tensor of images, their class ids (N,); None with a dataset.
        batch_size: images per batch.
        n_steps: the diffusion's timesteps; t is uniform on 0 .. n_steps - 1.
        class_dropout: the probability that a label is replaced by the null class.
        seed: seeds the data order.

    Batches: ``images`` (B, C, S, S), ``labels`` (B,) long, ``t`` (B,) long, ``noise``
    (B, C, S, S) standard normal, ``drop`` (B,) bool (True: the null class).
    """

    def __init__(self, images: LabelledImages | torch.Tensor, labels: torch.Tensor | None = None,
                 *, batch_size: int, n_steps: int, class_dropout: float, seed: int) -> None:
        dataset: LabelledImages
        if isinstance(images, LabelledImages) and labels is None:
            dataset = images
        elif isinstance(images, torch.Tensor) and labels is not None:
            dataset = LabelledImages(images, labels)
        else:
            raise TypeError("ImageBatches takes a dataset of images, or a tensor of images and "
                            f"one of their labels; got {type(images).__name__} and "
                            f"{type(labels).__name__}")
        super().__init__(dataset, SeededSampler(len(dataset), seed), batch_size=batch_size,
                         collate=image_batch, draws=DiffusionDraws(n_steps, class_dropout))
