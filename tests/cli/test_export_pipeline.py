"""``addnorm export RUN --format pipeline --out FOLDER`` on a tiny DiT run trained on a small
random VAE's latents (``small_pipeline.autoencoder``; two classes, ants and bees): the folder
diffusers loads, the check's two lines, the folder read back as the run, and every refusal one
line and exit 2 with nothing written.

Provenance: the images compared are diffusers' own ``DiTPipeline.from_pretrained`` of the
folder against addnorm's sampler of the run's DiT, the same seed; the tolerance is the
command's ``TOLERANCE`` (its provenance in cli/export_pipeline.py), and a folder whose null row
written wrong is caught by it (the check can fail). The run's two training steps leave the
zero-initialised gates near zero, so the run's weights are perturbed as it loads (as
tests/tasks/test_dit_latents.py does).
"""

from __future__ import annotations

import re
import shutil

import pytest
import torch
from data.test_images import write_folder
from small_dit import perturbed
from small_pipeline import (
    autoencoder,
    diffusers_pipeline,
    one_thread,  # noqa: F401  (autouse: one thread)
)

import addnorm
from addnorm.cli.export_pipeline import TOLERANCE
from addnorm.cli.parser import main

diffusers = pytest.importorskip("diffusers")
TINY = ["--preset", "DiT-digits-tiny", "--batch-size", "4", "--eval-size", "2",
        "--max-steps", "2", "--no-keep-best", "--quiet", "--ema-decay", "0"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A latent run diffusers can hold (shift 1), a pixel run, and the VAE."""
    root = tmp_path_factory.mktemp("export-pipeline")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ADDNORM_CACHE", str(root / "cache"))
        write_folder(root / "pics", {"ants": 10, "bees": 10}, size=16)
        autoencoder().save_pretrained(root / "vae")
        assert main(["train", "dit", *TINY, "--data", str(root / "pics"), "--vae",
                     str(root / "vae"), "--timestep-downscale-freq-shift", "1",
                     "--out", str(root / "latent")]) == 0
        assert main(["train", "dit", *TINY, "--data", str(root / "pics"), "--out",
                     str(root / "pixels")]) == 0
    return root


@pytest.fixture(autouse=True)
def perturbed_runs(monkeypatch):
    """Runs load with every DiT weight perturbed (seed 3), as the command and the tests see
    them."""
    import addnorm.tasks.trained as trained

    real = trained.load_trained

    def load_trained(*args, **kwargs):
        task, model, checkpoint = real(*args, **kwargs)
        return task, perturbed(model, seed=3, scale=0.05), checkpoint

    monkeypatch.setattr(trained, "load_trained", load_trained)
    return load_trained


def _export(*argv):
    return main(["export", *map(str, argv), "--format", "pipeline"])


def test_the_folder_is_checked_against_diffusers_and_read_back_as_the_run(
        runs, tmp_path, capfd, perturbed_runs):
    out = tmp_path / "pipe"
    assert _export(runs / "latent", "--out", out) == 0
    lines = capfd.readouterr().out.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith(f"wrote {out}: a diffusers DiTPipeline"), lines
    error = float(re.search(r"max \|difference\| (\S+)$", lines[1]).group(1))
    assert error <= TOLERANCE and "guidance 4" in lines[1], lines
    assert diffusers_pipeline(out).labels == {"ants": 0, "bees": 1}
    assert not [p for p in tmp_path.iterdir() if p.name != "pipe"]  # no partial folder left
    pipe = addnorm.load(out)  # the run's 2 classes again, tensor for tensor
    _, model, _ = perturbed_runs(runs / "latent")
    assert pipe.transformer.cfg.n_classes == 2 and pipe.class_names.index("bees") == 1
    ours = pipe.transformer.state_dict()
    assert ours.keys() == model.state_dict().keys()
    assert all(torch.equal(ours[k], v) for k, v in model.state_dict().items())
    assert main(["sample", "--checkpoint", str(out), "--class", "bees", "--n", "2", "--steps",
                 "2", "--out", str(tmp_path / "bees.png"), "--quiet", "--device", "cpu"]) == 0


def test_diffusers_samples_the_written_run_as_addnorm_at_guidance_4_and_1(
        runs, tmp_path, perturbed_runs):
    # Tolerance: FLOAT32_MODEL, as tests/interop/test_dit_pipeline.py's parity (<= 6e-7
    # measured there); DDIM made from the folder's config as diffusers users swap schedulers
    # (clip_sample off and DDIM's leading spacing: what addnorm's DDIM runs).
    from tolerances import FLOAT32_MODEL

    from addnorm.dit.class_names import ClassNames
    from addnorm.interop.dit_pipeline import DiTPipeline

    assert _export(runs / "latent", "--out", tmp_path / "pipe", "--no-check") == 0
    task, model, _ = perturbed_runs(runs / "latent")
    theirs = diffusers_pipeline(tmp_path / "pipe")
    schedulers = {"dpm-solver++": theirs.scheduler, "ddim": diffusers.DDIMScheduler.from_config(
        theirs.scheduler.config, clip_sample=False, timestep_spacing="leading")}
    for method, scheduler in schedulers.items():
        theirs.scheduler = scheduler
        config = {**scheduler.config, "_class_name": type(scheduler).__name__}
        ours = DiTPipeline(model, task.data.vae, config, ClassNames(2))
        for guidance in (4.0, 1.0):
            expected = theirs([1, 0], guidance_scale=guidance, num_inference_steps=4,
                              generator=torch.Generator().manual_seed(5),
                              output_type="pt").images
            images = ours.sample([1, 0], steps=4, guidance=guidance,
                                 generator=torch.Generator().manual_seed(5))
            assert float(expected.std()) > 0.05, (method, guidance)  # not flat
            torch.testing.assert_close(images, expected, **FLOAT32_MODEL)


def test_the_check_fails_a_folder_whose_guidance_is_wrong(runs, tmp_path, capfd, monkeypatch):
    import addnorm.interop.diffusers_pipeline as writer

    real = writer.widen_classes

    def wrong_null(dit):  # the null row (1000) a class's row: diffusers guides off the mark
        wide = real(dit)
        with torch.no_grad():
            wide.class_embed.table.weight[1000] = wide.class_embed.table.weight[0]
        return wide

    monkeypatch.setattr(writer, "widen_classes", wrong_null)
    assert _export(runs / "latent", "--out", tmp_path / "pipe") == 1
    captured = capfd.readouterr()
    assert "more than 4e-04" in captured.err.strip().splitlines()[-1], captured.err


def test_an_existing_folder_is_refused_unless_overwrite_and_then_replaced(runs, tmp_path,
                                                                          capfd):
    out = tmp_path / "pipe"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert _export(runs / "latent", "--out", out, "--no-check") == 2
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "exists and is not empty (--overwrite" in err[0], err
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    assert _export(runs / "latent", "--out", out, "--no-check", "--overwrite") == 0
    assert (out / "model_index.json").is_file() and not (out / "keep.txt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipe"]


@pytest.mark.parametrize("case", ["pixels", "lm", "missing", "file", "part", "run"])
def test_bad_input_is_one_line_exit_2_and_nothing_written(runs, lm_run, tmp_path, capfd, case):
    run = {"pixels": runs / "pixels", "lm": lm_run, "missing": tmp_path / "nowhere",
           "run": tmp_path / "pipe" / "run"}.get(case, runs / "latent")
    out = tmp_path / "pipe"
    extra = {"part": ["--part", "encoder"], "run": ["--overwrite"]}.get(case, [])
    if case == "run":  # the run inside --out: --overwrite would remove it
        shutil.copytree(runs / "latent", run)
    if case == "file":
        out.write_text("a file")
    before = sorted(tmp_path.iterdir())
    assert _export(run, "--out", out, *extra) == 2
    err = capfd.readouterr().err.strip().splitlines()
    expected = {"pixels": "trained on pixels", "lm": "--format pipeline writes a DiT run",
                "missing": "does not exist", "file": "exists and is not a folder",
                "part": "--part encoder", "run": "holds the run"}[case]
    assert len(err) == 1 and expected in err[0], err
    assert sorted(tmp_path.iterdir()) == before


def test_a_dit_diffusers_cannot_hold_leaves_nothing(runs, tmp_path, capfd):
    # the pixel-free refusal that comes from the writer itself: DiT's timestep shift 0
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ADDNORM_CACHE", str(runs / "cache"))
        assert main(["train", "dit", *TINY, "--data", str(runs / "pics"), "--vae",
                     str(runs / "vae"), "--out", str(tmp_path / "shift0")]) == 0
        capfd.readouterr()
        assert _export(tmp_path / "shift0", "--out", tmp_path / "pipe") == 2
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--timestep-downscale-freq-shift 1" in err[0], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shift0"]


def test_overwrite_is_refused_for_onnx(runs, tmp_path, capfd):
    code = main(["export", str(runs / "latent"), "--out", str(tmp_path / "m.onnx"),
                 "--overwrite"])
    err = capfd.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "--format pipeline" in err[0], err


def test_a_write_that_fails_half_way_leaves_nothing(runs, tmp_path, capfd, monkeypatch):
    import addnorm.tasks.dit_latents as dit_latents

    def half_written(task, model, folder):
        (folder / "model_index.json").write_text("{}")
        raise OSError("No space left on device")

    monkeypatch.setattr(dit_latents, "save_pipeline", half_written)
    assert _export(runs / "latent", "--out", tmp_path / "pipe") == 1
    err = capfd.readouterr().err.strip().splitlines()
    assert err[-1] == ("addnorm export: error: writing the pipeline failed (OSError: No space "
                       "left on device)"), err
    assert list(tmp_path.iterdir()) == []
