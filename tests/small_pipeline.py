"""A small diffusers DiT pipeline folder with random weights, written by diffusers itself: the
oracle of the pipeline tests and the folder the CLI tests sample (no download).

``DiTPipeline(...).save_pretrained`` does not write ``id2label``; the Hub's
``facebook/DiT-XL-2-256`` keeps it in ``model_index.json``, from which diffusers' loader passes
it back to ``DiTPipeline``: :func:`write_pipeline` adds it there the same way. The DiT has
``num_embeds_ada_norm=1000`` because diffusers' pipeline always guides with the null class
1000 (ImageNet's); its weights are perturbed so that no zero-initialised gate hides a
difference, and every module is put in eval mode (a fresh diffusers module is in training
mode, where its DiT drops labels at random).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from small_dit import perturbed

ID2LABEL = {
    "0": "tench, Tinca tinca",
    "1": "goldfish, Carassius auratus",
    "134": "crane",
    "207": "golden retriever",
    "517": "crane",
    "999": "toilet tissue, toilet paper, bathroom tissue",
}
LATENT_SIDE = 8
IMAGE_SIDE = 16  # two VAE blocks: one downsampling


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models run many times slower when the suite's threads oversubscribe the cores;
    a test module that imports this fixture runs on one thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def autoencoder(latent_channels: int = 4, **config: Any):
    """A small diffusers AutoencoderKL: 16x16 RGB images, 8x8 latents."""
    diffusers = pytest.importorskip("diffusers")
    torch.manual_seed(0)
    vae = diffusers.AutoencoderKL(
        in_channels=3, out_channels=3, latent_channels=latent_channels,
        down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
        block_out_channels=(8, 16), layers_per_block=1, norm_num_groups=4,
        sample_size=IMAGE_SIDE, **config,
    )
    return vae.eval()


def transformer(in_channels: int = 4, learn_sigma: bool = True):
    """A small diffusers DiT on 8x8 latents, 1000 classes, every weight perturbed."""
    diffusers = pytest.importorskip("diffusers")
    torch.manual_seed(1)
    dit = diffusers.DiTTransformer2DModel(
        num_attention_heads=2, attention_head_dim=8, in_channels=in_channels,
        out_channels=2 * in_channels if learn_sigma else in_channels, num_layers=2,
        sample_size=LATENT_SIDE, patch_size=2, num_embeds_ada_norm=1000,
    )
    return perturbed(dit, seed=2, scale=0.05).eval()


def write_pipeline(folder: Path, *, scheduler=None, vae=None, dit=None,
                   id2label: dict[str, str] | None = ID2LABEL) -> Path:
    """``DiTPipeline(dit, vae, scheduler).save_pretrained(folder)``, with ``id2label`` in its
    model_index.json as the Hub's folder has it."""
    diffusers = pytest.importorskip("diffusers")
    if scheduler is None:  # DDIM without clip_sample (x0 clamps: see diffusers_scheduler.py)
        scheduler = diffusers.DDIMScheduler(clip_sample=False)
    pipe = diffusers.DiTPipeline(
        transformer=dit if dit is not None else transformer(),
        vae=vae if vae is not None else autoencoder(), scheduler=scheduler,
    )
    pipe.save_pretrained(folder)
    if id2label is not None:
        index_file = folder / "model_index.json"
        index = json.loads(index_file.read_text())
        index_file.write_text(json.dumps({**index, "id2label": id2label}, indent=2))
    return folder


def diffusers_pipeline(folder: Path):
    """diffusers' own DiTPipeline of the folder (its labels read from id2label)."""
    diffusers = pytest.importorskip("diffusers")
    pipe = diffusers.DiTPipeline.from_pretrained(folder, low_cpu_mem_usage=False)
    pipe.set_progress_bar_config(disable=True)
    return pipe
