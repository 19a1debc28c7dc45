"""diffusers' ``AutoencoderKL`` as latent diffusion uses it: images to scaled latents and back.

DiT trains and samples on the latents of a pretrained VAE (``stabilityai/sd-vae-ft-ema``: 8x
downsampling, 4 channels). The reference encodes an image in [-1, 1] as a draw of the
encoder's Gaussian times the VAE's ``scaling_factor`` (0.18215 there, which brings the latents
to about unit variance: ``vae.encode(x).latent_dist.sample().mul_(0.18215)`` in DiT's
``train.py``) and decodes ``latents / scaling_factor`` (diffusers' ``DiTPipeline`` multiplies
by ``1 / scaling_factor``). :class:`LatentVAE` is that pair of maps around diffusers' own
module, which does the work: addnorm does not reimplement the VAE, so diffusers is needed
(``pip install 'addnorm[interop]'``) and its absence is said when a VAE is loaded.

:func:`load_vae` opens a folder of diffusers' ``save_pretrained`` (a VAE's own folder such as
``stabilityai/sd-vae-ft-ema``, or a pipeline folder, whose ``vae/`` it takes), checking first,
without diffusers, that its ``config.json`` names an ``AutoencoderKL``. :func:`vae_folder` is
the folder it reads and :func:`vae_hash` the SHA-256 of that folder's config and weights: what
a run trained on the VAE's latents records, so that a cache of latents is keyed by it and a
resumed run refuses a VAE that changed.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from addnorm.interop.diffusers_folder import PIPELINE_INDEX
from addnorm.pretrained.files import CONFIG_FILE, read_config_json
from addnorm.pretrained.mixin import check_device, check_dtype, check_path
from addnorm.utils.files import CheckpointError

__all__ = [
    "LatentVAE",
    "PipelinePartError",
    "check_vae_config",
    "load_vae",
    "vae_folder",
    "vae_hash",
]

VAE_CLASS = "AutoencoderKL"
# config fields DiTPipeline's decoding ignores; a VAE that sets them (SD3's, Flux's: a shift, or
# per-channel statistics) would decode to other images than its own pipelines make.
_UNUSED_BY_DIT = ("shift_factor", "latents_mean", "latents_std")


class PipelinePartError(CheckpointError):
    """A folder is not the part of a pipeline it must be: a VAE folder that holds no
    ``AutoencoderKL``, a pipeline missing a part, parts that do not fit each other (the VAE's
    latent channels and the DiT's input channels), an unknown class name. The CLI's exit 2
    (the folder given is the wrong one), where a damaged file is exit 1."""


def _autoencoder_class() -> Any:
    try:
        from diffusers import AutoencoderKL
    except ImportError as error:
        raise ImportError(
            "decoding DiT latents to images needs diffusers' AutoencoderKL, and diffusers is "
            "not installed: pip install 'addnorm[interop]'"
        ) from error
    return AutoencoderKL


class LatentVAE(nn.Module):
    """An ``AutoencoderKL`` seen from the latent side: :meth:`encode` images to latents
    scaled by ``scaling_factor``, :meth:`decode` such latents back to images.

    Attributes:
        autoencoder: the diffusers module (its weights are this module's).
        scaling_factor: the latents' scale (``config.scaling_factor``).
        latent_channels: channels of a latent (4 for Stable Diffusion's VAEs).
        image_channels: channels of an image (3).
        downsample: image side / latent side, ``2 ** (len(block_out_channels) - 1)`` (8).
    """

    def __init__(self, autoencoder: Any) -> None:
        super().__init__()
        cls = _autoencoder_class()
        if not isinstance(autoencoder, cls):
            raise TypeError(f"autoencoder must be a diffusers AutoencoderKL, got "
                            f"{type(autoencoder).__name__}")
        config = autoencoder.config
        used = [name for name in _UNUSED_BY_DIT if config.get(name) is not None]
        if used:
            raise ValueError(f"the VAE sets {', '.join(used)}, which diffusers' DiTPipeline "
                             "ignores when it decodes (latents / scaling_factor only)")
        self.autoencoder = autoencoder
        self.scaling_factor = float(config.scaling_factor)
        self.latent_channels = int(config.latent_channels)
        self.image_channels = int(config.in_channels)
        self.downsample = 2 ** (len(config.block_out_channels) - 1)

    def encode(self, images: Tensor, *,
               generator: torch.Generator | list[torch.Generator] | None = None) -> Tensor:
        """Latents of ``images`` in [-1, 1]: a draw of the encoder's Gaussian (``generator``
        draws its noise; a list: one generator per image, as diffusers' ``randn_tensor``
        takes them) times ``scaling_factor``, as DiT's ``train.py``.

        Shapes: images (B, image_channels, H, W) -> (B, latent_channels, H / f, W / f),
        f = ``downsample``
        """
        posterior = self.autoencoder.encode(images).latent_dist
        return posterior.sample(generator=generator) * self.scaling_factor

    def decode(self, latents: Tensor) -> Tensor:
        """Images in about [-1, 1] (not clamped) of ``latents``, as ``DiTPipeline`` decodes:
        ``decode(latents * (1 / scaling_factor))``.

        Shapes: latents (B, latent_channels, h, w) -> (B, image_channels, h f, w f)
        """
        return self.autoencoder.decode(1 / self.scaling_factor * latents).sample


def check_vae_config(config: dict[str, Any], directory: Path) -> None:
    """PipelinePartError unless ``config`` (``directory``'s ``config.json``) names an
    ``AutoencoderKL``."""
    name = config.get("_class_name")
    if name != VAE_CLASS:
        shown = repr(name) if len(repr(name)) <= 60 else repr(name)[:57] + "..."
        raise PipelinePartError(
            f"{directory / CONFIG_FILE} names the class {shown}, not an {VAE_CLASS}: not a "
            "VAE folder of diffusers (a pipeline's vae/ or a VAE's own folder)"
        )


def vae_folder(path: str | os.PathLike) -> Path:
    """The folder holding the VAE that ``path`` names: ``path`` itself, or a pipeline
    folder's ``vae/`` (a folder with ``model_index.json`` and no ``config.json``).
    CheckpointError if ``path`` is no folder."""
    directory = check_path(path)
    if (directory / PIPELINE_INDEX).is_file() and not (directory / CONFIG_FILE).exists():
        return directory / "vae"
    return directory


def vae_hash(path: str | os.PathLike) -> str:
    """The SHA-256 (hex) of the VAE folder ``path`` names (:func:`vae_folder`): its
    ``config.json`` and its ``*.safetensors`` weights, in name order, each name and its bytes
    hashed. CheckpointError if the folder or its config cannot be read."""
    directory = vae_folder(path)
    files = [directory / CONFIG_FILE, *sorted(directory.glob("*.safetensors"))]
    digest = hashlib.sha256()
    try:
        for file in files:
            digest.update(file.name.encode() + b"\0")
            with open(file, "rb") as f:
                while block := f.read(1 << 22):
                    digest.update(block)
    except OSError as err:
        raise CheckpointError(f"{directory}: its VAE cannot be read "
                              f"({err.strerror or err}: {err.filename})") from None
    return digest.hexdigest()


def load_vae(
    path: str | os.PathLike,
    *,
    dtype: torch.dtype | str | None = None,
    device: torch.device | str | None = None,
) -> LatentVAE:
    """The ``AutoencoderKL`` of a diffusers folder (``config.json`` and
    ``diffusion_pytorch_model.safetensors``), or of a pipeline folder's ``vae/``, as a
    :class:`LatentVAE`, in eval mode; ``dtype`` and ``device`` as in :func:`addnorm.load`
    (default: float32, the CPU).

    Raises:
        PipelinePartError: ``config.json`` names another class (checked before diffusers is
            imported).
        CheckpointError: the folder or its config is missing or damaged, or diffusers cannot
            read its weights (pickled weights are refused).
        ImportError: diffusers is not installed.
    """
    directory = vae_folder(path)
    dtype, device = check_dtype(dtype), check_device(device)
    check_vae_config(read_config_json(directory), directory)
    cls = _autoencoder_class()
    try:
        autoencoder = cls.from_pretrained(directory, use_safetensors=True,
                                          low_cpu_mem_usage=False, torch_dtype=dtype)
    except (OSError, ValueError, RuntimeError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise CheckpointError(f"{directory}: diffusers cannot load its {VAE_CLASS}: "
                              f"{first}") from None
    try:
        vae = LatentVAE(autoencoder)
    except ValueError as err:
        raise PipelinePartError(f"{directory / CONFIG_FILE}: {err}") from None
    return vae.to(device=device).eval() if device is not None else vae.eval()
