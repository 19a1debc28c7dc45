"""``translate``, ``generate`` and ``sample`` open what ``addnorm.load`` opens, not runs only:
a ``save_pretrained`` folder, a transformers or a diffusers folder; and ``addnorm.load`` opens
a diffusers DiT folder.

Provenance: a folder saved from a run's model gives the run's own output (the same weights,
the same task defaults the run trained with, the same seed: the same operations, so the same
text and bitwise the same digits); a diffusers folder loads as ``from_diffusers`` converts the
model it was saved from. Folders whose model the task's data cannot drive exit 2 naming why.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import addnorm
from addnorm.cli.parser import main
from addnorm.dit import DiT
from addnorm.interop import from_diffusers
from addnorm.tasks.dit import DiTTask
from addnorm.tasks.lm import LMTask
from addnorm.tasks.translate import TranslateTask
from addnorm.utils.files import CheckpointError

CPU = ["--device", "cpu", "--threads", "1"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Tiny runs of the three tasks, their evaluation skipped, each also saved as a
    ``save_pretrained`` folder of the weights the CLI uses (the EMA's where kept)."""
    root = tmp_path_factory.mktemp("folders")
    tiny = {
        "translate": ["--preset", "tiny", "--d-model", "32", "--n-heads", "2", "--d-ff", "64",
                      "--n-encoder-layers", "1", "--n-decoder-layers", "1", "--batch-size",
                      "4", "--eval-size", "4", "--max-steps", "2"],
        "lm": ["--preset", "lm-tiny", "--d-model", "32", "--n-heads", "2", "--d-ff", "64",
               "--n-layers", "1", "--batch-size", "2", "--seq-len", "16", "--eval-size", "2",
               "--max-steps", "2"],
        "dit": ["--preset", "DiT-digits-tiny", "--batch-size", "8", "--eval-size", "10",
                "--max-steps", "2"],
    }
    with pytest.MonkeyPatch.context() as patch:
        for task in (TranslateTask, LMTask, DiTTask):
            patch.setattr(task, "evaluate_run", lambda self, m, c: {self.metric: 0.0})
            patch.setattr(task, "run_samples", lambda self, model: [])
        for name, flags in tiny.items():
            out = root / name
            assert main(["train", name, *flags, "--quiet", *CPU, "--out", str(out)]) == 0
            addnorm.load(out).save_pretrained(root / f"{name}-folder")
    return root


def test_translate_answers_from_a_save_pretrained_folder_as_from_its_run(runs, capsys):
    dates = ["21 Nov 2026", "2001-02-03", "Mar 4, 1999"]
    main(["translate", "--checkpoint", str(runs / "translate"), *dates, *CPU])
    from_run = capsys.readouterr().out
    main(["translate", "--checkpoint", str(runs / "translate-folder"), *dates, *CPU])
    assert capsys.readouterr().out == from_run and len(from_run.splitlines()) == 3


def test_generate_continues_from_a_save_pretrained_folder_as_from_its_run(runs, capsys):
    args = ["--prompt", "def ", "--max-new-tokens", "12", "--seed", "3", *CPU]
    assert main(["generate", "--checkpoint", str(runs / "lm"), *args]) == 0
    from_run = capsys.readouterr().out
    assert main(["generate", "--checkpoint", str(runs / "lm-folder"), *args]) == 0
    assert capsys.readouterr().out == from_run


def test_sample_draws_from_a_save_pretrained_dit_folder_as_from_its_run(runs, tmp_path):
    arrays = []
    for source in ("dit", "dit-folder"):
        array = tmp_path / f"{source}.npy"
        assert main(["sample", "--checkpoint", str(runs / source), "--n", "10", "--steps", "4",
                     "--seed", "2", "--out", str(tmp_path / f"{source}.png"), "--save-array",
                     str(array), "--quiet", *CPU]) == 0
        arrays.append(np.load(array))
    np.testing.assert_array_equal(arrays[1], arrays[0])  # same weights, task, seed: bitwise


def diffusers_digits_dit(folder):
    """A diffusers DiT of the digits' shape (8x8, one channel, ten classes), perturbed, saved
    by its own save_pretrained; returns the model."""
    diffusers = pytest.importorskip("diffusers")
    torch.manual_seed(0)
    model = diffusers.DiTTransformer2DModel(
        num_attention_heads=2, attention_head_dim=16, in_channels=1, out_channels=1,
        num_layers=2, sample_size=8, patch_size=2, num_embeds_ada_norm=10,
    )
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    model.eval().save_pretrained(folder)
    return model


def test_load_opens_a_diffusers_dit_folder_and_sample_draws_from_it(tmp_path):
    folder = tmp_path / "diffusers-dit"
    theirs = diffusers_digits_dit(folder)
    ours = addnorm.load(folder, DiT)
    expected = from_diffusers(theirs)
    assert ours.cfg == expected.cfg and not ours.training
    for key, value in expected.state_dict().items():
        assert torch.equal(ours.state_dict()[key], value), key
    with pytest.raises(CheckpointError, match=r"holds a diffusers DiTTransformer2DModel that "
                                              r"loads as DiT, not TransformerLM"):
        addnorm.load(folder, addnorm.TransformerLM)
    array = tmp_path / "digits.npy"
    assert main(["sample", "--checkpoint", str(folder), "--n", "10", "--steps", "3", "--out",
                 str(tmp_path / "digits.png"), "--save-array", str(array), "--quiet",
                 *CPU]) == 0
    assert np.load(array).shape == (10, 8, 8)


def test_load_opens_a_diffusers_pipeline_folder_naming_a_part_it_lacks(tmp_path):
    # A whole pipeline folder loads as a DiTPipeline (tests/interop/test_diffusers_pipeline.py);
    # one that lists no parts is refused naming the parts it lacks.
    (tmp_path / "model_index.json").write_text('{"_class_name": "DiTPipeline"}')
    with pytest.raises(CheckpointError, match=r"model_index.json lists no transformer and no "
                                              r"vae and no scheduler"):
        addnorm.load(tmp_path)


def one_error_line(capsys, command: str) -> str:
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"addnorm {command}: error: "), err
    return err[0]


def test_a_folder_of_another_family_is_refused_naming_what_it_holds(runs, capsys):
    code = main(["generate", "--checkpoint", str(runs / "dit-folder"), "--prompt", "a", *CPU])
    assert code == 2
    assert ("holds a DiT; this command needs a 'lm' model (one whose config is a LMConfig)"
            in one_error_line(capsys, "generate"))


def test_a_folder_whose_vocabulary_is_not_the_tasks_is_refused_naming_it(tmp_path, capsys):
    lm = addnorm.TransformerLM(addnorm.PRESETS["lm-tiny"])  # vocabulary 128, not the corpus'
    lm.save_pretrained(tmp_path / "lm")
    code = main(["generate", "--checkpoint", str(tmp_path / "lm"), "--prompt", "a", *CPU])
    assert code == 2
    line = one_error_line(capsys, "generate")
    assert "holds a TransformerLM with" in line and "vocab_size 128" in line
    assert "the lm task's data needs" in line and "(a model addnorm train lm trained)" in line
