"""The ``dit`` task's images: :class:`ImageData`, what the task needs of them, and their two
kinds: :class:`BundledDigits` (scikit-learn's 8x8 digits, 0..16 pixels) and
:class:`UserImages` (a user's images, an :class:`~addnorm.data.ImageCorpus`, or the record of
one, opened again when training or scoring needs it; uint8 0..255 pixels).

:func:`image_data` makes the images a ``DiTTask`` is given, :func:`image_data_for` the images
a task config names and :func:`image_data_from_dict` the images a checkpoint saved.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Literal, Protocol

import numpy as np
import torch

from addnorm.data.batches import DigitBatches
from addnorm.data.digits import IMAGE_SIZE, MAX_PIXEL, N_CLASSES, load_digits, to_pixel_scale
from addnorm.data.fingerprint import DataRecord
from addnorm.data.image_batches import ImageBatches, ImageDataset
from addnorm.data.images import ImageCorpus, to_pixels
from addnorm.data.sampler import SampledBatches
from addnorm.dit import DiTConfig
from addnorm.tasks.data_source import DataSource, is_data_source, record_files
from addnorm.utils.checks import check_int

if TYPE_CHECKING:
    from addnorm.tasks.image_quality import ImageJudge

__all__ = [
    "MAX_DEFAULT_PATCHES",
    "SAMPLE_CHUNK",
    "BundledDigits",
    "ImageData",
    "Judge",
    "UserImages",
    "default_image_size",
    "image_data",
    "image_data_for",
    "image_data_from_dict",
]

# Samples of a user's images drawn at once (the digits' evaluation draws all at once).
SAMPLE_CHUNK = 100
# The patches a side of the image size a user's images train at by default (at most 64 an
# image, four times the digits'): a step's time grows faster than the patches
# (docs/task-defaults.md measures it), and past this a CPU run of the defaults is too slow.
MAX_DEFAULT_PATCHES = 8


class Judge(Protocol):
    """What scores generated images (``digit_quality.DigitJudge``,
    ``image_quality.ImageJudge``)."""

    def score(self, pixels: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
        """The figures of ``pixels`` (the data's pixel scale) generated for ``labels``."""
        ...


class ImageData(DataSource, Protocol):
    """The images a DiT trains on and is scored against.

    Attributes:
        class_names: the classes, in id order.
        channels: 1 (grayscale) or 3 (RGB).
        pixel_max: the top of the pixel scale of samples (:meth:`to_pixels`).
    """

    class_names: tuple[str, ...]
    channels: int
    pixel_max: float

    @property
    def corpus(self) -> ImageCorpus:
        """A user's images; ValueError for the digits, which have none."""
        ...

    def prepare(self, cfg: DiTConfig) -> DiTConfig:
        """``cfg`` with the images' size, channels and classes."""
        ...

    def size_note(self, cfg: DiTConfig) -> str | None:
        """How the size the images train at for ``cfg`` differs from their own, and why, or
        None."""
        ...

    def check(self, cfg: DiTConfig, batch_size: int) -> None:
        """Raise ValueError if a batch or the scoring cannot be drawn at ``cfg``'s size."""
        ...

    def batches(self, cfg: DiTConfig, *, batch_size: int, n_steps: int, seed: int
                ) -> SampledBatches:
        """Random train images with their timesteps and noise."""
        ...

    def samples_at_once(self, n: int) -> int:
        """How many of ``n`` samples are drawn at once."""
        ...

    def to_pixels(self, x: torch.Tensor) -> torch.Tensor:
        """Samples (N, C, S, S) on the model's [-1, 1] scale as the data's pixels."""
        ...

    def judge(self, image_size: int) -> Judge:
        """What scores samples of size ``image_size``."""
        ...

    def sample_record(self, class_id: int, image: torch.Tensor) -> dict[str, Any]:
        """One sample (a :meth:`to_pixels` image) as JSON for a run's ``metrics.json``."""
        ...


class BundledDigits:
    """scikit-learn's 8x8 digits (:mod:`addnorm.data.digits`): ten classes, one channel."""

    record = None
    class_names = tuple(str(d) for d in range(N_CLASSES))
    channels = 1
    pixel_max = MAX_PIXEL

    @property
    def corpus(self) -> ImageCorpus:
        """None to give: ValueError."""
        raise ValueError("the digits task has no image corpus")

    def train_size(self) -> int:
        """The train digits."""
        return len(load_digits("train"))

    def prepare(self, cfg: DiTConfig) -> DiTConfig:
        """``cfg`` at 8x8, one channel, ten classes."""
        return dataclasses.replace(cfg, input_size=IMAGE_SIZE, in_channels=1,
                                   n_classes=N_CLASSES)

    def size_note(self, cfg: DiTConfig) -> None:
        """None: the digits train at their 8x8."""
        return None

    def check(self, cfg: DiTConfig, batch_size: int) -> None:
        """Nothing: the digits fill any batch."""

    def batches(self, cfg: DiTConfig, *, batch_size: int, n_steps: int, seed: int
                ) -> DigitBatches:
        """Train digits (:class:`~addnorm.data.batches.DigitBatches`; the model draws its
        own label dropout, as every earlier digits run had it)."""
        return DigitBatches(batch_size=batch_size, n_steps=n_steps, seed=seed)

    def samples_at_once(self, n: int) -> int:
        """All of them."""
        return n

    def to_pixels(self, x: torch.Tensor) -> torch.Tensor:
        """(N, 8, 8) on the 0..16 scale, float32."""
        return to_pixel_scale(x[:, 0].float())

    def judge(self, image_size: int) -> Judge:
        """The digits' judge (:func:`~addnorm.tasks.digit_quality.digit_judge`)."""
        from addnorm.tasks.digit_quality import digit_judge

        return digit_judge()

    def sample_record(self, class_id: int, image: torch.Tensor) -> dict[str, Any]:
        """The class id and the 8x8 pixels, to two decimals."""
        return {"class": class_id,
                "pixels": [[round(v, 2) for v in row] for row in image.tolist()]}

    def to_dict(self) -> dict:
        """Nothing: the digits are the default."""
        return {}

    def run_files(self) -> dict[str, str]:
        """None: the digits ship with scikit-learn."""
        return {}


class UserImages:
    """A user's images (:class:`~addnorm.data.ImageCorpus`).

    Args:
        record: the record of the files (its classes and colour mode name the model's).
        corpus: the images, if already open; None opens ``record``'s files (checked
            unchanged) on first use.
        image_size: the side the images are resized to; ``"data"``: the side
            :func:`default_image_size` picks from the images' own sizes and the model's
            patch size (a new run's default); None: the model config's ``input_size`` (a
            trained model's, ``prepare``).
    """

    pixel_max = 255.0

    def __init__(self, record: DataRecord, *, corpus: ImageCorpus | None = None,
                 image_size: int | Literal["data"] | None = None) -> None:
        self.record, self._corpus = record, corpus
        self.image_size: int | Literal["data"] | None = (
            image_size if image_size is None or image_size == "data"
            else check_int("image_size", image_size, min_value=1))
        self.class_names, self.channels = _classes_of(record)
        self._judges: dict[tuple[int, bool], ImageJudge] = {}

    @property
    def corpus(self) -> ImageCorpus:
        """The images (the recorded files opened again, and checked unchanged, on first
        use)."""
        if self._corpus is None:
            self._corpus = ImageCorpus.reopen(self.record)
        return self._corpus

    def train_size(self) -> int:
        """The train images."""
        return len(self.corpus.train_index)

    def prepare(self, cfg: DiTConfig) -> DiTConfig:
        """``cfg`` at ``image_size`` (the data's default: :func:`default_image_size`; None:
        its own ``input_size``), which ``patch_size`` must divide, with the images'
        channels and classes."""
        if self.image_size == "data":
            size = default_image_size(self.corpus.sizes, cfg.patch_size)[0]
        else:
            size = self.image_size or cfg.input_size
        if size % cfg.patch_size:
            origin = "" if self.image_size else " (image_size is the model's input_size)"
            raise ValueError(
                f"image_size ({size}) must be divisible by patch_size ({cfg.patch_size}){origin}"
            )
        return dataclasses.replace(cfg, input_size=size, in_channels=self.channels,
                                   n_classes=len(self.class_names))

    def size_note(self, cfg: DiTConfig) -> str | None:
        """How the size the images train at for ``cfg`` differs from their own, and why,
        where the data picked it (:func:`default_image_size`); None where it is their size
        or a size asked for."""
        if self.image_size != "data":
            return None
        return default_image_size(self.corpus.sizes, cfg.patch_size)[1]

    def check(self, cfg: DiTConfig, batch_size: int) -> None:
        """The splits' sizes (:meth:`check_splits`), and every image must decode at the
        model's size (done here, so a damaged file is named before anything is written)."""
        self.check_splits(batch_size)
        self.corpus.pixels(cfg.input_size)

    def check_splits(self, batch_size: int) -> None:
        """The train split must fill a batch and the held-out split hold 2 images (a
        Fréchet distance needs a spread); a run read back from its checkpoint must find them
        as recorded (``DataChangedError`` otherwise)."""
        corpus = self.corpus
        n_train, n_held = len(corpus.train_index), len(corpus.val_index)
        if n_train < batch_size:
            raise ValueError(
                f"the train split holds {n_train} images, fewer than a batch (batch_size "
                f"{batch_size}): use a smaller batch_size or add images"
            )
        if n_held < 2:
            raise ValueError(
                f"the held-out split holds {n_held} image; scoring needs at least 2 (a "
                "Fréchet distance needs a spread): add images or raise val_fraction"
            )

    def batches(self, cfg: DiTConfig, *, batch_size: int, n_steps: int, seed: int
                ) -> ImageBatches:
        """Train images of :class:`~addnorm.data.ImageDataset` at the model's size, with the
        label dropout drawn by the batches (:class:`~addnorm.data.ImageBatches`), not inside
        the model, so that ``torchrun`` ranks, each keeping its rows of one global batch,
        train exactly as one process does."""
        train = ImageDataset(self.corpus, "train", image_size=cfg.input_size)
        return ImageBatches(train, batch_size=batch_size, n_steps=n_steps,
                            class_dropout=cfg.class_dropout, seed=seed)

    def samples_at_once(self, n: int) -> int:
        """At most ``SAMPLE_CHUNK``."""
        return min(n, SAMPLE_CHUNK)

    def to_pixels(self, x: torch.Tensor) -> torch.Tensor:
        """(N, C, S, S) uint8 0..255 (:func:`~addnorm.data.images.to_pixels`)."""
        return to_pixels(x)

    def judge(self, image_size: int, *, bounded: bool = False) -> ImageJudge:
        """The judge at ``image_size``, fitted once on the train split and compared with the
        held-out one (:class:`~addnorm.tasks.image_quality.ImageJudge`). ``bounded`` (a run on
        a VAE's latents, whose images may not fit in memory): only the fixed draws of at most
        ``MAX_REFERENCE`` train and held-out images (``reference_draw``) are decoded, the
        pixels of the whole data never: the same fit, its nearest-train distance searched
        over the draw, and the held-out figures over theirs."""
        from addnorm.tasks.image_quality import ImageJudge, reference_draw

        if (image_size, bounded) not in self._judges:
            corpus, labels = self.corpus, torch.from_numpy(self.corpus.labels)
            if bounded:
                parts = [index[reference_draw(len(index))]
                         for index in (corpus.train_index, corpus.val_index)]
                (train, held) = (corpus.rows(index, image_size) for index in parts)
                train_labels, held_labels = (labels[torch.from_numpy(i)] for i in parts)
            else:
                train, train_labels = corpus.split("train", image_size)
                held, held_labels = corpus.split("val", image_size)
            self._judges[image_size, bounded] = ImageJudge.fit(
                train, train_labels, held, held_labels, self.class_names)
        return self._judges[image_size, bounded]

    def sample_record(self, class_id: int, image: torch.Tensor) -> dict[str, Any]:
        """The class's name and the (S, S) or (S, S, C) pixels (``"max": 255``)."""
        channels_last = image[0] if image.shape[0] == 1 else image.permute(1, 2, 0)
        return {"class": self.class_names[class_id], "pixels": channels_last.tolist(),
                "max": 255}

    def to_dict(self) -> dict:
        """The record."""
        return {"data": self.record.to_dict()}

    def run_files(self) -> dict[str, str]:
        """``data.json``, the record."""
        return record_files(self.record)


def image_data(data: ImageData | ImageCorpus | DataRecord | None = None,
               image_size: int | None = None) -> ImageData:
    """The images ``DiTTask(data=data, image_size=image_size)`` trains on: ``data`` itself
    (an :class:`ImageData`), an :class:`~addnorm.data.ImageCorpus` (``image_size`` None:
    the size :func:`default_image_size` picks), the
    :class:`~addnorm.data.fingerprint.DataRecord` of one (a trained run's: None is the
    model's ``input_size``), or None: the digits (which have one size; ``image_size`` is for
    a user's images)."""
    if data is None:
        return BundledDigits()
    if isinstance(data, ImageCorpus):
        return UserImages(data.record, corpus=data, image_size=image_size or "data")
    if isinstance(data, DataRecord):
        return UserImages(data, image_size=image_size)
    if is_data_source(data):
        if image_size is not None:
            raise TypeError("an ImageData carries its own image_size")
        return data
    raise TypeError(f"data must be an ImageCorpus, a DataRecord or None, got {data!r}")


def image_data_for(task_cfg: Any) -> ImageData:
    """The images a ``DiTTaskConfig`` names: the digits, or its ``data`` (headers read and
    files fingerprinted here; the pixels are decoded by ``check``)."""
    if task_cfg.data is None:
        return BundledDigits()
    corpus = ImageCorpus.build(task_cfg.data, val_fraction=task_cfg.val_fraction,
                               follow_links=task_cfg.follow_links)
    return UserImages(corpus.record, corpus=corpus, image_size=task_cfg.image_size or "data")


def image_data_from_dict(data: dict) -> ImageData:
    """The images a checkpoint's task data names (its ``"data"`` record, if any)."""
    record = data.get("data")
    return image_data(None if record is None else DataRecord.from_dict(record))


def default_image_size(sizes: np.ndarray, patch_size: int) -> tuple[int, str | None]:
    """The side a user's images train at when no ``image_size`` is asked for, and one line
    saying how it differs from the images' own and why (None: it is their size).

    Each image is center-cropped to a square of its shorter side; the data's side is that
    side when the images share one, else the median (the lower one) of their shorter sides.
    The size is the data's side, at most ``MAX_DEFAULT_PATCHES`` patches of ``patch_size``
    (64 an image: 16x16 at patch size 2, the default), rounded down to a multiple of
    ``patch_size`` (at least one patch). Bigger images cost a CPU run too much by default:
    ``image_size`` (and a ``patch_size`` that keeps the patches few) trains at their size.

    Args:
        sizes: (N, 2) each image's width and height (``ImageCorpus.sizes``).
        patch_size: the model's patch side.
    """
    check_int("patch_size", patch_size, min_value=1)
    sizes = np.asarray(sizes).reshape(-1, 2)
    if not len(sizes):
        raise ValueError("no images to size")
    sides = sizes.min(axis=1)
    side = int(np.sort(sides)[(len(sides) - 1) // 2])
    cap = MAX_DEFAULT_PATCHES * patch_size
    size = max(min(side, cap) // patch_size * patch_size, patch_size)
    width, height = (int(v) for v in sizes[0])
    one_size = bool((sizes == sizes[0]).all())
    if one_size and width == height and size == side:
        return size, None
    if one_size and width == height:
        what = f"training at {size}x{size}, not your images' {side}x{side}"
    elif one_size:
        what = (f"your images are {width}x{height}, each center-cropped to a square; "
                f"training at {size}x{size}")
    else:
        what = (f"your images are of {len(np.unique(sizes, axis=0))} sizes (shorter sides "
                f"{int(sides.min())} to {int(sides.max())}, median {side}), each "
                f"center-cropped to a square; training at {size}x{size}")
    if size > side:
        return size, f"{what}: one patch at least (patch_size {patch_size})"
    if side > cap:
        # The smallest patch that puts the data's side within MAX_DEFAULT_PATCHES a side.
        patch = next(p for p in range(-(-side // MAX_DEFAULT_PATCHES), side + 1)
                     if side % p == 0)
        return size, (
            f"{what}: at patch_size {patch_size}, {side}x{side} is "
            f"{(side // patch_size) ** 2} patches an image ({size}x{size}: "
            f"{(size // patch_size) ** 2}), and a step's time grows faster than the patches, "
            f"too slow for the defaults on a CPU; image_size {side} trains at their size, "
            f"with patch_size {patch} at {(side // patch) ** 2} patches"
        )
    if size < side:
        return size, f"{what}: the side must be a multiple of patch_size {patch_size}"
    return size, f"{what}, their median" if not one_size else what


def _classes_of(record: DataRecord) -> tuple[tuple[str, ...], int]:
    """The class names and channels a record of images holds; ValueError if it holds none."""
    classes, mode = record.details.get("classes"), record.details.get("mode")
    if record.kind != "images" or mode not in ("L", "RGB") or not (
        isinstance(classes, list) and classes
        and all(isinstance(c, str) for c in classes) and len(set(classes)) == len(classes)
    ):
        raise ValueError(f"{record.path}: not a record of images (kind {record.kind!r}, mode "
                         f"{mode!r}, classes {classes!r})")
    return tuple(classes), 1 if mode == "L" else 3

