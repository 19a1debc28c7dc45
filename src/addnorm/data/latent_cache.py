"""The latent cache: images encoded once by a VAE, kept in a memory-mapped file that every
later run on the same images and VAE reads instead of encoding them again (fast-DiT's
pre-extracted features; DiT's own ``train.py`` encodes every batch again).

An entry is a folder ``<root>/latents/<key>`` (the key hashes the images' fingerprint, their
size and colour mode, and the VAE's hash) holding ``latents.bin``, float32 (2N, C, h, w), and
``meta.json`` (the shape, the key's spec, the CRC-32 of ``latents.bin``). The entry is the
token cache's (:mod:`addnorm.data.token_cache`), with its helpers: built under the entry's
``filelock`` lock, each file written under a temporary name and renamed, so a process killed
while encoding (kill -9) leaves a temporary file and no ``meta.json``; the next run, holding
the lock, removes the dead process's file (:func:`~addnorm.data.token_cache.clean_stale`) and
encodes again. An entry that fails its checks is encoded again, said in one logged line.

Rows ``2 i`` and ``2 i + 1`` are image ``i`` and its horizontal mirror. DiT's ``train.py``
flips the picture at random (``RandomHorizontalFlip``) *before* encoding, and a VAE is no
mirror-symmetric function, so the mirror of a latent is not the latent of the mirror: both
are encoded once and cached, and training draws one of the two at random (the key of a draw
picks the row), which is DiT's flip with probability 1/2 at twice the cache's size (the
latents are 1/12 of the uint8 pixels' bytes for an 8x, 4-channel VAE). The encoder's Gaussian
is drawn once per row (as fast-DiT fixes it once per image) by a generator seeded with the
row's number (diffusers' ``latent_dist.sample`` with one generator per image), so an entry
does not depend on the batch size it was encoded with.

The images come as a tensor or as :class:`~addnorm.data.images.PixelRows`, decoded a batch at
a time: encoding holds ``batch_size`` images (each decoded once per batch, for both its rows),
never the data, so a folder larger than memory encodes in bounded memory; the memory map
takes the latents as they come. ``check_read`` (the corpus's fingerprint check) runs once
after the last batch and before ``latents.bin`` is published, so an entry of files that
changed while they were read is never kept.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from addnorm.data.data_errors import DataReadError
from addnorm.data.token_cache import (
    CHECKSUM_BYTES,
    DamagedEntry,
    cache_root,
    checksum,
    clean_stale,
    entry_key,
    entry_lock,
    read_entry_meta,
)
from addnorm.utils.checks import check_int
from addnorm.utils.files import write_file_atomic

if TYPE_CHECKING:
    from addnorm.data.images import PixelRows
    from addnorm.interop.diffusers_vae import LatentVAE

__all__ = ["ENCODE_BATCH", "FORMAT", "cached_latents", "encode_rows", "read_latents"]

# The entry layout (part of every key).
FORMAT = 1
# Rows encoded at once: the VAE's activations and the decoded images are what this bounds
# (the latents go to the memory map as they come).
ENCODE_BATCH = 16
_TEMPORARY = (".latents.bin.tmp-", ".meta.json.tmp-")
_log = logging.getLogger("addnorm")


def encode_rows(pixels: torch.Tensor | PixelRows, vae: LatentVAE, out: np.ndarray, *,
                batch_size: int = ENCODE_BATCH, progress: bool = True) -> None:
    """Encode ``pixels`` into ``out`` as the module docstring says: row ``2 i`` image ``i``,
    row ``2 i + 1`` its mirror, each the VAE's latent draw (generator seeded with the row)
    times its ``scaling_factor``. Grayscale images go to a colour VAE as three equal
    channels. ``pixels`` is indexed once a batch, with the batch's distinct images (a
    :class:`~addnorm.data.images.PixelRows` decodes them then).

    Shapes: pixels (N, C, S, S) uint8 0..255; out (2N, latent_channels, S / f, S / f)
    float32, f the VAE's ``downsample``
    """
    from tqdm import tqdm

    check_int("batch_size", batch_size, min_value=1)
    device = next(vae.parameters()).device
    n = pixels.shape[0]
    with torch.no_grad(), tqdm(total=2 * n, desc="encoding images", unit="image",
                               disable=None if progress else True, leave=False) as bar:
        for start in range(0, 2 * n, batch_size):
            rows = torch.arange(start, min(start + batch_size, 2 * n))
            images, which = (rows // 2).unique(return_inverse=True)
            x = pixels[images][which].float() / 127.5 - 1.0  # (B, C, S, S) on [-1, 1]
            mirrored = rows % 2 == 1
            x[mirrored] = x[mirrored].flip(-1)
            if x.shape[1] != vae.image_channels:
                x = x.expand(-1, vae.image_channels, -1, -1)
            generators = [torch.Generator().manual_seed(int(r)) for r in rows]
            latents = vae.encode(x.to(device), generator=generators)
            out[start : start + len(rows)] = latents.float().cpu().numpy()
            bar.update(len(rows))


def read_latents(folder: Path, spec: dict[str, Any]) -> np.memmap | None:
    """The latents of the entry ``folder`` (a read-only memmap), checked: ``meta.json`` is
    this layout's and names ``spec``, ``latents.bin`` has the recorded shape's bytes and
    CRC-32 (up to ``CHECKSUM_BYTES``). None if there is no ``meta.json`` (never completed);
    :class:`~addnorm.data.token_cache.DamagedEntry` saying what fails otherwise."""
    meta = read_entry_meta(folder)
    if meta is None:
        return None
    try:
        shape, crc, fmt = tuple(int(v) for v in meta["shape"]), meta["crc32"], meta["format"]
        same = meta["spec"] == spec
    except (ValueError, KeyError, TypeError) as err:
        raise DamagedEntry(f"meta.json is not an entry's ({err!r})") from None
    if fmt != FORMAT or not same or len(shape) != 4:
        raise DamagedEntry(f"meta.json is not this entry's (format {fmt!r}, shape {shape})")
    path = folder / "latents.bin"
    try:
        size = path.stat().st_size
    except OSError as err:
        raise DamagedEntry(f"latents.bin cannot be read ({err.strerror or err})") from None
    if size != 4 * int(np.prod(shape)):
        raise DamagedEntry(f"latents.bin has {size} bytes, not the {shape} float32 recorded")
    if size <= CHECKSUM_BYTES and checksum(path) != crc:
        raise DamagedEntry("latents.bin's CRC-32 is not the one recorded")
    return np.memmap(path, dtype=np.float32, mode="r", shape=shape)


def cached_latents(pixels: torch.Tensor | PixelRows, vae: LatentVAE, spec: dict[str, Any], *,
                   cache_dir: str | os.PathLike | None = None, progress: bool = True,
                   batch_size: int = ENCODE_BATCH,
                   check_read: Callable[[], None] | None = None) -> np.ndarray:
    """The latents of ``pixels`` (:func:`encode_rows`), from the cache entry ``spec`` keys
    (the images' fingerprint, size and mode and the VAE's hash: the caller's), encoded and
    written there first if it holds none (or a damaged one), under the entry's lock (another
    process asking meanwhile, a ``torchrun`` rank, waits and reads it). ``check_read`` runs
    after encoding, before anything is published (its error leaves no entry). Where the
    cache cannot be written, a complete entry is still read; otherwise the latents are
    encoded in memory.

    Shapes: pixels (N, C, S, S) uint8; returns (2N, latent_channels, S / f, S / f) float32
    """
    key = entry_key({"latents": FORMAT, **spec})
    folder = cache_root(cache_dir) / "latents" / key
    with entry_lock(folder.with_name(f"{key}.lock")) as unwritable:
        if unwritable is None:
            clean_stale(folder, _TEMPORARY)
        try:
            found = read_latents(folder, spec)
        except DamagedEntry as err:
            _log.warning("addnorm: the latent cache entry %s failed its check (%s); encoding "
                         "the images again", folder, err)
            found = None
        if found is not None:
            return found
        shape = (2 * pixels.shape[0], vae.latent_channels,
                 pixels.shape[-2] // vae.downsample, pixels.shape[-1] // vae.downsample)
        if unwritable is not None:  # nowhere to keep them: in memory, this run only
            latents = np.empty(shape, dtype=np.float32)
            encode_rows(pixels, vae, latents, batch_size=batch_size, progress=progress)
            if check_read is not None:
                check_read()
            return latents
        _write_entry(folder, pixels, vae, spec, shape, batch_size, progress, check_read)
        written = read_latents(folder, spec)
    if written is None:  # pragma: no cover - written just above
        raise DataReadError(f"{folder}: the latent file just written cannot be opened")
    return written


def _write_entry(folder: Path, pixels: torch.Tensor | PixelRows, vae: LatentVAE,
                 spec: dict[str, Any], shape: tuple[int, ...], batch_size: int, progress: bool,
                 check_read: Callable[[], None] | None) -> None:
    """Encode into ``latents.bin`` (a memory map under a temporary name, renamed when whole),
    then publish ``meta.json``: until then the entry is incomplete."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "meta.json").unlink(missing_ok=True)  # a damaged entry's: incomplete from here

    def encode(tmp: Path) -> None:
        out = np.memmap(tmp, dtype=np.float32, mode="w+", shape=shape)
        encode_rows(pixels, vae, out, batch_size=batch_size, progress=progress)
        out.flush()
        del out
        if check_read is not None:  # before the rename: a changed file's entry is never kept
            check_read()

    path = folder / "latents.bin"
    write_file_atomic(path, encode)
    meta = {"format": FORMAT, "shape": list(shape), "spec": spec, "crc32": checksum(path)}
    write_file_atomic(folder / "meta.json", lambda tmp: tmp.write_text(
        json.dumps(meta, indent=1) + "\n", encoding="utf-8"))
