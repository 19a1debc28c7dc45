"""The ``dit`` task on the latents of a VAE (``--vae``), as the DiT paper trains: a user's
images (:class:`~addnorm.tasks.dit_data.UserImages`) encoded once by a diffusers
``AutoencoderKL`` (:class:`~addnorm.interop.diffusers_vae.LatentVAE`) into the latent cache
(:mod:`addnorm.data.latent_cache`), the model trained on those latents, and its samples
decoded by the same VAE before they are shown or scored.

:class:`LatentImages` is the task's :class:`~addnorm.tasks.dit_data.ImageData` for it. The
model's ``input_size`` is the image size over the VAE's downsampling factor ``f`` (``2 **
(len(block_out_channels) - 1)``) and its ``in_channels`` the VAE's ``latent_channels``; the
image size must be a multiple of ``f`` times ``patch_size`` (the default one is, picked by
:func:`~addnorm.tasks.dit_data.default_image_size` at that step, so its cap is the same
patches a side as in pixel space). The judge scores the decoded images at the image size.

The run records the VAE (the folder given, its SHA-256 over config and weights, ``f`` and
the latent channels) in its checkpoint; a run read back refuses a VAE whose folder no
longer hashes as recorded (``DataChangedError``, one line).

Memory is bounded in the number of images, for folders larger than memory: the pixels of
the whole data are never held (``ImageCorpus.pixels`` is the pixel path's). The images are
decoded a batch at a time as they are encoded (``ImageCorpus.rows`` through
:class:`~addnorm.data.images.PixelRows`), the latents read from a memory map, and the judge
fitted on fixed draws of at most ``MAX_REFERENCE`` train and held-out images
(``UserImages.judge``'s ``bounded``). ``check`` is that encoding pass: every file decodes,
or the one that does not is named, before the run writes anything; a cache entry found
needs no decoding at all, since its key holds the fingerprint of files that all decoded
when it was written. Under ``torchrun`` every rank asks for the entry under its lock: one
encodes, the others wait and read it (the ranks do not share the encoding itself).

:func:`latent_data_for` and :func:`latent_data_from_dict` are the task's entry points: the
images a config or a checkpoint names, through the VAE where it names one (else
:mod:`addnorm.tasks.dit_data`'s, unchanged).
"""

from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch

from addnorm.data.batches import DiffusionDraws, image_batch
from addnorm.data.data_errors import DataChangedError
from addnorm.data.fingerprint import absolute_path
from addnorm.data.images import ImageCorpus, PixelRows, to_pixels
from addnorm.data.latent_cache import cached_latents
from addnorm.data.sampler import SampledBatches, SeededSampler
from addnorm.dit import DiTConfig
from addnorm.interop.diffusers_pipeline import save_diffusers_pipeline
from addnorm.interop.diffusers_vae import check_vae_config, load_vae, vae_folder, vae_hash
from addnorm.pretrained.files import read_config_json
from addnorm.tasks.dit_data import (
    ImageData,
    UserImages,
    default_image_size,
    image_data_for,
    image_data_from_dict,
)
from addnorm.utils.files import CheckpointError

if TYPE_CHECKING:
    from addnorm.dit.model import DiT
    from addnorm.interop.diffusers_vae import LatentVAE
    from addnorm.tasks.image_quality import ImageJudge

__all__ = [
    "LatentImages",
    "LatentRows",
    "check_vae_setting",
    "encoding_device",
    "latent_data_for",
    "latent_data_from_dict",
    "save_pipeline",
]


def check_vae_setting(cfg: Any) -> None:
    """Check (and make absolute) the ``vae`` of the frozen task config ``cfg``: None, or a
    non-empty path, with data. ValueError or TypeError naming it."""
    if cfg.vae is None:
        return
    if not isinstance(cfg.vae, str) or not cfg.vae:
        raise TypeError(f"vae must be a non-empty str or None, got {cfg.vae!r}")
    object.__setattr__(cfg, "vae", absolute_path(cfg.vae))
    if cfg.data is None:
        raise ValueError("vae needs data (your images, --data): the digits are trained on "
                         "their 8x8 pixels")


def encoding_device() -> torch.device:
    """Where a run's VAE encodes its images: this process's CUDA device where there is one
    (under ``torchrun --device cuda``, the rank's), else the CPU. Encoding is a one-time pass
    over the data, whatever device the DiT trains on; the encoder's noise is drawn on the CPU
    by each row's generator (:func:`~addnorm.data.latent_cache.encode_rows`), so a GPU's
    latents differ from the CPU's by the encoder's float rounding only."""
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


class LatentRows(torch.utils.data.Dataset):
    """The train split of a latent cache as a map-style dataset: key ``2 j + m`` is train
    image ``j`` (``index[j]``), mirrored when ``m`` is 1, so a key drawn uniformly is DiT's
    random flip; item ``(latent, label)``, the latent float32 (C, h, w), copied out of the
    memory map.

    Args:
        latents: (2N, C, h, w), rows ``2 i`` and ``2 i + 1`` image ``i`` and its mirror.
        index: (n,) the train images.
        labels: (N,) every image's class id.
    """

    def __init__(self, latents: np.ndarray, index: np.ndarray, labels: np.ndarray) -> None:
        self.latents, self.index, self.labels = latents, np.asarray(index), np.asarray(labels)

    def __len__(self) -> int:
        return 2 * len(self.index)

    def __getitem__(self, key: int) -> tuple[torch.Tensor, int]:
        image = int(self.index[key // 2])
        return torch.from_numpy(np.array(self.latents[2 * image + key % 2])), int(
            self.labels[image])


class LatentImages:
    """A user's images trained on as the latents of a VAE (see the module docstring).

    Args:
        images: the images (their record, corpus, image size: a pixel size).
        vae: the folder given: a diffusers ``AutoencoderKL`` folder or a DiT pipeline folder
            (its ``vae/``), made absolute.
        recorded: a trained run's record of the VAE (:meth:`to_dict`'s ``"vae"``); None for a
            new run, whose VAE's config is read here (``PipelinePartError`` unless it names an
            ``AutoencoderKL``) and hashed on first use.
    """

    pixel_max = 255.0

    def __init__(self, images: UserImages, vae: str | os.PathLike, *,
                 recorded: dict[str, Any] | None = None) -> None:
        self.images, self.record = images, images.record
        self.class_names, self.channels = images.class_names, images.channels
        self.vae_path = absolute_path(vae)
        if recorded is None:
            folder = vae_folder(self.vae_path)
            config = read_config_json(folder)
            check_vae_config(config, folder)
            self.latent_channels = int(config.get("latent_channels", 4))
            self.downsample = 2 ** (len(config.get("block_out_channels", (64,))) - 1)
            image_channels = int(config.get("in_channels", 3))
            if image_channels not in (self.channels, 3):
                raise ValueError(f"vae {self.vae_path} takes {image_channels}-channel images; "
                                 f"your images have {self.channels}")
            self._sha256: str | None = None
        else:
            self.latent_channels = int(recorded["latent_channels"])
            self.downsample = int(recorded["downsample"])
            self._sha256 = str(recorded["sha256"])
        self._checked = recorded is None
        self._vae: LatentVAE | None = None
        self._latents: dict[int, np.ndarray] = {}

    @property
    def corpus(self) -> ImageCorpus:
        """The images (:attr:`UserImages.corpus`)."""
        return self.images.corpus

    @property
    def sha256(self) -> str:
        """The VAE's hash: recorded, or (a new run) its folder's, computed once."""
        if self._sha256 is None:
            self._sha256 = vae_hash(self.vae_path)
        return self._sha256

    @property
    def vae(self) -> LatentVAE:
        """The VAE, loaded on first use (a trained run's: checked unchanged first)."""
        if self._vae is None:
            self.check_vae()
            self._vae = load_vae(self.vae_path)
        return self._vae

    def check_vae(self) -> None:
        """A trained run's VAE must hash as recorded: ``DataChangedError`` (one line) if it
        changed, or its folder is gone."""
        if self._checked:
            return
        try:
            now = vae_hash(self.vae_path)
        except CheckpointError as err:
            raise DataChangedError(f"{err}; the run was trained on that VAE's latents"
                                   ) from None
        if now != self._sha256:
            raise DataChangedError(
                f"vae {self.vae_path}: the VAE changed since the run was trained on its latents "
                f"(sha256 {str(self._sha256)[:12]}... recorded, {now[:12]}... now); a run "
                "continues only with the VAE it was trained with")
        self._checked = True

    def train_size(self) -> int:
        """The train images."""
        return self.images.train_size()

    def _step(self, cfg: DiTConfig) -> int:
        return self.downsample * cfg.patch_size

    def pixel_size(self, cfg: DiTConfig) -> int:
        """The image side of a model on these latents (``input_size`` times the factor)."""
        return cfg.input_size * self.downsample

    def prepare(self, cfg: DiTConfig) -> DiTConfig:
        """``cfg`` on the latents of the image size (asked for; the data's default at a step
        of factor times ``patch_size``; a trained run's: its ``input_size`` times the
        factor), which that step must divide, with the VAE's latent channels and the
        images' classes."""
        size = self.images.image_size
        if size == "data":
            size = default_image_size(self.corpus.sizes, self._step(cfg))[0]
        elif size is None:
            size = self.pixel_size(cfg)
        if size % self._step(cfg):
            raise ValueError(
                f"image_size ({size}) must be divisible by {self._step(cfg)}: the VAE's "
                f"downsampling factor {self.downsample} times patch_size ({cfg.patch_size})")
        return dataclasses.replace(cfg, input_size=size // self.downsample,
                                   in_channels=self.latent_channels,
                                   n_classes=len(self.class_names))

    def size_note(self, cfg: DiTConfig) -> str | None:
        """Where the data picked the size, how it differs from the images' own (at a step of
        the factor times ``patch_size``), and the latents' size."""
        if self.images.image_size != "data":
            return None
        size, note = default_image_size(self.corpus.sizes, self._step(cfg))
        latent = size // self.downsample
        return (f"{note or f'training at {size}x{size}'} (through the VAE: {latent}x{latent} "
                f"latents, factor {self.downsample})")

    def check(self, cfg: DiTConfig, batch_size: int) -> None:
        """The VAE unchanged (a trained run's), the splits' sizes
        (:meth:`UserImages.check_splits`), and every image decoding at the image size: the
        latents encoded (or found) here (:meth:`latents`; see the module docstring)."""
        self.check_vae()
        self.images.check_splits(batch_size)
        self.latents(self.pixel_size(cfg))

    def latents(self, image_size: int) -> np.ndarray:
        """Every image and its mirror encoded at ``image_size``, from the latent cache
        (encoded there on first use, the images decoded a batch at a time and the files'
        fingerprint checked after the last): (2N, latent_channels, S / f, S / f) float32, a
        read-only memory map (kept for the next call)."""
        if image_size not in self._latents:
            spec = {"data": self.record.fingerprint.digest, "image_size": image_size,
                    "mode": self.corpus.mode, "vae": self.sha256}
            vae = self.vae.to(encoding_device())  # for this pass only: kept on the CPU
            try:
                self._latents[image_size] = cached_latents(
                    PixelRows(self.corpus, image_size), vae, spec,
                    check_read=self.corpus.check_unchanged)
            finally:
                vae.to("cpu")
        return self._latents[image_size]

    def batches(self, cfg: DiTConfig, *, batch_size: int, n_steps: int, seed: int
                ) -> SampledBatches:
        """Random train latents (a random one of each image's two flips, :class:`LatentRows`)
        with their timesteps, noise and label dropout, drawn as :class:`ImageBatches` draws
        them."""
        rows = LatentRows(self.latents(self.pixel_size(cfg)), self.corpus.train_index,
                          self.corpus.labels)
        return SampledBatches(rows, SeededSampler(len(rows), seed), batch_size=batch_size,
                              collate=image_batch,
                              draws=DiffusionDraws(n_steps, cfg.class_dropout))

    def samples_at_once(self, n: int) -> int:
        """As the images' (``SAMPLE_CHUNK`` at most)."""
        return self.images.samples_at_once(n)

    @torch.no_grad()
    def to_pixels(self, x: torch.Tensor) -> torch.Tensor:
        """Latents (N, latent_channels, h, w) decoded by the VAE (on their device) as uint8
        (N, C, h f, w f) pixels; a colour VAE's images averaged to grayscale for grayscale
        data."""
        vae = self.vae.to(x.device)
        images = vae.decode(x.to(next(vae.parameters()).dtype)).float()
        if images.shape[1] != self.channels:
            images = images.mean(dim=1, keepdim=True)
        return to_pixels(images)

    def judge(self, input_size: int) -> ImageJudge:
        """The images' judge at the image size of a model of ``input_size`` (the latents'
        side times the factor), on bounded draws of the images (``bounded``: see the module
        docstring)."""
        return self.images.judge(input_size * self.downsample, bounded=True)

    def sample_record(self, class_id: int, image: torch.Tensor) -> dict[str, Any]:
        """As the images' (:meth:`UserImages.sample_record`)."""
        return self.images.sample_record(class_id, image)

    def to_dict(self) -> dict:
        """The images' record and the VAE's: the folder, its hash, factor and channels."""
        return {**self.images.to_dict(), "vae": {
            "path": self.vae_path, "sha256": self.sha256, "downsample": self.downsample,
            "latent_channels": self.latent_channels}}

    def run_files(self) -> dict[str, str]:
        """The images' (``data.json``)."""
        return self.images.run_files()


def latent_data_for(task_cfg: Any) -> ImageData:
    """The images a ``DiTTaskConfig`` names, through its ``vae`` where it names one (a VAE
    folder that cannot be used is a ValueError naming it); else
    :func:`~addnorm.tasks.dit_data.image_data_for`'s."""
    images = image_data_for(task_cfg)
    if getattr(task_cfg, "vae", None) is None:
        return images
    assert isinstance(images, UserImages)  # DiTTaskConfig: a vae needs data
    try:
        return LatentImages(images, task_cfg.vae)
    except CheckpointError as err:
        raise ValueError(f"vae {task_cfg.vae}: {err}") from None


def latent_data_from_dict(data: dict) -> ImageData:
    """The images a checkpoint's task data names, through its recorded VAE if any."""
    images = image_data_from_dict(data)
    vae = data.get("vae")
    if vae is None:
        return images
    assert isinstance(images, UserImages)
    return LatentImages(images, vae["path"], recorded=vae)


class _DiffusionTask(Protocol):
    """What :func:`save_pipeline` reads of a ``DiTTask`` (named so to keep dit_latents below
    dit, which imports it)."""

    data: ImageData
    n_steps: int
    schedule: str
    prediction: str
    class_names: Any


def save_pipeline(task: _DiffusionTask, model: DiT, folder: str | os.PathLike) -> str:
    """Write a run trained on a VAE's latents (``task, model, _ =
    addnorm.tasks.trained.load_trained(RUN)``) as a diffusers DiT pipeline folder: its DiT, its VAE,
    a ``DPMSolverMultistepScheduler`` of its diffusion and its class names
    (:func:`~addnorm.interop.diffusers_pipeline.save_diffusers_pipeline`, whose ValueErrors
    say what diffusers cannot hold; a DiT of fewer than 1000 classes padded so that diffusers'
    guidance is exact); ValueError for a run on pixels. Returns the folder. The command is
    ``addnorm export RUN --format pipeline --out FOLDER``, which also checks the folder."""
    if not isinstance(task.data, LatentImages):
        raise ValueError("only a run trained on a VAE's latents (--vae) makes a pipeline; this "
                         "one trained on pixels")
    return str(save_diffusers_pipeline(
        folder, model, task.data.vae, n_steps=task.n_steps, schedule=task.schedule,
        prediction=task.prediction, class_names=task.class_names))
