"""``addnorm.load`` (``addnorm.tasks.loading``): which of the layouts a folder holds decides
how it is read, the model comes back ready for inference, and a folder holding none of them,
or another class than the one asked for, is refused naming what was expected.

Provenance: identities: an addnorm ``save_pretrained`` folder loads as the model that wrote it
(the same tensors, exactly, so the same logits); a run of ``addnorm train`` loads as
``load_trained`` rebuilds it. The layouts of transformers' and diffusers' folders are checked
against those libraries in tests/interop/test_hf_folder.py and test_diffusers_folder.py.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import addnorm
from addnorm import EncoderModel, TransformerLM
from addnorm.tasks.lm import LMTask, LMTaskConfig
from addnorm.tasks.run import train_run
from addnorm.tasks.trained import load_trained
from addnorm.training.config import TrainConfig
from addnorm.utils.files import CheckpointError


def test_a_pretrained_folder_loads_as_the_model_that_wrote_it_in_eval_mode(tmp_path):
    torch.manual_seed(0)
    model = TransformerLM(addnorm.PRESETS["lm-tiny"]).eval()
    model.save_pretrained(tmp_path)
    loaded = addnorm.load(tmp_path)
    assert type(loaded) is TransformerLM and not loaded.training
    expected = model.state_dict()
    assert all(torch.equal(expected[k], v) for k, v in loaded.state_dict().items())
    ids = torch.tensor([[5, 6, 7, 8]])
    assert torch.equal(loaded(ids), model(ids))
    assert addnorm.load(tmp_path, TransformerLM, dtype="float64").embed.tokens.weight.dtype == (
        torch.float64)


def test_a_run_of_addnorm_train_loads_as_load_trained_rebuilds_it(tmp_path):
    task = LMTask()
    model_cfg = dataclasses.replace(task.default_model_config(), d_model=16, n_heads=2,
                                    n_layers=1, d_ff=32)
    train_run("lm", model_cfg, TrainConfig(max_steps=2, batch_size=2, warmup=1), tmp_path,
              task_cfg=LMTaskConfig(seq_len=8, eval_size=2))
    _, trained, _ = load_trained(tmp_path)
    loaded = addnorm.load(tmp_path, TransformerLM)
    assert not loaded.training
    assert all(torch.equal(trained.state_dict()[k], v) for k, v in loaded.state_dict().items())


def test_a_run_that_kept_its_best_loads_it_unless_asked_for_its_last(tmp_path, monkeypatch):
    scripted = iter([3.0, 1.0, 2.0, 2.0, 2.0])  # the best at step 2 of 4
    real = LMTask.evaluate_run
    monkeypatch.setattr(LMTask, "evaluate_run", lambda self, model, cfg: {
        **real(self, model, cfg), "val_bpc": next(scripted)})
    task = LMTask()
    model_cfg = dataclasses.replace(task.default_model_config(), d_model=16, n_heads=2,
                                    n_layers=1, d_ff=32)
    summary = train_run("lm", model_cfg, TrainConfig(max_steps=4, batch_size=2, warmup=1,
                                                     keep_best=True, eval_every=1),
                        tmp_path, task_cfg=LMTaskConfig(seq_len=8, eval_size=2))
    assert summary.best is not None and summary.best.name == "best-00000002"
    for which, path in (("best", summary.best), ("last", summary.checkpoint)):
        _, expected, _ = load_trained(path)
        loaded = addnorm.load(tmp_path, which=which)
        assert all(torch.equal(expected.state_dict()[k], v)
                   for k, v in loaded.state_dict().items()), which
    best, last = addnorm.load(tmp_path), addnorm.load(tmp_path, which="last")
    assert any(not torch.equal(v, last.state_dict()[k]) for k, v in best.state_dict().items())
    with pytest.raises(ValueError, match="which"):
        addnorm.load(tmp_path, which="newest")


def test_a_folder_with_no_model_is_refused_naming_the_layouts_it_may_hold(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        addnorm.load(tmp_path / "missing")
    (tmp_path / "file").write_text("")
    with pytest.raises(CheckpointError, match="is a file, not a directory"):
        addnorm.load(tmp_path / "file")
    with pytest.raises(CheckpointError, match=r"holds no addnorm model: expected config\.json"):
        addnorm.load(tmp_path)


def test_another_class_than_the_folder_holds_is_refused_and_cls_must_be_a_module(tmp_path):
    TransformerLM(addnorm.PRESETS["lm-tiny"]).save_pretrained(tmp_path)
    with pytest.raises(CheckpointError, match="holds a TransformerLM, not a EncoderModel"):
        addnorm.load(tmp_path, EncoderModel)
    with pytest.raises(TypeError, match="cls must be an nn.Module class or None"):
        addnorm.load(tmp_path, int)  # type: ignore[type-var]
    with pytest.raises(ValueError, match="weights"):
        addnorm.load(tmp_path, weights="best")
