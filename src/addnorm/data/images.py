"""A user's images for the Diffusion Transformer: a folder in the ImageFolder convention or an
``.npz`` file, decoded by Pillow, split into train and held-out images by a recorded rule.

- A folder: one subfolder per class (its name is the class's name; images below it at any
  depth belong to it), or images directly in the folder: one class, named after the folder
  (unconditional). A folder that holds both is refused. Files are images by their suffix,
  any format Pillow opens (``.png``, ``.jpg``, ``.gif``, ``.bmp``, ``.webp``, ``.tif`` ...);
  other files are left out (counted in the record); names starting with "." are skipped.
  A glob (``"pics/*/*.png"``) works as the folder its fixed part names.
- An ``.npz`` file (``numpy.savez``): an ``images`` array, (N, H, W) grayscale or (N, H, W, C)
  / (N, C, H, W) with C 1 or 3, of ``uint8`` (or integers 0..255, or floats in [0, 1],
  rounded to 0..255), and an optional ``labels`` array (N,) of integers or strings: the
  classes are its distinct values, sorted, named by their text.

Images are kept as found, grayscale (one channel) or colour (RGB, three; transparency
dropped); a data set of both kinds is refused, and so are 16-bit and floating-point images.
Each image is center-cropped to a square and resized to the image size
(:mod:`addnorm.data.image_files` reads, checks and decodes the files).

:meth:`ImageCorpus.build` reads the names, classes, modes and sizes (the images' headers
only) and fingerprints the files (:mod:`addnorm.data.fingerprint`); the pixels are decoded
on first use at the size asked for (:meth:`ImageCorpus.pixels`), into memory (N * C * S * S
bytes: 400 images of 32 x 32 RGB are 1.2 MB), once per size; or a few rows at a time
(:meth:`ImageCorpus.rows`, :class:`PixelRows`), kept nowhere, for data larger than memory
(the latent cache's encoding). Held out: in each class, the
``round(val_fraction * n)`` images (at least 1, at most n - 1) whose names' CRC-32 is
smallest (a folder's: the file's path below the folder; an npz's: ``images[i]``), the same
in every process and run, so each class needs at least 2 images.

Bad data raises one :class:`~addnorm.data.fingerprint.DataError` naming the path, and the
file where one is to blame (an image Pillow cannot decode is found from its header when the
data is read, or when it is decoded); a file that cannot be read, or changes while it is
read, raises :class:`~addnorm.data.fingerprint.DataReadError` (an ``OSError``).

:mod:`addnorm.data.image_batches` holds the corpus's dataset and the DiT's batches of it.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from addnorm.data.fingerprint import (
    DataError,
    DataFingerprint,
    DataReadError,
    DataRecord,
    absolute_path,
    data_note,
    fingerprint_files,
    is_glob,
    reopening,
)
from addnorm.data.image_files import (
    COLOUR_MODES,
    GRAY_MODES,
    MAX_IMAGE_SIZE,
    SHOWN,
    array_image,
    common_mode,
    count_other_files,
    decode_file,
    empty_class_folders,
    fit_image,
    image_paths,
    image_suffixes,
    named_examples,
    read_header,
    read_npz,
)
from addnorm.utils.checks import check_choice, check_float, check_int

__all__ = [
    "COLOUR_MODES",
    "DEFAULT_VAL_FRACTION",
    "GRAY_MODES",
    "ImageCorpus",
    "PixelRows",
    "image_suffixes",
    "to_model_scale",
    "to_pixels",
]

DEFAULT_VAL_FRACTION = 0.2
_SPLITS = ("train", "val")


def to_model_scale(pixels: torch.Tensor) -> torch.Tensor:
    """0..255 pixels (uint8) as the DiT's [-1, 1] float32: ``x = pixels / 127.5 - 1``."""
    return pixels.float() / 127.5 - 1.0


def to_pixels(x: torch.Tensor) -> torch.Tensor:
    """The DiT's scale back to 0..255 pixels, rounded and clipped, as uint8."""
    return ((x.float() + 1.0) * 127.5).round().clamp(0.0, 255.0).to(torch.uint8)


class ImageCorpus:
    """A user's images: their classes, labels, mode and held-out split, the record of their
    files, and their pixels at any size (decoded on first use).

    Build one with :meth:`build` (or :meth:`reopen`, from a run's record).

    Attributes:
        classes: the class names, in id order (a folder's subfolders, sorted; an npz's
            distinct labels, sorted; one class: the folder's or file's name).
        labels: (N,) int64 class ids, in the images' order (by name; an npz's own order).
        names: (N,) each image's name (its path below the folder, or ``images[i]``).
        mode: ``"L"`` (grayscale) or ``"RGB"``; ``channels`` is 1 or 3.
        sizes: (N, 2) int64, each image's width and height as stored (from its header).
        train_index, val_index: the images of each split (sorted positions).
        record: the files, split and classes (:class:`DataRecord`).
    """

    def __init__(
        self,
        *,
        names: Sequence[str],
        labels: np.ndarray,
        classes: Sequence[str],
        mode: str,
        sizes: Sequence[tuple[int, int]],
        record: DataRecord,
        val_fraction: float,
        files: Sequence[Path] = (),
        root: Path | None = None,
        array: np.ndarray | None = None,
    ) -> None:
        self.names, self.classes = tuple(names), tuple(classes)
        self.labels = np.asarray(labels, dtype=np.int64)
        self.mode, self.record = mode, record
        self.channels = 1 if mode == "L" else 3
        self.sizes = np.asarray(sizes, dtype=np.int64).reshape(-1, 2)
        self._files, self._root, self._array = list(files), root, array
        self.train_index, self.val_index = _split(self.names, self.labels, val_fraction)
        self._pixels: dict[int, torch.Tensor] = {}

    # ---------------------------------------------------------------- building and opening

    @classmethod
    def build(
        cls, path: str | os.PathLike, *, val_fraction: float = DEFAULT_VAL_FRACTION,
        what: str = "data", follow_links: bool = False,
    ) -> ImageCorpus:
        """The images at ``path``: a folder (or glob) of image files, or an ``.npz`` file
        (see the module docstring). Reads the headers only; the pixels come with
        :meth:`pixels`. Raises :class:`DataError` (messages start with ``what`` and the
        path) for data that cannot be used, :class:`DataReadError` for a file that cannot be
        read. A folder's links leading outside it are read only with ``follow_links``."""
        check_float("val_fraction", val_fraction, min_value=0.0, min_inclusive=False,
                    max_value=0.5)
        root, files = image_paths(path, what, follow_links)
        fingerprint = fingerprint_files(files, root)
        if os.path.isfile(absolute_path(path)):  # image_paths takes no other file
            corpus = cls._from_npz(path, files[0], fingerprint, val_fraction, what)
        else:
            corpus = cls._from_folder(path, root, files, fingerprint, val_fraction, what)
        if follow_links:
            corpus.record.details["follow_links"] = True
        return corpus

    @classmethod
    def reopen(cls, record: DataRecord) -> ImageCorpus:
        """The images ``record`` describes (a run's). Raises :class:`DataChangedError` naming
        what changed if the files no longer fingerprint as recorded (or are gone)."""
        follow = bool(record.details.get("follow_links", False))
        with reopening(record):
            fraction = float(record.split["val_fraction"])
            root, files = image_paths(record.path, "data", follow)
        record.check_unchanged(fingerprint_files(files, root), files=files, root=root)
        return cls.build(record.path, val_fraction=fraction, follow_links=follow)

    @classmethod
    def _from_folder(
        cls, path: str | os.PathLike, root: Path, files: list[Path],
        fingerprint: DataFingerprint, val_fraction: float, what: str,
    ) -> ImageCorpus:
        where = f"{what} {os.fspath(path)}"
        names = [f.relative_to(root).as_posix() for f in files]
        top = [n for n in names if "/" not in n]
        nested = [n for n in names if "/" in n]
        if top and nested:
            raise DataError(
                f"{where}: holds images both at its top ({named_examples(top)}) and in class "
                f"folders ({named_examples(sorted({n.split('/')[0] + '/' for n in nested}))}); put "
                "every image in a class folder, or all at the top for one class"
            )
        if nested:
            classes = sorted({n.split("/")[0] for n in names})
            index = {c: i for i, c in enumerate(classes)}
            labels = np.array([index[n.split("/")[0]] for n in names], dtype=np.int64)
        else:
            classes = [root.name or "images"]
            labels = np.zeros(len(names), dtype=np.int64)
        _check_class_sizes(where, classes, labels, names)
        headers = [read_header(f) for f in files]
        mode = common_mode(where, names, headers)
        record = _record(path, fingerprint, "folder", classes, labels, mode, val_fraction,
                         ignored=count_other_files(path, len(files)))
        empty = empty_class_folders(root, names) if nested and not is_glob(
            absolute_path(path)) else []
        if empty:  # a class with no images is no class: said, and recorded
            data_note(f"{where}: {len(empty)} class folder{'s' if len(empty) > 1 else ''} "
                      f"without images left out: {named_examples(empty)}")
            record.details["empty_class_folders"] = empty
        return cls(names=names, labels=labels, classes=classes, mode=mode,
                   sizes=[h.size for h in headers], record=record,
                   val_fraction=val_fraction, files=files, root=root)

    @classmethod
    def _from_npz(
        cls, path: str | os.PathLike, file: Path, fingerprint: DataFingerprint,
        val_fraction: float, what: str,
    ) -> ImageCorpus:
        where = f"{what} {os.fspath(path)}"
        images, raw_labels = read_npz(file, where)
        n = images.shape[0]
        if raw_labels is None:
            classes = [file.stem or "images"]
            labels = np.zeros(n, dtype=np.int64)
        else:
            values, labels = np.unique(raw_labels, return_inverse=True)
            classes = [str(v) for v in values.tolist()]
            if len(set(classes)) != len(classes):  # e.g. 1 and 1.0 in a float array
                raise DataError(f"{where}: its labels {named_examples(classes)} do not name "
                                "distinct classes")
            labels = labels.reshape(-1).astype(np.int64)
        names = [f"images[{i}]" for i in range(n)]
        _check_class_sizes(where, classes, labels, names)
        mode = "L" if images.shape[-1] == 1 else "RGB"
        record = _record(path, fingerprint, "npz", classes, labels, mode, val_fraction)
        return cls(names=names, labels=labels, classes=classes, mode=mode,
                   sizes=[(images.shape[2], images.shape[1])] * n, record=record,
                   val_fraction=val_fraction, array=images)

    # ---------------------------------------------------------------- the images

    @property
    def n_classes(self) -> int:
        """How many classes (1: unconditional)."""
        return len(self.classes)

    def __len__(self) -> int:
        return len(self.names)

    def pixels(self, image_size: int, *, progress: bool = True) -> torch.Tensor:
        """Every image at ``image_size`` x ``image_size`` as uint8 (N, C, S, S), decoded on
        the first call for that size (a progress bar on a terminal). Raises
        :class:`DataError` naming an image Pillow cannot decode and :class:`DataReadError`
        for a file that cannot be read or changed since it was fingerprinted."""
        _check_image_size(image_size)
        if image_size not in self._pixels:
            if len(self._pixels) >= 2:  # one size a run trains at, and one more at most
                self._pixels.pop(next(iter(self._pixels)))
            self._pixels[image_size] = self._decode(image_size, progress)
        return self._pixels[image_size]

    def split(self, split: str, image_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``"train"`` or ``"val"`` (held-out) images as uint8 (n, C, S, S) and their
        labels (n,) int64."""
        check_choice("split", split, _SPLITS)
        index = torch.from_numpy(self.train_index if split == "train" else self.val_index)
        return self.pixels(image_size)[index], torch.from_numpy(self.labels)[index]

    def rows(self, index: torch.Tensor | np.ndarray, image_size: int) -> torch.Tensor:
        """The images ``index`` (positions, any order) at ``image_size`` as uint8 (n, C, S,
        S), the very pixels :meth:`pixels` gives: taken from them where that size was decoded,
        else decoded now and kept nowhere (memory bounded by ``n``, not the data's size).
        The files are not fingerprinted again here: :meth:`check_unchanged` does that once
        after a pass. Raises as :meth:`pixels` does for a file that cannot be decoded."""
        index = torch.as_tensor(index, dtype=torch.int64)
        if image_size in self._pixels:
            return self._pixels[image_size][index]
        out = np.empty((len(index), self.channels, image_size, image_size), dtype=np.uint8)
        for j, i in enumerate(index.tolist()):
            out[j] = self._decode_one(i, image_size)
        return torch.from_numpy(out)

    def check_unchanged(self) -> None:
        """:class:`DataReadError` if a folder's files no longer fingerprint as when the corpus
        was built (changed while they were read); an npz was read whole when built."""
        if self._root is None:
            return
        now = fingerprint_files(self._files, self._root)
        if now.digest != self.record.fingerprint.digest:
            changed = "; ".join(self.record.fingerprint.changes(now)[:SHOWN])
            raise DataReadError(f"{self.record.path}: changed while it was read ({changed})")

    def _decode_one(self, i: int, size: int) -> np.ndarray:
        """Image ``i`` at ``size`` as uint8 (C, S, S)."""
        if self._array is None:
            return fit_image(decode_file(self._files[i], size), size, self.mode)
        if self._array.shape[1:3] == (size, size):  # already square at this size: exact
            return self._array[i].transpose(2, 0, 1)
        return fit_image(array_image(self._array[i]), size, self.mode)

    def _decode(self, size: int, progress: bool) -> torch.Tensor:
        if self._array is not None and self._array.shape[1:3] == (size, size):
            return torch.from_numpy(np.ascontiguousarray(self._array.transpose(0, 3, 1, 2)))
        from tqdm import tqdm

        out = np.empty((len(self), self.channels, size, size), dtype=np.uint8)
        for i in tqdm(range(len(self)), desc="decoding images", unit="image", leave=False,
                      disable=None if progress and self._array is None else True):
            out[i] = self._decode_one(i, size)
        self.check_unchanged()
        return torch.from_numpy(out)

    def __repr__(self) -> str:
        return (f"ImageCorpus({self.record.path!r}, {len(self)} {self.mode} images, "
                f"classes={list(self.classes)[:SHOWN]}{'...' if self.n_classes > SHOWN else ''}"
                f", train={len(self.train_index)}, held_out={len(self.val_index)})")


class PixelRows:
    """An :class:`ImageCorpus`'s images at one size, decoded when indexed (``rows[index]``:
    :meth:`ImageCorpus.rows`), so a pass over them a batch at a time holds a batch, not the
    data: what the latent cache encodes from.

    Attributes:
        shape: (N, C, S, S), as the tensor of :meth:`ImageCorpus.pixels` would have it.
    """

    def __init__(self, corpus: ImageCorpus, image_size: int) -> None:
        _check_image_size(image_size)
        self.corpus, self.image_size = corpus, image_size
        self.shape = (len(corpus), corpus.channels, image_size, image_size)

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, index: torch.Tensor) -> torch.Tensor:
        """The images ``index`` (n,) as uint8 (n, C, S, S)."""
        return self.corpus.rows(index, self.image_size)


def _check_image_size(image_size: int) -> None:
    """A side the images can be decoded at: 1 .. ``MAX_IMAGE_SIZE``."""
    check_int("image_size", image_size, min_value=1)
    if image_size > MAX_IMAGE_SIZE:
        raise ValueError(f"image_size ({image_size}) must be <= {MAX_IMAGE_SIZE}")


def _check_class_sizes(where: str, classes: Sequence[str], labels: np.ndarray,
                       names: Sequence[str]) -> None:
    """Every class needs an image to train on and one to hold out."""
    small = np.flatnonzero(np.bincount(labels, minlength=len(classes)) < 2).tolist()
    if small:
        first = next(n for n, label in zip(names, labels.tolist(), strict=True)
                     if label == small[0])
        which = "class" if len(classes) > 1 else "its one class"
        raise DataError(
            f"{where}: {which} {classes[small[0]]!r} holds one image ({first}); every class "
            "needs at least 2 (one to train on, one held out)"
            + (f" ({len(small) - 1} more such classes)" if len(small) > 1 else "")
        )


def _split(names: Sequence[str], labels: np.ndarray, val_fraction: float
           ) -> tuple[np.ndarray, np.ndarray]:
    """The held-out rule of the module docstring: ``(train_index, val_index)``."""
    held: list[int] = []
    for c in range(int(labels.max()) + 1 if len(labels) else 0):
        members = np.flatnonzero(labels == c).tolist()
        n_val = min(max(round(val_fraction * len(members)), 1), len(members) - 1)
        ranked = sorted(members, key=lambda i: (zlib.crc32(names[i].encode("utf-8")), names[i]))
        held += ranked[:n_val]
    val = np.array(sorted(held), dtype=np.int64)
    train = np.setdiff1d(np.arange(len(names)), val).astype(np.int64)
    return train, val


def _record(
    path: str | os.PathLike, fingerprint: DataFingerprint, fmt: str, classes: Sequence[str],
    labels: np.ndarray, mode: str, val_fraction: float, *, ignored: int = 0,
) -> DataRecord:
    counts = np.bincount(labels, minlength=len(classes)).tolist()
    n_val = sum(min(max(round(val_fraction * n), 1), n - 1) for n in counts)
    split = {
        "val_fraction": val_fraction,
        "rule": "held out: in each class, the round(val_fraction * n) images (at least 1, at "
                "most n - 1) whose names' CRC-32 (UTF-8) is smallest",
        "train_images": len(labels) - n_val,
        "val_images": n_val,
    }
    details: dict[str, Any] = {
        "format": fmt, "mode": mode, "classes": list(classes), "class_sizes": counts,
    }
    if ignored:
        details["other_files_left_out"] = ignored
    return DataRecord(absolute_path(path), "images", fingerprint, split, None, details)
