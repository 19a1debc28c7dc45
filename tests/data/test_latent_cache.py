"""The latent cache: what it holds, that it is encoded once, and what an interrupted encoding
leaves (the next run completes the entry).

Provenance: each cached row equals diffusers' own ``vae.encode(x).latent_dist.sample(
generator) * scaling_factor`` (DiT's ``train.py`` convention) on the image, or on its mirror
``x.flip(-1)`` (``RandomHorizontalFlip`` before encoding), with a generator seeded by the
row's number, computed here by diffusers on one image at a time; the tolerance is
``FLOAT32_MODEL`` (the cache encodes a batch at once, and a batched convolution may round
otherwise than one image's). An entry built after an interruption equals an uninterrupted
one bit for bit (the same arithmetic on the same batches).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import numpy as np
import pytest
import torch
from small_pipeline import autoencoder
from tolerances import FLOAT32_MODEL

import addnorm
from addnorm.data.latent_cache import cached_latents, encode_rows
from addnorm.interop.diffusers_vae import LatentVAE, load_vae

pytest.importorskip("diffusers")
SPEC = {"data": "d" * 64, "image_size": 16, "mode": "RGB", "vae": "v" * 64}


@pytest.fixture(scope="module")
def vae(tmp_path_factory):
    folder = tmp_path_factory.mktemp("vae")
    autoencoder().save_pretrained(folder)
    return load_vae(folder)


@pytest.fixture(scope="module")
def pixels():
    """(5, 3, 16, 16) uint8 images."""
    return torch.randint(0, 256, (5, 3, 16, 16), dtype=torch.uint8,
                         generator=torch.Generator().manual_seed(3))


def _entry(cache):
    return next((cache / "latents").glob("*/latents.bin"))


def _folder(cache):
    """The one entry's folder (beside it: its lock file)."""
    (folder,) = [p for p in (cache / "latents").iterdir() if p.is_dir()]
    return folder


def test_rows_are_diffusers_draws_of_each_image_and_its_mirror(vae, pixels, cache):
    latents = cached_latents(pixels, vae, SPEC, batch_size=3, progress=False)
    assert latents.shape == (10, 4, 8, 8) and latents.dtype == np.float32
    autoencoder_kl = vae.autoencoder
    for row in range(10):
        x = pixels[row // 2 : row // 2 + 1].float() / 127.5 - 1
        if row % 2:
            x = x.flip(-1)
        with torch.no_grad():
            draw = autoencoder_kl.encode(x).latent_dist.sample(
                generator=torch.Generator().manual_seed(row))
        expected = draw * autoencoder_kl.config.scaling_factor
        torch.testing.assert_close(torch.from_numpy(np.array(latents[row:row + 1])), expected,
                                   **FLOAT32_MODEL)


def test_a_second_run_reads_the_entry_without_encoding(vae, pixels, cache, monkeypatch):
    first = np.array(cached_latents(pixels, vae, SPEC, progress=False))
    stat = _entry(cache).stat()
    calls = []
    real = LatentVAE.encode
    monkeypatch.setattr(LatentVAE, "encode", lambda self, *a, **k: calls.append(1) or real(
        self, *a, **k))
    again = cached_latents(pixels, vae, SPEC, progress=False)
    assert calls == [] and np.array_equal(np.array(again), first)
    now = _entry(cache).stat()
    assert (now.st_ino, now.st_mtime_ns) == (stat.st_ino, stat.st_mtime_ns)  # not rewritten
    other = cached_latents(pixels, vae, {**SPEC, "vae": "w" * 64}, progress=False)
    assert calls and np.array_equal(np.array(other), first)  # another VAE hash: its own entry


def test_an_encoding_stopped_midway_leaves_no_entry_and_the_next_run_builds_it(
        vae, pixels, cache, tmp_path, monkeypatch):
    expected = np.empty((10, 4, 8, 8), np.float32)
    encode_rows(pixels, vae, expected, batch_size=4, progress=False)
    real, calls = LatentVAE.encode, []

    def failing(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt  # stopped in the second batch
        return real(self, *args, **kwargs)

    monkeypatch.setattr(LatentVAE, "encode", failing)
    with pytest.raises(KeyboardInterrupt):
        cached_latents(pixels, vae, SPEC, batch_size=4, progress=False)
    folder = _folder(cache)
    assert not (folder / "meta.json").exists() and not (folder / "latents.bin").exists()
    monkeypatch.setattr(LatentVAE, "encode", real)
    assert np.array_equal(np.array(cached_latents(pixels, vae, SPEC, batch_size=4,
                                                  progress=False)), expected)


def test_a_dead_processs_temporary_file_is_removed_and_the_entry_built(vae, pixels, cache):
    """What a kill -9 while encoding leaves (the test below makes one for real, slowly): a
    half-written ``.latents.bin.tmp-PID`` and no ``meta.json``."""
    cached_latents(pixels, vae, SPEC, progress=False)  # a whole entry, made incomplete:
    folder = _folder(cache)
    for name in ("meta.json", "latents.bin"):
        (folder / name).unlink()
    (folder / ".latents.bin.tmp-99999").write_bytes(b"\0" * 100)
    latents = cached_latents(pixels, vae, SPEC, batch_size=4, progress=False)
    expected = np.empty((10, 4, 8, 8), np.float32)
    encode_rows(pixels, vae, expected, batch_size=4, progress=False)
    assert np.array_equal(np.array(latents), expected)
    assert sorted(p.name for p in folder.iterdir()) == ["latents.bin", "meta.json"]


@pytest.mark.slow  # a fresh interpreter imports torch and diffusers: about 15 s
def test_a_process_killed_while_encoding_leaves_a_file_the_next_run_replaces(
        vae, pixels, cache, tmp_path):
    """A real kill -9 (SIGKILL) in the second batch: the dead process's temporary file is
    left; the next run, holding the lock, removes it and builds the entry whole."""
    torch.save(pixels, tmp_path / "pixels.pt")
    vae.autoencoder.save_pretrained(tmp_path / "vae")
    script = f"""
import os, signal, sys, torch
import addnorm
from addnorm.data.latent_cache import cached_latents
from addnorm.interop.diffusers_vae import LatentVAE, load_vae
real, calls = LatentVAE.encode, []
def killed(self, *a, **k):
    calls.append(1)
    if len(calls) == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    return real(self, *a, **k)
LatentVAE.encode = killed
cached_latents(torch.load(sys.argv[1]), load_vae(sys.argv[2]), {SPEC!r}, batch_size=4,
               progress=False)
"""
    src = os.path.dirname(os.path.dirname(addnorm.__file__))  # this addnorm, not another
    env = {**os.environ, "ADDNORM_CACHE": str(cache), "PYTHONPATH": os.pathsep.join(
        [src, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "pixels.pt"),
                           str(tmp_path / "vae")], env=env, capture_output=True, timeout=300)
    assert done.returncode == -signal.SIGKILL, done.stderr.decode()[-2000:]
    folder = _folder(cache)
    left = [p.name for p in folder.iterdir()]
    assert len(left) == 1 and left[0].startswith(".latents.bin.tmp-")  # no meta.json
    latents = cached_latents(pixels, vae, SPEC, batch_size=4, progress=False)
    expected = np.empty((10, 4, 8, 8), np.float32)
    encode_rows(pixels, vae, expected, batch_size=4, progress=False)
    assert np.array_equal(np.array(latents), expected)
    assert sorted(p.name for p in folder.iterdir()) == ["latents.bin", "meta.json"]


def test_a_damaged_entry_is_encoded_again(vae, pixels, cache, caplog):
    first = np.array(cached_latents(pixels, vae, SPEC, progress=False))
    path = _entry(cache)
    data = bytearray(path.read_bytes())
    data[0] ^= 1
    path.write_bytes(bytes(data))
    with caplog.at_level("WARNING", logger="addnorm"):
        again = cached_latents(pixels, vae, SPEC, progress=False)
    assert "CRC-32" in caplog.text and np.array_equal(np.array(again), first)


def test_an_unwritable_cache_encodes_in_memory(vae, pixels, tmp_path, monkeypatch):
    blocked = tmp_path / "file"
    blocked.write_text("")  # a file where the cache folder would be
    monkeypatch.setenv("ADDNORM_CACHE", str(blocked))
    expected = np.empty((10, 4, 8, 8), np.float32)
    encode_rows(pixels, vae, expected, progress=False)
    assert np.array_equal(cached_latents(pixels, vae, SPEC, progress=False), expected)


def _encoded_as_before_streaming(pixels, vae, batch_size):
    """The encoding loop as it was when it held every image in memory (``pixels[rows //
    2]``, each row indexed on its own): the reference a streamed entry must equal bit for
    bit, so that entries written before streaming stay valid."""
    n = pixels.shape[0]
    out = np.empty((2 * n, 4, 8, 8), np.float32)
    with torch.no_grad():
        for start in range(0, 2 * n, batch_size):
            rows = torch.arange(start, min(start + batch_size, 2 * n))
            x = pixels[rows // 2].float() / 127.5 - 1.0
            mirrored = rows % 2 == 1
            x[mirrored] = x[mirrored].flip(-1)
            generators = [torch.Generator().manual_seed(int(r)) for r in rows]
            out[start : start + len(rows)] = vae.encode(x, generator=generators).numpy()
    return out


@pytest.mark.parametrize("batch_size", [3, 16])
def test_streamed_rows_encode_bit_for_bit_as_the_images_in_memory(vae, tmp_path, batch_size):
    """Provenance: the all-in-memory loop above on ``ImageCorpus.pixels``; at batch size 3 an
    image's two rows fall in two batches (decoded twice, identically)."""
    from data.test_images import write_folder

    from addnorm.data.images import ImageCorpus, PixelRows

    write_folder(tmp_path / "pics", {"a": 4, "b": 3}, size=16)
    corpus = ImageCorpus.build(tmp_path / "pics")
    streamed = np.empty((14, 4, 8, 8), np.float32)
    encode_rows(PixelRows(corpus, 16), vae, streamed, batch_size=batch_size, progress=False)
    assert corpus._pixels == {}  # the rows were decoded a batch at a time, none kept
    expected = _encoded_as_before_streaming(corpus.pixels(16), vae, batch_size)
    assert np.array_equal(streamed, expected)
    in_memory = np.empty_like(streamed)
    encode_rows(corpus.pixels(16), vae, in_memory, batch_size=batch_size, progress=False)
    assert np.array_equal(in_memory, expected)


def test_a_failed_read_check_publishes_nothing_and_the_next_run_encodes(vae, pixels, cache):
    """``check_read`` (the corpus's fingerprint check) runs after the last batch: its error
    leaves neither ``latents.bin`` nor ``meta.json``."""
    def changed():
        raise OSError("changed while it was read")

    with pytest.raises(OSError, match="changed while it was read"):
        cached_latents(pixels, vae, SPEC, progress=False, check_read=changed)
    assert sorted(p.name for p in _folder(cache).iterdir()) == []
    checks = []
    latents = cached_latents(pixels, vae, SPEC, progress=False,
                             check_read=lambda: checks.append(1))
    assert checks == [1] and np.array_equal(np.array(latents),
                                            _encoded_as_before_streaming(pixels, vae, 16))
