"""``addnorm train dit --data DIR --vae VAE`` end to end, in-process, with a small random
diffusers ``AutoencoderKL`` (``small_pipeline.autoencoder``: factor 2, 4 latent channels): the
run trains on the latents, ``addnorm sample`` writes images of the data's size decoded by the
VAE, a resume or a sample with a changed VAE is one line and exit 2, and a VAE folder that is no
``AutoencoderKL`` is one line and exit 2 before anything is written.

Provenance: the sizes are the test's (16x16 pictures; 16 / 2 = 8 a side of latents); the
refusals name the folder the test wrote or changed.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from image_folders import pictures_and_vae
from small_pipeline import (
    autoencoder,
    one_thread,  # noqa: F401  (autouse: one thread)
)

from addnorm.cli.parser import main
from addnorm.tasks.trained import load_trained

pytest.importorskip("diffusers")
TINY = ["--preset", "DiT-digits-tiny", "--batch-size", "4", "--eval-size", "2",
        "--max-steps", "2", "--no-keep-best", "--quiet"]


@pytest.fixture
def folder(tmp_path, monkeypatch):
    monkeypatch.setenv("ADDNORM_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    pictures_and_vae(tmp_path)
    return tmp_path


def test_train_on_latents_samples_decoded_images_and_refuses_a_changed_vae(folder, capsys):
    assert main(["train", "dit", *TINY, "--data", "pics", "--vae", "vae", "--out", "run"]) == 0
    _, model, _ = load_trained(folder / "run")
    assert (model.cfg.input_size, model.cfg.in_channels) == (8, 4)
    assert main(["sample", "--checkpoint", "run", "--class", "bees", "--n", "3", "--steps",
                 "2", "--out", "bees.png", "--save-array", "bees.npy", "--quiet",
                 "--device", "cpu"]) == 0
    saved = np.load(folder / "bees.npy")
    assert saved.shape == (3, 16, 16, 3) and saved.dtype == np.uint8
    other = autoencoder()
    with torch.no_grad():
        next(other.parameters()).mul_(2.0)
    other.save_pretrained(folder / "vae")
    capsys.readouterr()
    assert main(["train", "dit", "--out", "run", "--resume", "--max-steps", "4",
                 "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "the VAE changed since the run was trained" in err[0], err
    assert main(["sample", "--checkpoint", "run", "--n", "2", "--steps", "2", "--out",
                 "again.png", "--quiet", "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "the VAE changed since the run was trained" in err[0], err
    assert not (folder / "again.png").exists()


def test_a_folder_that_is_no_autoencoder_is_one_line_and_exit_2(folder, capsys):
    (folder / "unet").mkdir()
    (folder / "unet" / "config.json").write_text('{"_class_name": "UNet2DModel"}')
    code = main(["train", "dit", *TINY, "--data", "pics", "--vae", "unet", "--out", "run"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "not an AutoencoderKL" in err[0], err
    assert not (folder / "run").exists()
