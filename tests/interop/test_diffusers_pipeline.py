"""A diffusers DiT pipeline folder, as DiTPipeline.save_pretrained writes it (with the Hub
folder's id2label), opened by from_diffusers_pipeline and addnorm.load; a folder that is no
such pipeline is refused naming what is wrong, before any weights are read. Parity of the
images: test_dit_pipeline.py."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest
import torch
from small_dit import config, perturbed
from small_pipeline import (
    ID2LABEL,
    autoencoder,
    diffusers_pipeline,
    transformer,
    write_pipeline,
)
from tolerances import FLOAT32_MODEL

import addnorm
import addnorm.interop.diffusers_pipeline as diffusers_pipeline_module
from addnorm.dit import DiT
from addnorm.interop.diffusers_pipeline import (
    from_diffusers_pipeline,
    is_pipeline_folder,
    save_diffusers_pipeline,
)
from addnorm.interop.diffusers_vae import LatentVAE, PipelinePartError
from addnorm.interop.dit_pipeline import DiTPipeline
from addnorm.utils.files import CheckpointError

diffusers = pytest.importorskip("diffusers")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_pipeline(tmp_path_factory.mktemp("pipe"))


def copy_of(folder, tmp_path):
    return shutil.copytree(folder, tmp_path / "copy")


def test_load_opens_the_folder_as_a_pipeline_of_its_parts(folder):
    pipe = addnorm.load(folder)
    assert isinstance(pipe, DiTPipeline) and is_pipeline_folder(folder)
    assert isinstance(pipe.transformer, DiT) and not pipe.training
    assert pipe.transformer.cfg.n_classes == 1000 and pipe.image_size == 16
    assert pipe.class_names.index("Carassius auratus") == 1
    assert pipe.class_names.labels == {int(k): v for k, v in ID2LABEL.items()}
    assert pipe.sampler().scheduler == "DDIMScheduler"
    typed = addnorm.load(folder, DiTPipeline, dtype="float64")
    assert next(typed.transformer.parameters()).dtype == torch.float64
    assert next(typed.vae.parameters()).dtype == torch.float64


def test_the_dit_is_the_one_diffusers_loads(folder):
    # The transformer is read without diffusers (diffusers_folder.py): it computes what
    # diffusers' own loading of the same folder computes, to FLOAT32_MODEL (test_diffusers.py).
    theirs = diffusers.DiTTransformer2DModel.from_pretrained(folder / "transformer")
    ours = from_diffusers_pipeline(folder).transformer
    x = torch.randn(2, 4, 8, 8, generator=torch.Generator().manual_seed(0))
    t, y = torch.tensor([10, 900]), torch.tensor([1, 1000])
    with torch.no_grad():
        torch.testing.assert_close(ours(x, t, y), theirs(x, t, y).sample, **FLOAT32_MODEL)


def test_a_folder_without_id2label_names_its_classes_by_id(tmp_path):
    pipe = from_diffusers_pipeline(write_pipeline(tmp_path, id2label=None))
    assert pipe.class_names.index("42") == 42 and pipe.class_names.labels == {}


def test_asking_for_a_dit_of_a_pipeline_names_its_transformer_folder(folder):
    with pytest.raises(CheckpointError, match=r"is a diffusers pipeline, which loads as a "
                                              r"DiTPipeline, not DiT; its DiT alone is "
                                              r".*transformer"):
        addnorm.load(folder, DiT)


@pytest.mark.parametrize("part", ["transformer", "vae", "scheduler"])
def test_a_missing_part_is_named(folder, tmp_path, part):
    copy = copy_of(folder, tmp_path)
    shutil.rmtree(copy / part)
    with pytest.raises(PipelinePartError, match=rf"misses its {part} \({part}/"):
        from_diffusers_pipeline(copy)


def test_a_part_model_index_leaves_out_is_named(folder, tmp_path):
    copy = copy_of(folder, tmp_path)
    index = json.loads((copy / "model_index.json").read_text())
    del index["vae"]
    (copy / "model_index.json").write_text(json.dumps(index))
    with pytest.raises(PipelinePartError, match=r"model_index.json lists no vae: a DiTPipeline "
                                                r"has transformer, vae, scheduler"):
        from_diffusers_pipeline(copy)


def test_another_pipeline_class_is_refused(folder, tmp_path):
    copy = copy_of(folder, tmp_path)
    index = json.loads((copy / "model_index.json").read_text())
    (copy / "model_index.json").write_text(json.dumps({**index, "_class_name": "PixArtPipeline"}))
    with pytest.raises(PipelinePartError, match="names the pipeline 'PixArtPipeline'; addnorm "
                                                "opens a DiTPipeline"):
        from_diffusers_pipeline(copy)


def test_a_vae_folder_that_is_no_autoencoder_kl_is_refused(folder, tmp_path):
    copy = copy_of(folder, tmp_path)
    config = json.loads((copy / "vae" / "config.json").read_text())
    config.update(_class_name="AutoencoderTiny", latent_channels=3)  # its class named first
    (copy / "vae" / "config.json").write_text(json.dumps(config))
    with pytest.raises(PipelinePartError, match="names the class 'AutoencoderTiny', not an "
                                                "AutoencoderKL"):
        from_diffusers_pipeline(copy)


def test_latent_channels_other_than_the_dits_are_refused(tmp_path):
    # A real mismatch, written by diffusers (which does not check it): a VAE of 3 latent
    # channels beside a DiT of 4.
    write_pipeline(tmp_path, vae=autoencoder(latent_channels=3), dit=transformer(4))
    with pytest.raises(PipelinePartError, match=r"the VAE's latents have 3 channels "
                                                r"\(vae/config.json latent_channels\) but the "
                                                r"DiT takes 4 \(transformer/config.json"):
        from_diffusers_pipeline(tmp_path)


def test_id2label_naming_a_class_the_dit_lacks_is_refused(tmp_path):
    write_pipeline(tmp_path, id2label={"1000": "nothing"})
    with pytest.raises(PipelinePartError, match=r"model_index.json: id2label names class 1000, "
                                                r"which the model \(classes 0 to 999\)"):
        from_diffusers_pipeline(tmp_path)


def test_damaged_json_is_a_checkpoint_error(folder, tmp_path):
    copy = copy_of(folder, tmp_path)
    (copy / "model_index.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="model_index.json is not valid JSON"):
        from_diffusers_pipeline(copy)


def few_classes_dit(n_classes: int = 3):
    """A perturbed addnorm DiT of ``n_classes`` classes in diffusers' conventions (shift 1)."""
    torch.manual_seed(0)
    cfg = dataclasses.replace(config(True), n_classes=n_classes,
                              timestep_downscale_freq_shift=1.0)
    return perturbed(DiT(cfg), seed=4, scale=0.05).eval()


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """A DiT of 3 classes and the folder save_diffusers_pipeline writes of it."""
    dit, vae = few_classes_dit(), LatentVAE(autoencoder())
    folder = save_diffusers_pipeline(tmp_path_factory.mktemp("written") / "pipe", dit, vae,
                                     class_names=("ants", "bees", "wasps, hornets"))
    return dit, vae, folder


@pytest.mark.parametrize("guidance", [4.0, 1.0])
@pytest.mark.parametrize("method", ["ddim", "dpm-solver++"])
def test_a_written_dit_of_3_classes_samples_in_diffusers_as_in_addnorm(written, method,
                                                                       guidance):
    # Tolerance: FLOAT32_MODEL, as test_dit_pipeline.py's parity (measured <= 6e-7 there):
    # diffusers' pipeline guides with its hard-coded null id 1000, here the DiT's null row.
    dit, vae, folder = written
    theirs = diffusers_pipeline(folder)
    if method == "ddim":
        theirs.scheduler = diffusers.DDIMScheduler.from_config(  # x0 clamps: see
            theirs.scheduler.config, clip_sample=False,  # diffusers_scheduler.py
            timestep_spacing="leading")  # its default; the folder's DPM-Solver++ has linspace
    scheduler = theirs.scheduler
    scheduler_config = {**scheduler.config, "_class_name": type(scheduler).__name__}
    ours = DiTPipeline(dit, vae, scheduler_config)  # the DiT itself: 3 classes, null row 3
    expected = theirs([0, 2, 1], guidance_scale=guidance, num_inference_steps=5,
                      generator=torch.Generator().manual_seed(3), output_type="pt").images
    images = ours.sample([0, 2, 1], steps=5, guidance=guidance, method=method,
                         generator=torch.Generator().manual_seed(3))
    assert float(expected.std()) > 0.1  # not flat
    torch.testing.assert_close(images, expected, **FLOAT32_MODEL)


def test_written_unpadded_diffusers_could_not_guide_it(written, tmp_path, monkeypatch):
    # Why the table is padded: diffusers' DiTPipeline.__call__ asks the DiT for class 1000,
    # past the 4 rows (3 classes and the null) of the DiT as it is.
    dit, vae, _ = written
    monkeypatch.setattr(diffusers_pipeline_module, "widen_classes", lambda model: model)
    theirs = diffusers_pipeline(save_diffusers_pipeline(tmp_path / "pipe", dit, vae))
    theirs([0], guidance_scale=1.0, num_inference_steps=2)  # unguided: no null class asked
    with pytest.raises(IndexError):
        theirs([0], guidance_scale=4.0, num_inference_steps=2)


def test_a_written_dit_of_3_classes_is_read_back_as_itself(written):
    dit, _, folder = written
    index = json.loads((folder / "model_index.json").read_text())
    assert index["id2label"] == {"0": "ants", "1": "bees", "2": "wasps, hornets"}
    transformer_config = json.loads((folder / "transformer" / "config.json").read_text())
    assert transformer_config["num_embeds_ada_norm"] == 1000  # diffusers' null id is its null row
    pipe = addnorm.load(folder)
    assert pipe.transformer.cfg.n_classes == 3 and pipe.class_names.n_classes == 3
    assert pipe.class_names.index("hornets") == 2
    with pytest.raises(ValueError, match="not one of the model's ids 0 to 2"):
        pipe.class_names.index("5")
    theirs = dit.state_dict()
    assert pipe.transformer.state_dict().keys() == theirs.keys()
    assert all(torch.equal(t, theirs[k]) for k, t in pipe.transformer.state_dict().items())


def test_a_dit_without_names_is_written_with_its_ids_as_names(tmp_path):
    folder = save_diffusers_pipeline(tmp_path / "pipe", few_classes_dit(2),
                                     LatentVAE(autoencoder()))
    assert json.loads((folder / "model_index.json").read_text())["id2label"] == {
        "0": "0", "1": "1"}
    assert addnorm.load(folder).transformer.cfg.n_classes == 2


@pytest.mark.parametrize(("n_classes", "names", "message"), [
    (1001, None, "1001 classes; diffusers' DiTPipeline guides with id 1000"),
    (3, ("ants", "bees"), "class_names must name the DiT's 3 classes, got 2"),
])
def test_what_diffusers_cannot_guide_is_refused_before_writing(tmp_path, n_classes, names,
                                                                message):
    with pytest.raises(ValueError, match=message):
        save_diffusers_pipeline(tmp_path / "pipe", few_classes_dit(n_classes),
                                LatentVAE(autoencoder()), class_names=names)
    assert not (tmp_path / "pipe").exists()
