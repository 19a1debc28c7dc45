"""save_pretrained / from_pretrained and addnorm.load.

Provenance: identities. A model read back computes exactly what the saved one computed on
the same inputs; a tied weight is one Parameter again; ``addnorm.load`` of a training run
holds exactly the tensors of the run's checkpoint (its EMA or its trained weights), the same
as ``tasks.trained.load_trained``; the files hold what the format says (each tensor once).
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

import addnorm
from addnorm import DiT, Transformer, TransformerLM
from addnorm.dit.config import DiTConfig
from addnorm.pretrained.mixin import CONFIG_FILE, WEIGHTS_FILE, PretrainedMixin
from addnorm.tasks.lm import LMTask, LMTaskConfig
from addnorm.tasks.run import train_run
from addnorm.tasks.trained import load_trained
from addnorm.training.checkpoint import load_checkpoint, save_checkpoint
from addnorm.training.config import TrainConfig
from addnorm.utils.files import CheckpointError

LM_CFG = addnorm.PRESETS["lm-tiny"]
SEQ2SEQ_CFG = dataclasses.replace(addnorm.PRESETS["tiny"], n_encoder_layers=1, n_decoder_layers=1)
DIT_CFG = DiTConfig(input_size=8, patch_size=4, in_channels=1, d_model=32, n_heads=2,
                    n_layers=1, n_classes=10)


def _trained_like(model: torch.nn.Module) -> torch.nn.Module:
    """Random values in every float tensor (a fresh DiT outputs exactly 0, which would hide a
    weight that was not loaded)."""
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.1)
    return model.eval()


def _outputs(model: torch.nn.Module) -> torch.Tensor:
    torch.manual_seed(1)
    if isinstance(model, TransformerLM):
        return model(torch.randint(3, LM_CFG.vocab_size, (2, 6)))
    if isinstance(model, Transformer):
        src = torch.randint(3, SEQ2SEQ_CFG.src_vocab_size, (2, 5))
        return model(src, torch.randint(3, SEQ2SEQ_CFG.tgt_vocab_size, (2, 4)))
    x = torch.randn(2, 1, 8, 8)
    return model(x, torch.tensor([3.0, 700.0]), torch.tensor([1, 7]))


@pytest.mark.parametrize(
    ("cls", "cfg"), [(TransformerLM, LM_CFG), (Transformer, SEQ2SEQ_CFG), (DiT, DIT_CFG)]
)
def test_a_saved_model_loads_back_computing_the_same_outputs(tmp_path, cls, cfg):
    model = _trained_like(cls(cfg))
    model.save_pretrained(tmp_path / "m")
    loaded = cls.from_pretrained(tmp_path / "m")
    assert not loaded.training
    assert loaded.cfg == cfg
    torch.testing.assert_close(_outputs(loaded), _outputs(model), rtol=0, atol=0)
    assert isinstance(addnorm.load(tmp_path / "m"), cls)


def test_config_json_names_the_class_the_config_and_the_version(tmp_path):
    TransformerLM(LM_CFG).save_pretrained(tmp_path)
    data = json.loads((tmp_path / CONFIG_FILE).read_text())
    assert data["addnorm_class"] == "TransformerLM"
    assert data["addnorm_version"] == addnorm.__version__
    assert addnorm.LMConfig.from_dict(data["config"]) == LM_CFG


def test_tied_weights_are_stored_once_and_tied_again(tmp_path):
    model = _trained_like(TransformerLM(LM_CFG))
    assert model.to_logits.weight is model.embed.tokens.weight
    model.save_pretrained(tmp_path)
    saved = load_file(tmp_path / WEIGHTS_FILE)
    assert "embed.tokens.weight" in saved and "to_logits.weight" not in saved
    assert len(saved) == len(model.state_dict()) - 1
    loaded = TransformerLM.from_pretrained(tmp_path)
    assert loaded.to_logits.weight is loaded.embed.tokens.weight


def test_the_seq2seq_shared_tables_are_stored_once(tmp_path):
    model = Transformer(SEQ2SEQ_CFG)  # source, target and output share one table
    model.save_pretrained(tmp_path)
    saved = load_file(tmp_path / WEIGHTS_FILE)
    assert len(saved) == len(model.state_dict()) - 2
    loaded = Transformer.from_pretrained(tmp_path)
    assert loaded.src_embed.tokens.weight is loaded.tgt_embed.tokens.weight
    assert loaded.to_logits.weight is loaded.tgt_embed.tokens.weight


@pytest.mark.parametrize("dtype", [torch.bfloat16, "float16", "torch.float64"])
def test_dtype_is_a_torch_dtype_or_its_name(tmp_path, dtype):
    model = _trained_like(TransformerLM(LM_CFG))
    model.save_pretrained(tmp_path)
    loaded = TransformerLM.from_pretrained(tmp_path, dtype=dtype)
    want = dtype if isinstance(dtype, torch.dtype) else getattr(torch, dtype.split(".")[-1])
    assert {p.dtype for p in loaded.parameters()} == {want}
    assert torch.equal(loaded.embed.tokens.weight, model.embed.tokens.weight.to(want))


def test_without_a_dtype_the_saved_one_is_kept(tmp_path):
    model = _trained_like(TransformerLM(LM_CFG)).to(torch.bfloat16)
    model.save_pretrained(tmp_path)
    loaded = TransformerLM.from_pretrained(tmp_path, device="cpu")
    assert {p.dtype for p in loaded.parameters()} == {torch.bfloat16}
    assert torch.equal(loaded.embed.tokens.weight, model.embed.tokens.weight)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"dtype": "int8"}, ValueError, "floating-point"),
        ({"dtype": "float13"}, ValueError, "names no torch dtype"),
        ({"dtype": 16}, TypeError, "dtype must be"),
        ({"device": "gpu7"}, ValueError, "not a torch device"),
        ({"device": 0.5}, TypeError, "device must be"),
    ],
)
def test_bad_dtype_and_device_arguments_are_refused(tmp_path, kwargs, error, match):
    TransformerLM(LM_CFG).save_pretrained(tmp_path)
    with pytest.raises(error, match=match):
        TransformerLM.from_pretrained(tmp_path, **kwargs)


def test_a_missing_directory_or_file_is_named(tmp_path):
    with pytest.raises(CheckpointError, match="not found"):
        TransformerLM.from_pretrained(tmp_path / "nowhere")
    TransformerLM(LM_CFG).save_pretrained(tmp_path)
    (tmp_path / WEIGHTS_FILE).unlink()
    with pytest.raises(CheckpointError, match="weights missing.*model.safetensors"):
        TransformerLM.from_pretrained(tmp_path)
    (tmp_path / CONFIG_FILE).unlink()
    with pytest.raises(CheckpointError, match="config missing.*config.json"):
        TransformerLM.from_pretrained(tmp_path)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "must hold a JSON object"),
        ('{"config": {}}', "addnorm_class"),
        ('{"addnorm_class": "GPT5", "config": {}}', r"unknown addnorm_class 'GPT5'"),
        ('{"addnorm_class": "TransformerLM", "config": {"n_wings": 2}}', r"\['n_wings'\]"),
        ('{"addnorm_class": "TransformerLM", "config": {"d_model": 30}}', "divisible"),
    ],
)
def test_a_bad_config_json_is_named_with_the_reason(tmp_path, text, match):
    TransformerLM(LM_CFG).save_pretrained(tmp_path)
    (tmp_path / CONFIG_FILE).write_text(text)
    with pytest.raises(CheckpointError, match=match):
        TransformerLM.from_pretrained(tmp_path)


def test_another_familys_directory_is_refused_by_name(tmp_path):
    DiT(DIT_CFG).save_pretrained(tmp_path)
    with pytest.raises(CheckpointError, match="holds a DiT, not a TransformerLM"):
        TransformerLM.from_pretrained(tmp_path)
    assert isinstance(PretrainedMixin.from_pretrained(tmp_path), DiT)


def test_missing_and_unexpected_keys_are_named(tmp_path):
    TransformerLM(LM_CFG).save_pretrained(tmp_path)
    tensors = load_file(tmp_path / WEIGHTS_FILE)
    tensors["extra.weight"] = tensors.pop("blocks.norm.weight")
    save_file(tensors, tmp_path / WEIGHTS_FILE)
    with pytest.raises(CheckpointError) as info:
        TransformerLM.from_pretrained(tmp_path)
    assert "missing keys ['blocks.norm.weight']" in str(info.value)
    assert "unexpected keys ['extra.weight']" in str(info.value)


def test_mismatched_shapes_are_named(tmp_path):
    TransformerLM(LM_CFG).save_pretrained(tmp_path)
    TransformerLM(dataclasses.replace(LM_CFG, d_ff=128)).save_pretrained(tmp_path / "other")
    (tmp_path / "other" / WEIGHTS_FILE).replace(tmp_path / WEIGHTS_FILE)
    with pytest.raises(CheckpointError, match=r"w1.weight: saved \(128, 64\), model \(256, 64\)"):
        TransformerLM.from_pretrained(tmp_path)


def test_a_corrupt_weights_file_is_named(tmp_path):
    TransformerLM(LM_CFG).save_pretrained(tmp_path)
    (tmp_path / WEIGHTS_FILE).write_bytes(b"\x00" * 20)
    with pytest.raises(CheckpointError, match="cannot read .*model.safetensors"):
        TransformerLM.from_pretrained(tmp_path)


def test_saving_again_replaces_the_files(tmp_path):
    first = _trained_like(TransformerLM(LM_CFG))
    first.save_pretrained(tmp_path)
    second = TransformerLM(LM_CFG).eval()
    second.save_pretrained(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [CONFIG_FILE, WEIGHTS_FILE]
    loaded = TransformerLM.from_pretrained(tmp_path)
    # Bit for bit, as above: the same weights through the same kernels.
    torch.testing.assert_close(_outputs(loaded), _outputs(second), rtol=0, atol=0)


def test_load_names_what_it_expected_in_a_folder_without_a_model(tmp_path):
    with pytest.raises(CheckpointError, match="holds no addnorm model.*config.json.*manifest"):
        addnorm.load(tmp_path)
    with pytest.raises(CheckpointError, match="does not exist"):
        addnorm.load(tmp_path / "nowhere")
    with pytest.raises(ValueError, match="weights must be one of"):
        addnorm.load(tmp_path, weights="best")


def _tiny_lm_config(task: LMTask) -> addnorm.LMConfig:
    return dataclasses.replace(
        task.prepare(task.default_model_config()), d_model=32, n_heads=2, n_layers=1, d_ff=64
    )


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory):
    """An lm run directory with one checkpoint that has an EMA (written as the trainer writes
    it: trained and EMA weights, and the run's task and model config in state.json)."""
    run_dir = tmp_path_factory.mktemp("lm-run")
    task = LMTask()
    cfg = _tiny_lm_config(task)
    raw = _trained_like(task.build_model(cfg)).state_dict()
    ema = {name: value * 0.5 for name, value in raw.items()}
    run = {"task": "lm", "model_config": cfg.to_dict(), "task_data": task.to_dict()}
    save_checkpoint(run_dir, 3, {"model": raw, "ema": ema}, {"run": run})
    return run_dir


@pytest.mark.slow
def test_load_opens_what_addnorm_train_wrote(tmp_path):
    task = LMTask()
    train = TrainConfig(max_steps=3, batch_size=2, lr=3e-3, warmup=1, ema_decay=0.5)
    train_run("lm", _tiny_lm_config(task), train, tmp_path,
              task_cfg=LMTaskConfig(seq_len=8, eval_size=2))
    model = addnorm.load(tmp_path)
    for name, value in model.state_dict().items():
        assert torch.equal(value, load_checkpoint(tmp_path).tensors["ema"][name]), name


@pytest.mark.parametrize("weights", ["ema", "raw"])
def test_load_opens_a_training_run_with_the_weights_asked_for(lm_run, weights):
    model = addnorm.load(lm_run, weights=weights)
    checkpoint = load_checkpoint(lm_run)
    stem = "ema" if weights == "ema" else "model"
    assert isinstance(model, TransformerLM) and not model.training
    for name, value in model.state_dict().items():
        assert torch.equal(value, checkpoint.tensors[stem][name]), name
    reference = load_trained(lm_run, weights=weights)[1]
    assert model.state_dict().keys() == reference.state_dict().keys()


def test_a_trained_model_saved_pretrained_loads_back_the_same(lm_run, tmp_path):
    model = addnorm.load(lm_run / "checkpoints" / load_checkpoint(lm_run).path.name)
    model.save_pretrained(tmp_path)
    loaded = addnorm.load(tmp_path, dtype="float64")
    for name, value in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], value.double()), name


def test_a_subclass_is_saved_and_loaded_as_itself(tmp_path):
    class ShoutingLM(TransformerLM):
        def forward(self, ids, *, padding_mask=None):
            return 2 * super().forward(ids, padding_mask=padding_mask)

    model = _trained_like(ShoutingLM(LM_CFG))
    model.save_pretrained(tmp_path)
    loaded = addnorm.load(tmp_path)
    assert type(loaded) is ShoutingLM
    torch.testing.assert_close(_outputs(loaded), _outputs(model), rtol=0, atol=0)
    assert isinstance(TransformerLM.from_pretrained(tmp_path), ShoutingLM)


def test_a_same_named_tracing_proxy_class_does_not_replace_the_registered_class(tmp_path):
    # torch.fx's _ModuleStackTracer (used by torch.export and the ONNX exporter) makes, per
    # module, type(base.__name__, (AttrProxy, base), {}): a subclass under the same name. One
    # once replaced TransformerLM in the registry, and every later from_pretrained in the
    # process failed inside the proxy's __init__.
    class AttrProxy:
        def __init__(self, base, path):  # the proxy's signature: not a model constructor
            raise AssertionError("the proxy class was instantiated")

    type(TransformerLM.__name__, (AttrProxy, TransformerLM), {})
    model = TransformerLM(dataclasses.replace(LM_CFG, n_layers=1)).eval()
    model.save_pretrained(tmp_path)
    loaded = TransformerLM.from_pretrained(tmp_path)
    assert type(loaded) is TransformerLM
    ids = torch.randint(3, LM_CFG.vocab_size, (2, 5))
    assert torch.equal(loaded(ids), model(ids))
