"""LatentVAE and load_vae: diffusers' AutoencoderKL (the oracle, the same module) seen from the
latent side, as DiT's train.py encodes and diffusers' DiTPipeline decodes."""

from __future__ import annotations

import json
import sys

import pytest
import torch
from small_pipeline import autoencoder, write_pipeline
from tolerances import FLOAT32_MODEL

from addnorm.interop.diffusers_vae import (
    LatentVAE,
    PipelinePartError,
    load_vae,
    vae_hash,
)
from addnorm.interop.diffusers_vae import vae_folder as vae_folder_of
from addnorm.utils.files import CheckpointError

diffusers = pytest.importorskip("diffusers")


@pytest.fixture(scope="module")
def vae_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("vae")
    autoencoder().save_pretrained(folder)
    return folder


def test_encode_is_a_posterior_draw_times_the_scaling_factor(vae_folder):
    vae = load_vae(vae_folder)
    theirs = vae.autoencoder
    images = torch.rand(2, 3, 16, 16, generator=torch.Generator().manual_seed(0)) * 2 - 1
    with torch.no_grad():
        latents = vae.encode(images, generator=torch.Generator().manual_seed(1))
        # DiT's train.py: vae.encode(x).latent_dist.sample().mul_(0.18215)
        draw = theirs.encode(images).latent_dist.sample(generator=torch.Generator().manual_seed(1))
    assert latents.shape == (2, 4, 8, 8)
    torch.testing.assert_close(latents, draw * 0.18215, **FLOAT32_MODEL)


def test_decode_undoes_the_scaling_factor_as_dit_pipeline(vae_folder):
    vae = load_vae(vae_folder)
    latents = torch.randn(2, 4, 8, 8, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        expected = vae.autoencoder.decode(1 / 0.18215 * latents).sample  # DiTPipeline's call
        assert torch.equal(vae.decode(latents), expected)  # the same ops


def test_the_sizes_are_read_off_the_config(vae_folder):
    vae = load_vae(vae_folder, dtype="float64")
    assert (vae.latent_channels, vae.image_channels, vae.downsample) == (4, 3, 2)
    assert vae.scaling_factor == 0.18215 and not vae.training
    assert next(vae.parameters()).dtype == torch.float64


def test_a_pipeline_folder_gives_its_vae(tmp_path):
    vae = load_vae(write_pipeline(tmp_path))
    assert vae.latent_channels == 4 and vae.downsample == 2


def test_a_folder_of_another_class_is_refused_before_diffusers_reads_it(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"_class_name": "UNet2DModel"}))
    with pytest.raises(PipelinePartError, match=r"config.json names the class 'UNet2DModel', "
                                                r"not an AutoencoderKL"):
        load_vae(tmp_path)


def test_a_vae_whose_weights_are_missing_is_a_checkpoint_error(vae_folder, tmp_path):
    (tmp_path / "config.json").write_text((vae_folder / "config.json").read_text())
    with pytest.raises(CheckpointError, match="diffusers cannot load its AutoencoderKL"):
        load_vae(tmp_path)


def test_a_vae_decoding_with_a_shift_is_refused(tmp_path):
    # SD3's and Flux's VAEs decode latents / scale + shift; DiTPipeline ignores the shift.
    autoencoder(shift_factor=0.1).save_pretrained(tmp_path)
    with pytest.raises(PipelinePartError, match="the VAE sets shift_factor, which diffusers' "
                                                "DiTPipeline ignores"):
        load_vae(tmp_path)
    with pytest.raises(TypeError, match="autoencoder must be a diffusers AutoencoderKL"):
        LatentVAE(torch.nn.Linear(2, 2))


def test_without_diffusers_the_error_says_how_to_install_it(vae_folder, monkeypatch):
    monkeypatch.setitem(sys.modules, "diffusers", None)  # import diffusers raises ImportError
    with pytest.raises(ImportError, match=r"needs diffusers' AutoencoderKL, and diffusers is "
                                          r"not installed: pip install 'addnorm\[interop\]'"):
        load_vae(vae_folder)


def test_the_hash_is_the_folders_config_and_weights(vae_folder, tmp_path):
    """Provenance: hashlib's SHA-256 of each file's name, a zero byte and its bytes, in name
    order (the documented rule), computed here."""
    import hashlib

    digest = hashlib.sha256()
    for name in ("config.json", "diffusion_pytorch_model.safetensors"):
        digest.update(name.encode() + b"\0" + (vae_folder / name).read_bytes())
    assert vae_hash(vae_folder) == digest.hexdigest()
    pipeline = write_pipeline(tmp_path / "pipe")
    assert vae_folder_of(pipeline) == pipeline / "vae"
    assert vae_hash(pipeline) == vae_hash(pipeline / "vae")
    with pytest.raises(CheckpointError, match="cannot be read"):
        vae_hash(tmp_path / "missing")
