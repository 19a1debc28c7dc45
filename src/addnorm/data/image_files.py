"""A user's image files read for :mod:`addnorm.data.images`: which files are images (the
suffixes Pillow opens; a path's image files, :func:`image_paths`), their headers (mode and
size, without decoding), the one colour kind a data set must share (``GRAY_MODES``: Pillow's
``1``, ``L``, ``LA``; ``COLOUR_MODES``: ``RGB``, ``RGBA``, ``RGBX``, ``P``, ``PA``, ``CMYK``,
``YCbCr``, transparency dropped; 16-bit and floating-point modes refused), each image
decoded, center-cropped and resized (``PIL.ImageOps.fit``, bicubic, which anti-aliases when
it shrinks; a large JPEG first decoded at a reduced scale, Pillow's draft mode), and an
``.npz`` file's ``images`` and ``labels`` arrays checked. Each failure is one
:class:`~addnorm.data.fingerprint.DataError` naming the file (a file that cannot be read:
:class:`~addnorm.data.fingerprint.DataReadError`).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from addnorm.data.fingerprint import (
    DataError,
    DataReadError,
    absolute_path,
    is_glob,
    note_skipped_links,
    resolve_data_files,
    resolve_data_listing,
)

__all__ = [
    "COLOUR_MODES",
    "GRAY_MODES",
    "MAX_IMAGE_SIZE",
    "SHOWN",
    "ImageHeader",
    "array_image",
    "checked_images",
    "checked_labels",
    "common_mode",
    "count_other_files",
    "decode_file",
    "empty_class_folders",
    "fit_image",
    "image_paths",
    "image_suffixes",
    "is_image_name",
    "named_examples",
    "read_header",
    "read_npz",
]

GRAY_MODES = frozenset({"1", "L", "LA", "La"})
COLOUR_MODES = frozenset({"RGB", "RGBA", "RGBa", "RGBX", "P", "PA", "CMYK", "YCbCr"})

# The largest image side an npz or a resize may ask for (a DiT of that size is far past any
# machine's memory; the bound keeps the decoded array's size a plain number).
MAX_IMAGE_SIZE = 4096

SHOWN = 3  # examples named in a message (named_examples)
_UNDECODABLE = "cannot be decoded as an image (damaged, truncated, or not a format Pillow reads)"


@lru_cache(maxsize=1)
def image_suffixes() -> frozenset[str]:
    """The file suffixes (lower case, with the dot) of the formats Pillow can open."""
    from PIL import Image

    Image.init()
    return frozenset(ext.lower() for ext, fmt in Image.registered_extensions().items()
                     if fmt in Image.OPEN)


def is_image_name(path: Path) -> bool:
    """Whether ``path``'s suffix is one of a format Pillow opens (any case)."""
    return path.suffix.lower() in image_suffixes()


def image_paths(path: str | os.PathLike, what: str, follow_links: bool = False
                ) -> tuple[Path, list[Path]]:
    """``(root, files)``: the image files of a folder or glob, or ``[file]`` for an npz; a
    :class:`DataError` for a single other file, an empty npz, or a folder without images
    (naming the other files it holds)."""
    where = f"{what} {os.fspath(path)}"
    text = absolute_path(path)
    if not is_glob(text) and os.path.isfile(text):
        if Path(text).suffix.lower() != ".npz":
            raise DataError(f"{where}: not a folder of images or an .npz file (a single "
                            "image is one example; a class needs at least 2)")
        root, files = resolve_data_files(path, what=what)
        if files[0].stat().st_size == 0:
            raise DataError(f"{where}: is empty (0 bytes)")
        return root, files
    try:
        listing = resolve_data_listing(path, what=what, accept=is_image_name,
                                       kinds="image files", follow_links=follow_links)
        note_skipped_links(where, listing.skipped_links)
        return listing.root, listing.files
    except DataError as err:
        others = _other_files(text)
        if not others:
            raise
        shown = ", ".join(o.name for o in others[:SHOWN])
        raise DataError(
            f"{err} ({len(others)} other file{'s' if len(others) > 1 else ''}: {shown}"
            f"{', ...' if len(others) > SHOWN else ''}; images are files Pillow opens: "
            ".png, .jpg, .gif, .bmp, .webp, .tif, ...)"
        ) from None


def _other_files(text: str) -> list[Path]:
    """The files (not images) a folder or glob holds, for a message; [] if none."""
    try:
        return resolve_data_files(text)[1]
    except DataError:
        return []


def count_other_files(path: str | os.PathLike, n_images: int) -> int:
    """How many files at ``path`` are not images (left out, and counted in the record)."""
    return max(len(_other_files(absolute_path(path))) - n_images, 0)


@dataclass(frozen=True)
class ImageHeader:
    """What an image's header says: its Pillow mode and its width and height."""

    mode: str
    size: tuple[int, int]


def named_examples(names: Sequence[str]) -> str:
    """The first ``SHOWN`` of ``names`` for a message, and how many more there are."""
    shown = ", ".join(names[:SHOWN])
    return shown + (f" and {len(names) - SHOWN} more" if len(names) > SHOWN else "")


def read_header(file: Path) -> ImageHeader:
    """The mode and size of an image file, from its header. A file that cannot be read:
    :class:`DataReadError`; one that is not an image Pillow opens: :class:`DataError`."""
    from PIL import Image

    try:
        with open(file, "rb") as f, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with Image.open(f) as image:
                return ImageHeader(image.mode, image.size)
    except OSError as err:
        if err.errno is not None:  # the system's read failed: not the image's fault
            raise DataReadError(f"{file}: cannot be read ({err.strerror or err})") from None
        raise DataError(f"{file}: {_UNDECODABLE} ({_reason(err)})") from None
    except Exception as err:  # Pillow's parsers raise many kinds on damaged headers
        raise DataError(f"{file}: {_UNDECODABLE} ({_reason(err)})") from None


def _reason(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def empty_class_folders(root: Path, names: Sequence[str]) -> list[str]:
    """The folders directly below ``root`` (names starting with "." and links skipped: a link
    leading out is named as such) that hold none of the images ``names`` (their paths below
    ``root``): class folders a data set leaves out."""
    held = {n.split("/")[0] for n in names if "/" in n}
    try:
        folders = [e.name for e in os.scandir(root)
                   if not e.name.startswith(".") and e.is_dir(follow_symlinks=False)]
    except OSError:
        return []
    return sorted(f for f in folders if f not in held)


def _kind(mode: str) -> str | None:
    return "grayscale" if mode in GRAY_MODES else "colour" if mode in COLOUR_MODES else None


def common_mode(where: str, names: Sequence[str], headers: Sequence[ImageHeader]) -> str:
    """``"L"`` or ``"RGB"``: the one kind of every image; DataError for an unsupported mode or
    images of both kinds."""
    by_kind: dict[str, list[str]] = {}
    for name, header in zip(names, headers, strict=True):
        kind = _kind(header.mode)
        if kind is None:
            raise DataError(
                f"{where}: {name} has mode {header.mode} (16-bit, floating-point or another "
                f"kind Pillow keeps apart); convert it to 8-bit grayscale (L) or colour (RGB)"
            )
        by_kind.setdefault(kind, []).append(f"{name} ({header.mode})")
    if len(by_kind) > 1:
        parts = "; ".join(f"{len(v)} {k} (e.g. {v[0]})" for k, v in sorted(by_kind.items()))
        raise DataError(
            f"{where}: images of mixed modes: {parts}; a model takes one kind: convert them "
            "all to grayscale (L) or all to colour (RGB)"
        )
    return "L" if "grayscale" in by_kind else "RGB"


def decode_file(file: Path, size: int):
    """The image in ``file``, decoded (at a reduced scale no smaller than ``size`` where the
    format allows: Pillow's draft). :class:`DataReadError` if reading fails,
    :class:`DataError` naming the file if Pillow cannot decode it."""
    from PIL import Image

    try:
        with open(file, "rb") as f, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            image = Image.open(f)
            image.draft(None, (size, size))
            image.load()
            return image
    except OSError as err:
        if err.errno is not None:
            raise DataReadError(f"{file}: cannot be read ({err.strerror or err})") from None
        raise DataError(f"{file}: {_UNDECODABLE} ({_reason(err)})") from None
    except Exception as err:  # Pillow's decoders raise many kinds on damaged data
        raise DataError(f"{file}: {_UNDECODABLE} ({_reason(err)})") from None


def array_image(image: np.ndarray):
    """One (H, W, C) uint8 array of an npz as a Pillow image."""
    from PIL import Image

    return Image.fromarray(image[..., 0] if image.shape[-1] == 1 else image)


def fit_image(image, size: int, mode: str) -> np.ndarray:
    """``image`` in ``mode`` ("L" or "RGB"), center-cropped to a square and resized to
    ``size`` (bicubic), as uint8 (C, size, size)."""
    from PIL import Image, ImageOps

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # e.g. a palette's transparency, dropped here
        image = image.convert(mode)
        if image.size != (size, size):
            image = ImageOps.fit(image, (size, size), method=Image.Resampling.BICUBIC)
    array = np.asarray(image, dtype=np.uint8)
    return array[None] if array.ndim == 2 else array.transpose(2, 0, 1)


def read_npz(file: Path, where: str) -> tuple[np.ndarray, np.ndarray | None]:
    """``images`` as uint8 (N, H, W, C) and ``labels`` (N,) or None, checked."""

    try:
        with open(file, "rb") as f:
            loaded = np.load(f, allow_pickle=False)
            if not isinstance(loaded, np.lib.npyio.NpzFile):
                raise DataError(f"{where}: holds one array (an .npy file); an .npz with an "
                                "'images' array is expected (numpy.savez(f, images=...))")
            with loaded as npz:
                if "images" not in npz.files:
                    held = ", ".join(npz.files[:SHOWN]) or "nothing"
                    raise DataError(f"{where}: holds no 'images' array (it holds {held}); "
                                    "save one with numpy.savez(f, images=..., labels=...)")
                images = _member(npz, "images", where)
                labels = _member(npz, "labels", where) if "labels" in npz.files else None
    except DataError:
        raise
    except OSError as err:
        if err.errno is not None:
            raise DataReadError(f"{file}: cannot be read ({err.strerror or err})") from None
        raise DataError(f"{where}: not an .npz file numpy can read ({_reason(err)})") from None
    except Exception as err:  # zipfile, zlib and numpy's format checks raise many kinds
        raise DataError(f"{where}: not an .npz file numpy can read ({_reason(err)})") from None
    return checked_images(images, where), checked_labels(labels, images.shape[0], where)


def _member(npz, name: str, where: str) -> np.ndarray:
    """The array ``name`` of an open npz; :class:`DataError` naming the member when it is
    not one (numpy hands back a member that is not an .npy file as its raw bytes)."""
    value = npz[name]
    if not isinstance(value, np.ndarray):
        raise DataError(f"{where}: its member {name}.npy is not a NumPy array (it holds "
                        f"{len(value)} bytes of something else); save the arrays with "
                        "numpy.savez(f, images=..., labels=...)")
    return value


def checked_images(images: np.ndarray, where: str) -> np.ndarray:
    """An npz's images as uint8 (N, H, W, C) with C 1 or 3; DataError saying what is
    wrong."""
    shape = images.shape
    if images.ndim == 3:
        images = images[..., None]
    elif images.ndim == 4 and shape[-1] not in (1, 3) and shape[1] in (1, 3):
        images = images.transpose(0, 2, 3, 1)  # (N, C, H, W) -> (N, H, W, C)
    if images.ndim != 4 or images.shape[-1] not in (1, 3):
        raise DataError(
            f"{where}: images has shape {shape}; expected (N, H, W) grayscale, or (N, H, W, C) "
            "or (N, C, H, W) with C = 1 or 3 channels"
        )
    n, h, w, _ = images.shape
    if n == 0 or h == 0 or w == 0:
        raise DataError(f"{where}: images has shape {shape}: no images")
    if max(h, w) > MAX_IMAGE_SIZE:
        raise DataError(f"{where}: images of {h} x {w} pixels; at most {MAX_IMAGE_SIZE} a side")
    if images.dtype == np.uint8:
        return np.ascontiguousarray(images)
    if images.dtype.kind in "iu":
        low, high = int(images.min()), int(images.max())
        if low < 0 or high > 255:
            raise DataError(f"{where}: integer images must lie in 0..255, found {low}..{high}")
        return images.astype(np.uint8)
    if images.dtype.kind == "f":
        finite = np.isfinite(images)
        if not finite.all():
            raise DataError(f"{where}: images holds {int((~finite).sum())} non-finite values")
        lowest, highest = float(images.min()), float(images.max())
        if lowest < 0.0 or highest > 1.0:
            raise DataError(f"{where}: float images must lie in [0, 1], found "
                            f"{lowest:g}..{highest:g}")
        return np.round(images * 255.0).astype(np.uint8)
    raise DataError(f"{where}: images of dtype {images.dtype}; expected uint8, integers 0..255 "
                    "or floats in [0, 1]")


def checked_labels(labels: np.ndarray | None, n: int, where: str) -> np.ndarray | None:
    if labels is None:
        return None
    if labels.ndim != 1 or labels.shape[0] != n:
        raise DataError(f"{where}: labels has shape {labels.shape}, but images holds {n} "
                        f"images: one label per image, shape ({n},), is expected")
    if labels.dtype.kind not in "iuUSb":
        if labels.dtype.kind == "f" and np.isfinite(labels).all() and (
            labels == np.round(labels)
        ).all():
            return labels.astype(np.int64)
        raise DataError(f"{where}: labels of dtype {labels.dtype}; expected integers or strings")
    return labels
