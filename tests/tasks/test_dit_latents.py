"""The ``dit`` task on the latents of a VAE (``DiTTaskConfig.vae``): the model it prepares
(the VAE's factor and channels), a tiny run that encodes once and resumes bit for bit, its
samples decoded at the images' size, a changed VAE refused, the settings refused, and a
latent run written as a diffusers pipeline folder that diffusers' own ``DiTPipeline`` samples
as the task does.

Provenance: the model's input is the image side over the VAE's factor ``2 ** (len(
block_out_channels) - 1)`` (2 for the small VAE of ``small_pipeline``: 16 -> 8) and its
channels the VAE's ``latent_channels`` (4), as DiT's ``train.py`` sizes its model
(``latent_size = image_size // 8``); a batch's rows are the cache's rows (identity: the same
latents, read back); a resumed run's checkpoint equals the uninterrupted run's, tensor for
tensor (the same batches from the saved data order, the same arithmetic); samples are the
VAE's decoding of the sampler's latents, computed here with diffusers' own module.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from image_folders import pictures_and_vae, write_folder
from safetensors.torch import load_file
from small_dit import perturbed
from small_pipeline import (
    autoencoder,
    one_thread,  # noqa: F401  (autouse: one thread)
    write_pipeline,
)

from addnorm.data.fingerprint import DataChangedError
from addnorm.data.images import to_pixels
from addnorm.dit import DIT_PRESETS
from addnorm.interop.diffusers_vae import LatentVAE
from addnorm.tasks.dit import DiTTask, DiTTaskConfig
from addnorm.tasks.dit_latents import LatentImages
from addnorm.tasks.plan import plan_resumed_run
from addnorm.tasks.run import train_run
from addnorm.tasks.trained import load_trained

pytest.importorskip("diffusers")
TINY = DIT_PRESETS["DiT-digits-tiny"]


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ADDNORM_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def data(tmp_path):
    """20 16x16 RGB pictures in two class folders, and a small VAE's folder."""
    return pictures_and_vae(tmp_path)


def _train_cfg(**overrides):
    settings = dict(max_steps=4, max_minutes=None, batch_size=4, warmup=1, log_every=1,
                    checkpoint_every=2, ema_decay=0.0, schedule="constant", keep_best=False)
    return dataclasses.replace(DiTTask.default_train_config(), **{**settings, **overrides})


def _encodes(monkeypatch):
    calls: list[int] = []
    real = LatentVAE.encode
    monkeypatch.setattr(LatentVAE, "encode", lambda self, x, **k: calls.append(x.shape[0])
                        or real(self, x, **k))
    return calls


def test_the_model_follows_the_vae_and_batches_are_cached_rows(data):
    pics, vae = data
    task = DiTTask.from_config(DiTTaskConfig(data=str(pics), vae=str(vae)))
    cfg = task.prepare(TINY)
    assert (cfg.input_size, cfg.in_channels, cfg.n_classes) == (8, 4, 2)
    latents = task.data.latents(16)
    assert latents.shape == (40, 4, 8, 8)  # every image and its mirror
    batch = task.batches(cfg, _train_cfg(), DiTTaskConfig()).next_batch()
    assert batch["images"].shape == batch["noise"].shape == (4, 4, 8, 8)
    rows = [next(r for r in range(40) if np.array_equal(latents[r], image.numpy()))
            for image in batch["images"]]
    labels = task.corpus.labels
    assert [int(labels[r // 2]) for r in rows] == batch["labels"].tolist()
    assert all(r // 2 in task.corpus.train_index for r in rows)


def test_a_tiny_run_encodes_once_resumes_exactly_and_samples_at_the_images_size(
        data, tmp_path, monkeypatch):
    pics, vae = data
    task_cfg = DiTTaskConfig(data=str(pics), vae=str(vae), eval_size=2)
    calls = _encodes(monkeypatch)
    whole = train_run("dit", TINY, _train_cfg(), tmp_path / "whole", task_cfg=task_cfg)
    assert sum(calls) == 40  # 20 images and their mirrors, once
    assert np.isfinite(whole.metrics["frechet_distance"])
    assert np.array(whole.metrics["samples"][0]["pixels"]).shape == (16, 16, 3)
    calls.clear()
    train_run("dit", TINY, _train_cfg(max_steps=2), tmp_path / "half", task_cfg=task_cfg)
    plan = plan_resumed_run("dit", tmp_path / "half", train_overrides={"max_steps": 4})
    train_run("dit", plan.model_cfg, plan.train_cfg, tmp_path / "half",
              task_cfg=plan.task_cfg, resume=plan.resume)
    assert calls == []  # both runs read the cache
    for name in ("model.safetensors", "optimizer.safetensors"):
        ours = load_file(tmp_path / "half" / "checkpoints" / "step-00000004" / name)
        theirs = load_file(tmp_path / "whole" / "checkpoints" / "step-00000004" / name)
        assert ours.keys() == theirs.keys()
        assert all(torch.equal(ours[k], theirs[k]) for k in ours), name

    task, model, _ = load_trained(tmp_path / "whole")
    assert task.to_dict()["vae"]["path"] == str(vae) and model.cfg.input_size == 8
    generator = torch.Generator().manual_seed(0)
    images = task.sample(model, torch.tensor([0, 1]), generator=generator)
    assert images.dtype == torch.uint8 and images.shape == (2, 3, 16, 16)
    latents = task._generate(model, torch.tensor([0, 1]), task.sample_settings,
                             torch.Generator().manual_seed(0), False, torch.device("cpu"))
    decoded = task.data.vae.autoencoder.decode(latents / 0.18215).sample  # DiTPipeline's
    assert torch.equal(images, to_pixels(decoded))


def test_a_changed_vae_refuses_the_resume_in_one_line(data, tmp_path):
    pics, vae = data
    task_cfg = DiTTaskConfig(data=str(pics), vae=str(vae), eval_size=2)
    train_run("dit", TINY, _train_cfg(max_steps=2), tmp_path / "run", task_cfg=task_cfg)
    other = autoencoder()
    with torch.no_grad():
        next(other.parameters()).add_(1.0)
    other.save_pretrained(vae)
    with pytest.raises(DataChangedError, match=r"^vae .*: the VAE changed since the run was "
                                               r"trained on its latents \(sha256 [0-9a-f]{12}"):
        plan_resumed_run("dit", tmp_path / "run", train_overrides={"max_steps": 4})
    with pytest.raises(ValueError, match="vae cannot change when resuming"):
        plan_resumed_run("dit", tmp_path / "run", train_overrides={"vae": str(tmp_path)})


def test_a_pipeline_folder_gives_its_vae(data, tmp_path):
    pics, _ = data
    folder = write_pipeline(tmp_path / "pipe")
    task = DiTTask.from_config(DiTTaskConfig(data=str(pics), vae=str(folder)))
    assert task.prepare(TINY).in_channels == 4
    assert task.data.vae.latent_channels == 4


def test_the_settings_refused(data, tmp_path):
    pics, vae = data
    with pytest.raises(ValueError, match="vae needs data"):
        DiTTaskConfig(vae=str(vae))
    with pytest.raises(ValueError, match=r"image_size \(14\) must be divisible by 4: the VAE's "
                                         r"downsampling factor 2 times patch_size \(2\)"):
        DiTTask.from_config(DiTTaskConfig(data=str(pics), vae=str(vae), image_size=14)
                            ).prepare(TINY)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "config.json").write_text('{"_class_name": "UNet2DModel"}')
    with pytest.raises(ValueError, match="not an AutoencoderKL"):
        DiTTask.from_config(DiTTaskConfig(data=str(pics), vae=str(tmp_path / "other")))
    with pytest.raises(ValueError, match="not found"):
        DiTTask.from_config(DiTTaskConfig(data=str(pics), vae=str(tmp_path / "none")))


def test_the_default_size_is_a_multiple_of_the_factor_times_the_patch(tmp_path):
    write_folder(tmp_path / "pics", {"a": 3, "b": 3}, size=18)
    autoencoder().save_pretrained(tmp_path / "vae")
    data = DiTTask.from_config(DiTTaskConfig(data=str(tmp_path / "pics"),
                                             vae=str(tmp_path / "vae"))).data
    assert isinstance(data, LatentImages)
    cfg = data.prepare(TINY)
    assert cfg.input_size == 8  # 18 rounded down to 16, a multiple of 2 x 2; 16 / 2
    assert "training at 16x16" in data.size_note(TINY) and "8x8 latents" in data.size_note(TINY)


def test_a_latent_run_is_written_as_a_pipeline_folder_diffusers_samples(data, tmp_path):
    """Provenance: diffusers' own ``DiTPipeline.from_pretrained`` of the folder, sampling with
    the same starting noise (its ``randn_tensor`` and the task both draw ``randn`` of the
    latents' shape from the generator), DPM-Solver++ over 3 steps without guidance (diffusers'
    pipeline guides with ImageNet's null class 1000 only), decoded by the same VAE; its images
    on [0, 1] rounded to 0..255 are the task's uint8 samples, within one level (float32
    rounding at a pixel's half-level edge)."""
    import diffusers

    from addnorm.tasks.dit_evaluation import SampleSettings
    from addnorm.tasks.dit_latents import save_pipeline

    pics, vae = data
    task_cfg = DiTTaskConfig(data=str(pics), vae=str(vae), eval_size=2)
    cfg = dataclasses.replace(TINY, timestep_downscale_freq_shift=1.0)  # diffusers' features
    train_run("dit", cfg, _train_cfg(max_steps=2), tmp_path / "run", task_cfg=task_cfg)
    task, model, _ = load_trained(tmp_path / "run")
    perturbed(model, seed=3, scale=0.05)  # 2 steps leave the zero-initialised gates near zero
    folder = save_pipeline(task, model, tmp_path / "pipe")
    theirs = diffusers.DiTPipeline.from_pretrained(folder, low_cpu_mem_usage=False)
    theirs.set_progress_bar_config(disable=True)
    assert theirs.labels == {"ants": 0, "bees": 1}
    assert theirs.scheduler.config.prediction_type == "v_prediction"
    images = theirs([0, 1], guidance_scale=1.0, num_inference_steps=3, output_type="np",
                    generator=torch.Generator().manual_seed(0)).images  # (2, 16, 16, 3)
    ours = task.sample(model, torch.tensor([0, 1]), SampleSettings(3, "dpm-solver++", 1.0),
                       generator=torch.Generator().manual_seed(0))  # (2, 3, 16, 16) uint8
    expected = torch.from_numpy(np.round(images * 255)).permute(0, 3, 1, 2)
    assert (ours.float() - expected).abs().max() <= 1
    flat = task.sample(model, torch.tensor([0, 1]), SampleSettings(3, "dpm-solver++", 1.0),
                       generator=torch.Generator().manual_seed(1))
    assert (flat.float() - expected).abs().max() > 1  # the noise decides: the check can fail

    with pytest.raises(ValueError, match="--timestep-downscale-freq-shift 1"):
        train_run("dit", TINY, _train_cfg(max_steps=1), tmp_path / "run0", task_cfg=task_cfg)
        save_pipeline(*load_trained(tmp_path / "run0")[:2], tmp_path / "pipe0")


def test_grayscale_pictures_go_through_a_colour_vae_as_three_equal_channels(tmp_path):
    """Provenance: the cached latents of a grayscale picture are those of its three-channel
    copy (computed here with diffusers: the same generator seed, the row); samples come back
    with the data's one channel, the mean of the VAE's three."""
    write_folder(tmp_path / "pics", {"a": 3, "b": 3}, size=16, mode="L")
    autoencoder().save_pretrained(tmp_path / "vae")
    task = DiTTask.from_config(DiTTaskConfig(data=str(tmp_path / "pics"),
                                             vae=str(tmp_path / "vae")))
    assert task.prepare(TINY).in_channels == 4
    latents = task.data.latents(16)
    x = task.corpus.pixels(16)[:1].float().expand(-1, 3, -1, -1) / 127.5 - 1
    with torch.no_grad():
        draw = task.data.vae.autoencoder.encode(x).latent_dist.sample(
            generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(torch.from_numpy(np.array(latents[:1])), draw * 0.18215,
                               rtol=1e-5, atol=1e-5)  # FLOAT32_MODEL: a batch vs one image
    two = torch.from_numpy(np.array(latents[:2]))
    decoded = task.data.to_pixels(two)
    assert decoded.shape == (2, 1, 16, 16) and decoded.dtype == torch.uint8
    with torch.no_grad():
        colour = task.data.vae.autoencoder.decode(two / 0.18215).sample  # (2, 3, 16, 16)
    assert torch.equal(decoded, to_pixels(colour.mean(dim=1, keepdim=True)))


def _watched_rows(monkeypatch):
    """Every ``ImageCorpus.rows`` call as (images asked for, decoded images alive then, the
    call's included), alive counted by weak references to the tensors rows returned; and
    ``ImageCorpus.pixels`` / ``split`` (the whole data in memory) made to fail."""
    import weakref

    from addnorm.data.images import ImageCorpus

    calls, alive = [], []
    real = ImageCorpus.rows

    def rows(self, index, image_size):
        out = real(self, index, image_size)
        alive[:] = [(ref, n) for ref, n in alive if ref() is not None]
        alive.append((weakref.ref(out), len(out)))
        calls.append((len(out), sum(n for _, n in alive)))
        return out

    def whole(self, *args, **kwargs):
        raise AssertionError("a latent run asked for every image's pixels at once")

    monkeypatch.setattr(ImageCorpus, "rows", rows)
    monkeypatch.setattr(ImageCorpus, "pixels", whole)
    monkeypatch.setattr(ImageCorpus, "split", whole)
    return calls


def test_a_latent_run_decodes_a_batch_at_a_time_and_judges_a_bounded_draw(
        tmp_path, monkeypatch):
    """Provenance: the bound is the design's (``ENCODE_BATCH`` rows encoded at once: at most
    that many images decoded, each once a batch; the judge's draws, ``MAX_REFERENCE``,
    lowered here to 5 of 16 train images); the latents equal the pixel-space encoding of
    the same images (``encode_rows`` on ``ImageCorpus.pixels``, bit for bit)."""
    from addnorm.data.images import ImageCorpus
    from addnorm.data.latent_cache import ENCODE_BATCH, encode_rows
    from addnorm.tasks import image_quality

    write_folder(tmp_path / "pics", {"ants": 10, "bees": 10}, size=16)  # 40 rows: 3 batches
    autoencoder().save_pretrained(tmp_path / "vae")
    task_cfg = DiTTaskConfig(data=str(tmp_path / "pics"), vae=str(tmp_path / "vae"),
                             eval_size=2)
    calls = _watched_rows(monkeypatch)
    monkeypatch.setattr(image_quality, "MAX_REFERENCE", 5)
    run = train_run("dit", TINY, _train_cfg(max_steps=2), tmp_path / "run", task_cfg=task_cfg)
    assert np.isfinite(run.metrics["frechet_distance"])
    encoding, judging = calls[:-2], calls[-2:]  # check's encoding pass; the judge's fit
    assert [n for n, _ in encoding] == [8, 8, 4]  # 16 rows a batch: each image once
    assert max(alive for _, alive in encoding) <= ENCODE_BATCH // 2
    assert judging == [(5, 5), (4, 9)]  # 5 of the 16 train images, then the 4 held out

    monkeypatch.undo()
    task = DiTTask.from_config(task_cfg)
    corpus = ImageCorpus.build(tmp_path / "pics")
    expected = np.empty((40, 4, 8, 8), np.float32)
    encode_rows(corpus.pixels(16), task.data.vae, expected, progress=False)
    assert np.array_equal(np.array(task.data.latents(16)), expected)


def test_the_bounded_judge_is_the_whole_datas_judge_where_the_data_is_within_the_bound(data):
    """Provenance: with every image within ``MAX_REFERENCE`` the draws are all the images, so
    the latent run's judge is the pixel run's, figure for figure (identity)."""
    pics, vae = data
    task = DiTTask.from_config(DiTTaskConfig(data=str(pics), vae=str(vae)))
    assert isinstance(task.data, LatentImages)
    pixels = torch.randint(0, 256, (4, 3, 16, 16), dtype=torch.uint8,
                           generator=torch.Generator().manual_seed(0))
    labels = torch.tensor([0, 1, 0, 1])
    bounded = task.data.judge(8).score(pixels, labels)
    assert bounded == task.data.images.judge(16).score(pixels, labels)


def test_a_file_that_does_not_decode_is_named_by_the_check_and_leaves_no_entry(
        tmp_path, cache):
    """Provenance: the file the test truncated (its header survives: found only when it is
    decoded, here by the encoding pass ``check`` runs)."""
    from addnorm.data.fingerprint import DataError

    write_folder(tmp_path / "pics", {"a": 4, "b": 4}, size=16, suffix="jpg")
    bad = tmp_path / "pics" / "b" / "img2.jpg"
    bad.write_bytes(bad.read_bytes()[:200])
    autoencoder().save_pretrained(tmp_path / "vae")
    task_cfg = DiTTaskConfig(data=str(tmp_path / "pics"), vae=str(tmp_path / "vae"),
                             eval_size=2)
    with pytest.raises(DataError, match=f"^{bad}: cannot be decoded as an image"):
        train_run("dit", TINY, _train_cfg(max_steps=1), tmp_path / "run", task_cfg=task_cfg)
    assert not (tmp_path / "run").exists()
    assert not list((cache / "latents").rglob("meta.json"))
    assert not list((cache / "latents").rglob("latents.bin"))


def test_past_the_bound_the_latent_judge_fits_as_the_whole_datas_judge(data, monkeypatch):
    """Provenance: the whole data's judge fits its features, PCA and class judge on the
    same fixed draw (``reference_draw``) the bounded one decodes alone (identity); only the
    nearest-train search (over the draw) and the held-out images (their draw) differ."""
    from addnorm.tasks import image_quality

    pics, vae = data
    monkeypatch.setattr(image_quality, "MAX_REFERENCE", 5)  # of 16 train, 4 held-out images
    task = DiTTask.from_config(DiTTaskConfig(data=str(pics), vae=str(vae)))
    bounded, whole = task.data.judge(8), task.data.images.judge(16)
    assert np.array_equal(bounded.reference, whole.reference)
    assert np.array_equal(bounded.pca.components_, whole.pca.components_)
    assert bounded.judge_space == whole.judge_space
    assert bounded.train_flat.shape[0] == 5 and whole.train_flat.shape[0] == 16
    assert torch.equal(bounded.train_flat, whole.train_flat[image_quality.reference_draw(16)])
    assert torch.equal(bounded.held_flat, whole.held_flat)  # 4 held out: within the bound


def test_the_encoding_device_is_the_processs_cuda_device_where_there_is_one(monkeypatch):
    from addnorm.tasks import dit_latents

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert dit_latents.encoding_device() == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)  # torchrun's set_device
    assert dit_latents.encoding_device() == torch.device("cuda", 1)


def test_the_images_are_encoded_on_the_encoding_device_and_the_vae_kept_on_the_cpu(
        data, monkeypatch):
    from addnorm.tasks import dit_latents

    pics, vae = data
    task = DiTTask.from_config(DiTTaskConfig(data=str(pics), vae=str(vae)))
    seen: list[torch.device] = []
    real = LatentVAE.encode
    monkeypatch.setattr(LatentVAE, "encode", lambda self, x, **k: seen.append(x.device)
                        or real(self, x, **k))
    asked: list[int] = []
    monkeypatch.setattr(dit_latents, "encoding_device",
                        lambda: asked.append(1) or torch.device("cpu"))
    task.data.latents(16)
    assert asked == [1] and seen and set(seen) == {torch.device("cpu")}
    assert next(task.data.vae.parameters()).device == torch.device("cpu")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_latents_encoded_on_cuda_are_the_cpus_up_to_the_encoders_rounding(data, tmp_path,
                                                                          monkeypatch):
    # The noise is drawn on the CPU by each row's generator on both devices, so only the
    # encoder's arithmetic differs: cuDNN convolutions run in TF32 by default (a 10-bit
    # mantissa, about 1e-3 relative an operation), so 2e-2 on latents of about unit scale,
    # still far below a wrong noise draw (differences of order 1).
    from addnorm.tasks import dit_latents

    pics, vae = data
    on_gpu = DiTTask.from_config(DiTTaskConfig(data=str(pics), vae=str(vae))).data.latents(16)
    monkeypatch.setenv("ADDNORM_CACHE", str(tmp_path / "cpu-cache"))
    monkeypatch.setattr(dit_latents, "encoding_device", lambda: torch.device("cpu"))
    on_cpu = DiTTask.from_config(DiTTaskConfig(data=str(pics), vae=str(vae))).data.latents(16)
    assert np.abs(np.asarray(on_gpu) - np.asarray(on_cpu)).max() < 2e-2
