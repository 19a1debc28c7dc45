"""A diffusers DiT pipeline folder, as DiTPipeline.save_pretrained writes it (with the Hub
folder's id2label), opened by from_diffusers_pipeline and addnorm.load; a folder that is no
such pipeline is refused naming what is wrong, before any weights are read. Parity of the
images: test_dit_pipeline.py."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from small_pipeline import ID2LABEL, autoencoder, transformer, write_pipeline
from tolerances import FLOAT32_MODEL

import addnorm
from addnorm.dit import DiT
from addnorm.interop.diffusers_pipeline import from_diffusers_pipeline, is_pipeline_folder
from addnorm.interop.diffusers_vae import PipelinePartError
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
