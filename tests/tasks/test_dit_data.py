"""The ``dit`` task on a user's images: the model it prepares (the images' size, channels and
classes), what it refuses before a run starts, the loss with the batch's label dropout, a
tiny run (its figures, its data record, an exact resume, a resume refused after the images
changed), a one-class run (its headline), and the record a checkpoint keeps; the images as
one data object (``addnorm.tasks.dit_data``), opened only when needed.

Provenance: ``force_drop_ids`` equals the null class id in the labels (the DiT's definition
of label dropout, an identity); a resumed run's final loss equals the uninterrupted run's,
bit for bit (the same batches from the saved data order, the same arithmetic); the prepared
sizes are the images' own (written by the test); the default size of a user's images and the
line saying why it is not theirs follow ``default_image_size``'s documented rule (the
images' side, at most ``MAX_DEFAULT_PATCHES`` patches a side, a multiple of the patch), worked
out by hand for each case; the figures' keys are those ``image_quality`` documents.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch
from image_folders import write_folder
from PIL import Image
from small_pipeline import one_thread  # noqa: F401  (autouse: one thread)

from addnorm.data.digits import to_pixel_scale
from addnorm.data.fingerprint import DataChangedError, DataRecord
from addnorm.data.images import ImageCorpus, to_pixels
from addnorm.dit import DIT_PRESETS
from addnorm.tasks.dit import DiTTask, DiTTaskConfig
from addnorm.tasks.dit_data import (
    MAX_DEFAULT_PATCHES,
    SAMPLE_CHUNK,
    BundledDigits,
    UserImages,
    default_image_size,
    image_data,
)
from addnorm.tasks.plan import plan_fresh_run, plan_resumed_run
from addnorm.tasks.run import train_run
from addnorm.tasks.trained import load_trained
from addnorm.training.config import TrainConfig

TINY = DIT_PRESETS["DiT-digits-tiny"]


@pytest.fixture
def folder(tmp_path):
    write_folder(tmp_path / "pics", {"ants": 6, "bees": 6, "wasps": 6}, size=12)
    return tmp_path / "pics"


def _train_cfg(**overrides) -> TrainConfig:
    settings = dict(max_steps=4, max_minutes=None, batch_size=4, warmup=1, log_every=1,
                    checkpoint_every=2, ema_decay=0.0, schedule="constant")
    return dataclasses.replace(DiTTask.default_train_config(), **{**settings, **overrides})


def test_the_model_takes_the_images_size_channels_and_classes(folder):
    corpus = ImageCorpus.build(folder)
    task = DiTTask(data=corpus)
    cfg = task.prepare(TINY)  # no image_size: the images' own 12 (6 patches a side)
    assert (cfg.input_size, cfg.in_channels, cfg.n_classes) == (12, 3, 3)
    assert task.run_notes(TINY) == []  # their own size: nothing to say
    assert DiTTask(data=corpus, image_size=4).prepare(TINY).input_size == 4
    trained = DiTTask(data=DataRecord.from_dict(corpus.record.to_dict()))  # a run read back
    assert trained.prepare(TINY).input_size == 8 and trained.run_notes(TINY) == []
    assert task.class_names == ("ants", "bees", "wasps") and task.class_index("bees") == 1
    with pytest.raises(ValueError, match=r"image_size \(6\) must be divisible by patch_size "
                                         r"\(4\)"):
        DiTTask(data=corpus, image_size=6).prepare(dataclasses.replace(TINY, patch_size=4))
    with pytest.raises(ValueError, match=r"class must be one of the run's 3 classes \(ants, "
                                         r"bees, wasps\), got 'moths'"):
        task.class_index("moths")


def _sizes(*pairs: tuple[int, int], each: int = 1) -> np.ndarray:
    return np.array([p for p in pairs for _ in range(each)])


@pytest.mark.parametrize(("sizes", "patch", "size"), [
    (_sizes((12, 12), each=5), 2, 12),  # their own: 6 patches a side
    (_sizes((16, 16)), 2, 16),  # 8 patches a side: the most by default
    (_sizes((32, 32)), 4, 32),  # 8 patches of 4
    (_sizes((8, 8)), 2, 8),  # the digits' size
])
def test_images_train_at_their_own_size_when_it_is_a_few_patches(sizes, patch, size):
    assert default_image_size(sizes, patch) == (size, None)


def test_larger_images_train_at_eight_patches_a_side_and_say_why():
    size, note = default_image_size(_sizes((32, 32), each=3), 2)
    assert size == 16 == MAX_DEFAULT_PATCHES * 2
    assert note == (
        "training at 16x16, not your images' 32x32: at patch_size 2, 32x32 is 256 patches an "
        "image (16x16: 64), and a step's time grows faster than the patches, too slow for "
        "the defaults on a CPU; image_size 32 trains at their size, with patch_size 4 at 64 "
        "patches")
    # 28 = 7 * 4: the smallest patch that keeps 28 within 8 patches a side
    assert default_image_size(_sizes((28, 28)), 2)[1].endswith(
        "image_size 28 trains at their size, with patch_size 4 at 49 patches")
    assert default_image_size(_sizes((30, 30)), 2)[1].endswith("with patch_size 5 at 36 patches")


def test_other_shapes_and_mixed_sizes_are_said_and_take_the_median_side():
    # not square: center-cropped to the shorter side, said even at that size
    assert default_image_size(_sizes((12, 10)), 2) == (
        10, "your images are 12x10, each center-cropped to a square; training at 10x10")
    # shorter sides 10, 12, 14: the median, 12; an even count takes the lower middle one
    assert default_image_size(_sizes((10, 10), (12, 12), (20, 14)), 2) == (
        12, "your images are of 3 sizes (shorter sides 10 to 14, median 12), each "
            "center-cropped to a square; training at 12x12, their median")
    assert default_image_size(_sizes((8, 8), (12, 12)), 2)[0] == 8
    # a side no multiple of the patch: rounded down to one
    assert default_image_size(_sizes((30, 30)), 4) == (
        28, "training at 28x28, not your images' 30x30: the side must be a multiple of "
            "patch_size 4")
    assert default_image_size(_sizes((1, 1)), 2) == (
        2, "training at 2x2, not your images' 1x1: one patch at least (patch_size 2)")
    with pytest.raises(ValueError, match="no images"):
        default_image_size(np.zeros((0, 2)), 2)


def test_the_size_picked_is_the_one_prepared_and_noted(tmp_path):
    write_folder(tmp_path / "big", {"a": 3, "b": 3}, size=32)
    task = DiTTask.from_config(DiTTaskConfig(data=str(tmp_path / "big")))
    assert task.prepare(TINY).input_size == 16
    (note,) = task.run_notes(TINY)
    assert note.startswith("training at 16x16, not your images' 32x32")
    assert task.prepare(dataclasses.replace(TINY, patch_size=4)).input_size == 32
    assert task.run_notes(dataclasses.replace(TINY, patch_size=4)) == []
    asked = DiTTask.from_config(DiTTaskConfig(data=str(tmp_path / "big"), image_size=8))
    assert asked.prepare(TINY).input_size == 8 and asked.run_notes(TINY) == []
    digits = DiTTask()
    assert digits.prepare(DiTTask.default_model_config()).input_size == 8
    assert digits.run_notes(DiTTask.default_model_config()) == []


def test_a_run_needs_a_batch_of_train_images_and_two_held_out(folder, tmp_path):
    task = DiTTask(data=ImageCorpus.build(folder))  # 18 images: 15 train, 3 held out
    cfg = task.prepare(TINY)
    with pytest.raises(ValueError, match=r"the train split holds 15 images, fewer than a "
                                         r"batch \(batch_size 16\)"):
        task.check(cfg, _train_cfg(batch_size=16), DiTTaskConfig())
    write_folder(tmp_path / "few", {"a": 3}, size=8)
    few = DiTTask(data=ImageCorpus.build(tmp_path / "few"))
    with pytest.raises(ValueError, match="the held-out split holds 1 image; scoring needs "
                                         "at least 2"):
        few.check(few.prepare(TINY), _train_cfg(batch_size=1), DiTTaskConfig())


def test_the_settings_name_the_data_and_refuse_image_settings_without_it(folder):
    cfg = DiTTaskConfig(data="pics", image_size=16)
    assert cfg.data is not None and cfg.data.endswith("/pics") and cfg.data.startswith("/")
    for settings in ({"image_size": 16}, {"val_fraction": 0.3}):
        with pytest.raises(ValueError, match="need data"):
            DiTTaskConfig(**settings)
    with pytest.raises(ValueError, match="val_fraction"):
        DiTTaskConfig(data="pics", val_fraction=0.6)


def test_the_batch_drop_draw_is_the_null_class(folder):
    task = DiTTask(data=ImageCorpus.build(folder))
    cfg = task.prepare(TINY)
    torch.manual_seed(0)
    model = task.build_model(cfg)
    with torch.no_grad():  # a fresh DiT outputs zero: perturb it so the loss is not trivial
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    model.eval()  # no dropout draw of the model's own
    batch = task.batches(cfg, _train_cfg(), DiTTaskConfig()).next_batch()
    batch["drop"] = torch.tensor([True, False, True, False])
    loss, n = task.loss_fn(DiTTaskConfig())(model, batch)
    null = torch.where(batch["drop"], cfg.n_classes, batch["labels"])
    x_t = task.diffusion.q_sample(batch["images"], batch["t"], batch["noise"])
    expected = task.diffusion.loss(model(x_t, batch["t"], null), batch["images"], batch["t"],
                                   batch["noise"])
    assert n == 4 and torch.equal(loss, expected)


def test_a_tiny_run_scores_records_and_resumes_exactly(folder, tmp_path):
    task_cfg = DiTTaskConfig(data=str(folder), eval_size=6)
    whole = train_run("dit", TINY, _train_cfg(), tmp_path / "whole", task_cfg=task_cfg)
    metrics = whole.metrics
    # Random pixels, 3 held out: a class judge that cannot be trusted (image_quality's
    # judge_verdict), so the headline is precision and no class agreement is given.
    assert metrics["metric"] == "precision" and metrics["judge_trusted"] == 0.0
    assert "class_agreement" not in metrics and "class_agreement_ants" not in metrics
    for key in ("judge_test_accuracy", "precision", "recall",
                "frechet_distance", "frechet_distance_real", "nearest_train_distance",
                "nearest_train_distance_real"):
        assert np.isfinite(metrics[key]), key
    assert [s["class"] for s in metrics["samples"]] == ["ants", "bees", "wasps"]
    assert np.array(metrics["samples"][0]["pixels"]).shape == (12, 12, 3)  # the images' own
    record = json.loads((tmp_path / "whole" / "data.json").read_text())
    assert record["kind"] == "images" and record["details"]["classes"] == ["ants", "bees",
                                                                          "wasps"]
    assert record["split"]["train_images"] == 15 and record["n_files"] == 18
    train_run("dit", TINY, _train_cfg(max_steps=2), tmp_path / "half", task_cfg=task_cfg)
    plan = plan_resumed_run("dit", tmp_path / "half", train_overrides={"max_steps": 4})
    resumed = train_run("dit", plan.model_cfg, plan.train_cfg, tmp_path / "half",
                        task_cfg=plan.task_cfg, resume=plan.resume)
    assert resumed.metrics["train_loss"] == metrics["train_loss"]  # bit for bit
    Image.fromarray(np.zeros((12, 12, 3), np.uint8)).save(folder / "bees" / "img3.png")
    with pytest.raises(DataChangedError, match=r"changed since the run recorded it \(bees/"
                                               r"img3.png: 512 -> \d+ bytes\)"):
        plan_resumed_run("dit", tmp_path / "half", train_overrides={"max_steps": 6})


def test_a_run_read_back_samples_by_class_name_without_the_files(folder, tmp_path):
    task_cfg = DiTTaskConfig(data=str(folder), eval_size=3)
    train_run("dit", TINY, _train_cfg(max_steps=1), tmp_path / "run", task_cfg=task_cfg)
    for path in folder.rglob("*.png"):
        path.unlink()  # sampling never opens them
    task, model, _ = load_trained(tmp_path / "run")
    assert task.class_names == ("ants", "bees", "wasps") and task.channels == 3
    images = task.sample(model, torch.full((2,), task.class_index("wasps")),
                         generator=torch.Generator().manual_seed(0))
    assert images.dtype == torch.uint8 and images.shape == (2, 3, 12, 12)  # as trained
    restored = DiTTask.from_dict(task.to_dict())
    assert restored.record == task.record and restored.class_names == task.class_names


def test_a_flat_folder_trains_one_class_headlined_by_precision(tmp_path):
    write_folder(tmp_path / "flat", {"x": 12}, size=8, mode="L")
    flat = tmp_path / "shells"
    (tmp_path / "flat" / "x").rename(flat)
    plan = plan_fresh_run("dit", preset="DiT-digits-tiny", train_overrides={
        "data": str(flat), "batch_size": 4, "max_steps": 2, "eval_size": 4,
        "max_minutes": None})
    summary = train_run("dit", plan.model_cfg, plan.train_cfg, tmp_path / "run",
                        task_cfg=plan.task_cfg)
    assert summary.metrics["metric"] == "precision" and "class_agreement" not in summary.metrics
    task, model, _ = load_trained(tmp_path / "run")
    assert task.class_names == ("shells",) and task.sample_settings.guidance == 1.0
    assert model.cfg.in_channels == 1


def test_the_digits_task_is_as_before():
    """What a digits run saves and is refused, unchanged by the data settings."""
    task = DiTTask.from_dict({"n_steps": 1000, "schedule": "linear"})
    assert task.record is None and task.metric == "class_agreement"
    assert task.to_dict() == {"n_steps": 1000, "schedule": "linear", "prediction": "epsilon",
                              "min_snr_gamma": None}
    assert task.class_names == tuple("0123456789") and task.pixel_max == 16.0
    assert DiTTask().run_files() == {}


def test_the_task_is_given_one_image_data_and_reads_nothing_before_it_needs_to(folder,
                                                                              monkeypatch):
    """``image_data``: the digits, a corpus, its record (opened on first use, once) or an
    ImageData itself; the judge of a user's images is fitted once per size."""
    corpus = ImageCorpus.build(folder)
    assert isinstance(image_data(), BundledDigits)
    assert isinstance(image_data(corpus), UserImages) and image_data(corpus).corpus is corpus
    opened = []
    real = ImageCorpus.reopen.__func__
    monkeypatch.setattr(ImageCorpus, "reopen", classmethod(
        lambda cls, record: opened.append(record.path) or real(cls, record)))
    data = image_data(DataRecord.from_dict(corpus.record.to_dict()), image_size=8)
    task = DiTTask(data=data)
    assert task.data is data and opened == [] and task.class_names == corpus.classes
    assert data.train_size() == len(corpus.train_index) and data.corpus is data.corpus
    assert opened == [str(folder)]
    assert data.judge(8) is data.judge(8)
    with pytest.raises(TypeError, match="carries its own image_size"):
        image_data(data, image_size=8)
    with pytest.raises(TypeError, match="data must be an ImageCorpus"):
        DiTTask(data=str(folder))


def test_the_digits_samples_are_their_pixel_scale_and_records(folder):
    """BundledDigits' pixels are to_pixel_scale of the one channel (the digits' own
    conversion); a user's, to_pixels of every channel; each record is its sample's."""
    x = torch.linspace(-1.2, 1.2, 2 * 64).reshape(2, 1, 8, 8)
    digits = BundledDigits()
    assert torch.equal(digits.to_pixels(x), to_pixel_scale(x[:, 0]))
    record = digits.sample_record(3, digits.to_pixels(x)[0])
    assert record["class"] == 3 and np.array(record["pixels"]).shape == (8, 8)
    images = UserImages(ImageCorpus.build(folder).record)
    rgb = torch.linspace(-1, 1, 3 * 16).reshape(1, 3, 4, 4)
    assert torch.equal(images.to_pixels(rgb), to_pixels(rgb))
    record = images.sample_record(2, images.to_pixels(rgb)[0])
    assert record["class"] == "wasps" and record["max"] == 255
    assert np.array(record["pixels"]).shape == (4, 4, 3)
    assert (digits.samples_at_once(500), images.samples_at_once(500)) == (500, SAMPLE_CHUNK)
