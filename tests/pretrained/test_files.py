"""A pretrained directory edited by hand or by an attacker: every edit is refused with
CheckpointError naming the file, before the model is allocated or the weights are read.

Provenance: identities and the format's own rules. A config edited to a larger model holds
more numbers than its weights file (refused by definition of the format); a tensor's dtype
and shape are the built model's; a file that is not a regular file is refused without being
opened; the header reader agrees with the safetensors library on files that library wrote.
"No large allocation" is checked by construction: the model class's constructor is recorded,
and a refused directory never reaches it (or only on the ``meta`` device, which allocates
nothing); "no data read" by recording ``load_file``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import tempfile
from pathlib import Path
from unittest import mock

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from properties import examples
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import nn

import addnorm
from addnorm import DiT, Transformer, TransformerLM
from addnorm.dit.config import DiTConfig
from addnorm.pretrained.mixin import (
    CONFIG_FILE,
    MAX_COMPUTED_NUMBERS,
    WEIGHTS_FILE,
    PretrainedMixin,
)
from addnorm.transformer.encoder_model import EncoderConfig, EncoderModel
from addnorm.utils.files import (
    MAX_JSON_BYTES,
    MAX_JSON_DEPTH,
    CheckpointError,
    UnsafeFileError,
    read_safetensors_header,
)
from addnorm.utils.memory import MAX_LAYERS

LM_CFG = dataclasses.replace(addnorm.PRESETS["lm-tiny"], n_layers=1)
ENCODER_CFG = EncoderConfig(vocab_size=64, d_model=16, n_heads=2, n_layers=1, d_ff=32, max_len=16)
SEQ2SEQ_CFG = dataclasses.replace(addnorm.PRESETS["tiny"], n_encoder_layers=1,
                                  n_decoder_layers=1, share_embeddings=False)
DIT_CFG = DiTConfig(input_size=8, patch_size=4, in_channels=1, d_model=16, n_heads=2,
                    n_layers=1, n_classes=4)
# tests/properties.py: bounded and derandomized by default; each example copies two small
# files, so a property costs well under a second per 10 examples.
BOUNDED = examples(25)


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> dict[str, Path]:
    """One save_pretrained directory per family, written once, copied per example."""
    root = tmp_path_factory.mktemp("saved")
    torch.manual_seed(0)
    for name, model in [("lm", TransformerLM(LM_CFG)), ("encoder", EncoderModel(ENCODER_CFG)),
                        ("dit", DiT(DIT_CFG)), ("seq2seq", Transformer(SEQ2SEQ_CFG))]:
        model.save_pretrained(root / name)
    return {name: root / name for name in CLASSES}


@contextlib.contextmanager
def _copy(source: Path):
    """A fresh copy of a pretrained directory, removed afterwards."""
    with tempfile.TemporaryDirectory() as tmp:
        target = Path(tmp) / "model"
        shutil.copytree(source, target)
        yield target


def _config(directory: Path) -> dict:
    return json.loads((directory / CONFIG_FILE).read_text())


def _write_config(directory: Path, data: object) -> None:
    (directory / CONFIG_FILE).write_text(json.dumps(data))


@contextlib.contextmanager
def _recorded(cls: type):
    """The devices ``cls`` was built on while the block ran, and whether ``load_file`` (the
    weights' data) was called."""
    record: dict[str, list] = {"builds": [], "reads": []}
    init = cls.__init__

    def recording_init(self, *args, **kwargs):
        record["builds"].append(torch.get_default_device().type)
        init(self, *args, **kwargs)

    def recording_load(*args, **kwargs):
        record["reads"].append(args)
        return load_file(*args, **kwargs)

    with mock.patch.object(cls, "__init__", recording_init), \
            mock.patch("addnorm.pretrained.files.load_file", recording_load):
        yield record


def _refused_before_building(cls: type, directory: Path, match: str) -> str:
    """The CheckpointError of loading ``directory``, after checking that no ``cls`` was
    allocated (built off the meta device) and no weight data read; returns its message."""
    with _recorded(cls) as record, pytest.raises(CheckpointError, match=match) as info:
        cls.from_pretrained(directory)
    assert all(device == "meta" for device in record["builds"]), record["builds"]
    assert record["reads"] == []
    return str(info.value)


# ---- config.json: sizes ---------------------------------------------------------------------

SIZE_FIELDS = {"lm": ["vocab_size", "d_model", "d_ff", "n_layers", "max_len"],
               "encoder": ["vocab_size", "d_model", "d_ff", "n_layers", "n_token_types",
                           "max_len"],
               "dit": ["d_model", "n_layers", "n_classes", "in_channels", "input_size"],
               "seq2seq": ["src_vocab_size", "tgt_vocab_size", "d_model", "d_ff",
                           "n_encoder_layers", "n_decoder_layers", "max_len"]}
CLASSES = {"lm": TransformerLM, "encoder": EncoderModel, "dit": DiT, "seq2seq": Transformer}


@BOUNDED
@given(data=st.data(), family=st.sampled_from(sorted(SIZE_FIELDS)),
       value=st.integers(10**7, 10**30))
def test_a_size_field_edited_to_a_huge_value_is_refused_before_building(
    saved, data, family, value
):
    field = data.draw(st.sampled_from(SIZE_FIELDS[family]), label="field")
    with _copy(saved[family]) as directory:
        config = _config(directory)
        config["config"][field] = value
        _write_config(directory, config)
        message = _refused_before_building(CLASSES[family], directory, "config.json")
    # A valid config names the setting that makes it large; one the config class refuses
    # (a d_model no longer divisible by n_heads) names the field in its own words.
    assert field in message


@BOUNDED
@given(family=st.sampled_from(sorted(SIZE_FIELDS)), data=st.data())
def test_any_other_value_of_a_stored_size_field_is_refused(saved, family, data):
    field = data.draw(st.sampled_from([f for f in SIZE_FIELDS[family] if f != "max_len"]))
    with _copy(saved[family]) as directory:
        config = _config(directory)
        original = config["config"][field]
        config["config"][field] = data.draw(
            st.integers(-(10**30), 10**30).filter(lambda v: v != original), label="value"
        )
        _write_config(directory, config)
        with pytest.raises(CheckpointError, match="config.json|model.safetensors"):
            CLASSES[family].from_pretrained(directory)


def test_more_layers_than_the_limit_are_refused_by_name(saved):
    with _copy(saved["lm"]) as directory:
        config = _config(directory)
        config["config"]["n_layers"] = MAX_LAYERS + 1
        _write_config(directory, config)
        message = _refused_before_building(TransformerLM, directory, "n_layers")
    assert str(MAX_LAYERS) in message


def test_position_tables_beyond_the_bound_are_refused_naming_max_len(saved):
    # sinusoidal LM: max_len rows of d_model numbers, computed when built, not stored.
    rows = MAX_COMPUTED_NUMBERS // LM_CFG.d_model + 1
    with _copy(saved["lm"]) as directory:
        config = _config(directory)
        config["config"]["max_len"] = rows
        _write_config(directory, config)
        _refused_before_building(TransformerLM, directory, r"compute tables .*max_len")


def test_a_model_larger_than_the_memory_available_is_refused(saved):
    for family in ("lm", "encoder"):  # the configs' count_parameters / count_buffers
        with mock.patch("addnorm.pretrained.files.available_memory", return_value=1000), \
                pytest.raises(CheckpointError, match="memory available"):
            CLASSES[family].from_pretrained(saved[family])


@dataclasses.dataclass(frozen=True)
class WideConfig:
    """A family's config that does not count its model's size (no ``count_parameters``)."""

    width: int = 4

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> WideConfig:
        return cls(**data)


class Wide(PretrainedMixin, nn.Module):
    config_class = WideConfig

    def __init__(self, cfg: WideConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.linear = nn.Linear(cfg.width, cfg.width)


def test_a_family_that_does_not_count_its_size_is_measured_on_the_meta_device(tmp_path):
    directory = _save_wide(tmp_path / "wide")
    config = _config(directory)
    config["config"]["width"] = 10**6  # 10**12 weights, more than the file's 20: refused
    _write_config(directory, config)
    message = _refused_before_building(Wide, directory, "config.json")
    assert "the setting that makes it large: width (1000000)" in message
    # 20 float32 numbers are 80 bytes, more than a machine of 79
    with mock.patch("addnorm.pretrained.files.available_memory", return_value=79), \
            pytest.raises(CheckpointError, match="memory available"):
        Wide.from_pretrained(_save_wide(tmp_path / "small"))
    with mock.patch("addnorm.pretrained.files.available_memory", return_value=80):
        assert isinstance(Wide.from_pretrained(tmp_path / "small"), Wide)


def _save_wide(path: Path) -> Path:
    Wide(WideConfig()).save_pretrained(path)
    return path


def test_a_smaller_table_of_computed_positions_still_loads(saved):
    # max_len only sizes the sinusoid cache (positions past it are computed per call): an
    # edit within the bound is a valid model with the same weights.
    with _copy(saved["lm"]) as directory:
        config = _config(directory)
        config["config"]["max_len"] = 7
        _write_config(directory, config)
        model = TransformerLM.from_pretrained(directory)
    assert model.cfg.max_len == 7


# ---- config.json: types, keys, structure ----------------------------------------------------

_JSON_SCALARS = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5)
_JSON = st.recursive(
    _JSON_SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner,
                                                                max_size=3),
    max_leaves=8,
)
_WRONG = {  # JSON values of the wrong type for each kind (None is valid for some fields)
    "int": st.floats() | st.text(max_size=5) | st.booleans() | st.lists(_JSON, max_size=2)
    | st.dictionaries(st.text(max_size=3), _JSON, max_size=2),
    "float": st.text(max_size=5) | st.booleans() | st.lists(_JSON, max_size=2) | st.none(),
    "str": st.integers() | st.floats() | st.booleans() | st.lists(_JSON, max_size=2)
    | st.none(),
    "bool": st.integers() | st.floats() | st.text(max_size=5) | st.lists(_JSON, max_size=2),
}


def _kind(value: object) -> str | None:
    """The JSON type of a saved field's value (None: a null, whose type is not known)."""
    for kind, types in [("bool", bool), ("int", int), ("float", float), ("str", str)]:
        if isinstance(value, types):
            return kind
    return None


@examples(40)
@given(data=st.data(), family=st.sampled_from(sorted(CLASSES)))
def test_a_field_of_the_wrong_type_is_refused_naming_it(saved, data, family):
    cls = CLASSES[family]
    with _copy(saved[family]) as directory:
        config = _config(directory)
        fields = sorted(k for k, v in config["config"].items() if _kind(v) is not None)
        field = data.draw(st.sampled_from(fields), label="field")
        config["config"][field] = data.draw(_WRONG[_kind(config["config"][field])], label="value")
        _write_config(directory, config)
        message = _refused_before_building(cls, directory, f"bad {cls.__name__} config")
    assert field in message


@BOUNDED
@given(key=st.text(min_size=1, max_size=8), value=_JSON)
def test_an_unknown_config_key_is_refused_naming_it(saved, key, value):
    with _copy(saved["lm"]) as directory:
        config = _config(directory)
        if key in config["config"] or key == "positions":  # a known (or legacy) field
            return
        config["config"][key] = value
        _write_config(directory, config)
        message = _refused_before_building(TransformerLM, directory, "unknown LMConfig keys")
    assert repr(key) in message


@BOUNDED
@given(value=_JSON.filter(lambda v: not isinstance(v, dict)))
def test_a_config_json_that_is_not_an_object_is_refused(saved, value):
    with _copy(saved["lm"]) as directory:
        _write_config(directory, value)
        _refused_before_building(TransformerLM, directory, "must hold a JSON object")


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 100_000])
def test_json_nested_deeper_than_the_limit_is_refused(saved, depth):
    with _copy(saved["lm"]) as directory:
        (directory / CONFIG_FILE).write_text('{"config": ' + "[" * depth + "]" * depth + "}")
        _refused_before_building(TransformerLM, directory, f"nested deeper than {MAX_JSON_DEPTH}")


def test_nesting_within_the_limit_is_a_wrong_type_named_as_such(saved):
    with _copy(saved["lm"]) as directory:
        config = _config(directory)
        nested: object = 64
        for _ in range(MAX_JSON_DEPTH - 3):
            nested = [nested]
        config["config"]["d_model"] = nested
        _write_config(directory, config)
        _refused_before_building(TransformerLM, directory, "d_model must be an int")


def test_a_config_json_over_the_size_limit_is_refused_unread(saved):
    with _copy(saved["lm"]) as directory:
        with open(directory / CONFIG_FILE, "r+b") as f:  # sparse: no disk or time spent
            f.truncate(MAX_JSON_BYTES + 1)
        with mock.patch("addnorm.pretrained.files.parse_json") as parse:
            _refused_before_building(TransformerLM, directory, f"more than the {MAX_JSON_BYTES}")
        parse.assert_not_called()


# ---- model.safetensors: names, shapes, dtypes -----------------------------------------------

def _edit_weights(directory: Path, edit) -> None:
    tensors = load_file(directory / WEIGHTS_FILE)
    edit(tensors)
    save_file(tensors, directory / WEIGHTS_FILE)


FLOAT_KEYS = sorted(k for k, v in TransformerLM(LM_CFG).state_dict().items()
                    if v.is_floating_point())


@BOUNDED
@given(key=st.sampled_from(FLOAT_KEYS),
       dtype=st.sampled_from([torch.int64, torch.int32, torch.int8, torch.uint8, torch.bool]))
def test_an_integer_or_bool_tensor_for_a_float_parameter_is_refused_unread(saved, key, dtype):
    with _copy(saved["lm"]) as directory:
        try:
            _edit_weights(directory, lambda t: t.__setitem__(key, t[key].to(dtype)))
        except KeyError:  # a tied alias, stored under its first name only
            return
        message = _refused_before_building_data(directory, "dtypes that cannot load")
    assert f"{key}: saved {dtype}, model torch.float32" in message


def _refused_before_building_data(directory: Path, match: str) -> str:
    """The CheckpointError of a weights file that does not fit the model: the (small) model
    is built from its valid config, but no weight data is read."""
    with _recorded(TransformerLM) as record, pytest.raises(CheckpointError, match=match) as info:
        TransformerLM.from_pretrained(directory)
    assert record["reads"] == []
    return str(info.value)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_a_float_file_of_another_width_loads_as_documented(saved, dtype):
    # from_pretrained(dtype=None) keeps the saved floating dtype: the loaded tensors are the
    # saved ones exactly (a cast to float32 and back to the saved dtype is exact).
    with _copy(saved["lm"]) as directory:
        _edit_weights(directory, lambda t: t.update({k: v.to(dtype) for k, v in t.items()}))
        model = TransformerLM.from_pretrained(directory)
        stored = load_file(directory / WEIGHTS_FILE)
    for key, value in stored.items():
        assert torch.equal(model.state_dict()[key], value), key


@BOUNDED
@given(key=st.sampled_from(FLOAT_KEYS), extra=st.integers(1, 3))
def test_a_tensor_of_the_wrong_shape_is_named_unread(saved, key, extra):
    with _copy(saved["lm"]) as directory:
        try:
            _edit_weights(directory, lambda t: t.__setitem__(
                key, torch.zeros(t[key].shape[0] + extra, *t[key].shape[1:])))
        except KeyError:
            return
        _refused_before_building_data(directory, rf"mismatched shapes .*{key}: saved")


@BOUNDED
@given(drop=st.sets(st.sampled_from(FLOAT_KEYS), max_size=3),
       add=st.sets(st.text("abcdefgh.", min_size=1, max_size=8), max_size=3))
def test_missing_and_extra_tensors_are_named_unread(saved, drop, add):
    with _copy(saved["lm"]) as directory:
        stored = set(load_file(directory / WEIGHTS_FILE))
        drop, add = drop & stored, add - stored
        if not drop and not add:
            return

        def edit(tensors):
            for key in drop:
                del tensors[key]
            tensors.update({key: torch.zeros(2) for key in add})

        _edit_weights(directory, edit)
        message = _refused_before_building_data(directory, "does not fit the TransformerLM")
    for key in drop | add:
        assert repr(key) in message


@BOUNDED
@given(fraction=st.floats(0.0, 1.0, exclude_max=True))
def test_a_truncated_weights_file_is_refused_by_its_header(saved, fraction):
    # The header's data offsets must tile the rest of the file exactly (the format's rule),
    # so no proper prefix of a safetensors file is one.
    with _copy(saved["lm"]) as directory:
        path = directory / WEIGHTS_FILE
        with open(path, "r+b") as f:
            f.truncate(int(fraction * path.stat().st_size))
        _refused_before_building(TransformerLM, directory, "cannot read .*model.safetensors")


def _header_file(path: Path, header: object, data: bytes = b"", length: int | None = None):
    raw = json.dumps(header).encode() if not isinstance(header, bytes) else header
    size = len(raw) if length is None else length
    path.write_bytes(size.to_bytes(8, "little") + raw + data)


@pytest.mark.parametrize(
    ("header", "data", "length", "match"),
    [
        ({}, b"", 2**60, "header too large"),
        (b"\xff\xfe", b"", None, "invalid UTF-8 in header"),
        (b"[" * 100_000 + b"]" * 100_000, b"", None, "invalid JSON in header"),
        ([1, 2], b"", None, "invalid type: sequence"),
        ({"w": {"dtype": "F32", "shape": [10**12], "data_offsets": [0, 4]}}, b"\0" * 4, None,
         "invalid shape, data type, or offset for tensor"),
        ({"w": {"dtype": "Q7", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4, None,
         "unknown variant `Q7`"),
        ({"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}, b"\0" * 4, None,
         "invalid value: integer `-1`"),
        ({"w": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, b"\0" * 8, None,
         "invalid offset for tensor `w`"),
        ({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 8, None,
         "file not fully covered"),
        ({"__metadata__": {"a": 1}}, b"", None, "invalid type: integer `1`, expected a string"),
        # A dtype of the format that torch has no type for: safetensors opens it, addnorm not.
        ({"w": {"dtype": "F4", "shape": [2], "data_offsets": [0, 1]}}, b"\0", None,
         "tensor 'w' has the dtype F4, which torch cannot hold"),
    ],
)
def test_a_forged_safetensors_header_is_refused_naming_the_problem(
    saved, header, data, length, match
):
    with _copy(saved["lm"]) as directory:
        _header_file(directory / WEIGHTS_FILE, header, data, length)
        _refused_before_building(TransformerLM, directory, f"model.safetensors: .*{match}")


@pytest.mark.parametrize("family", ["lm", "encoder", "dit"])
def test_the_header_reader_agrees_with_safetensors(saved, family):
    path = saved[family] / WEIGHTS_FILE
    found = read_safetensors_header(path)
    with safe_open(path, framework="pt") as f:
        reference = {k: (f.get_slice(k).get_shape(), f.get_tensor(k).dtype) for k in f.keys()}  # noqa: SIM118
    assert {k: (list(v.shape), v.dtype) for k, v in found.items()} == reference


# ---- files that are not regular files -------------------------------------------------------

@contextlib.contextmanager
def _fails_within(seconds: int):
    """Turn a hang (a FIFO opened for reading blocks until a writer comes) into a failure."""
    def hung(signum, frame):
        raise AssertionError(f"still running after {seconds} s: a FIFO or device was opened")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _make_directory(path: Path) -> None:
    path.mkdir()


def _make_fifo(path: Path) -> None:
    os.mkfifo(path)


def _link_to_dev_zero(path: Path) -> None:
    path.symlink_to("/dev/zero")


def _link_to_a_directory(path: Path) -> None:
    path.symlink_to(path.parent)


def _dangling_link(path: Path) -> None:
    path.symlink_to(path.parent / "nothing-here")


KINDS = [
    (_make_directory, "a directory"),
    (_make_fifo, "a FIFO"),
    (_link_to_dev_zero, "a character device .a symlink to /dev/zero"),
    (_link_to_a_directory, "a directory .a symlink"),
    (_dangling_link, "a symlink to .*nothing-here, which does not exist"),
]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="POSIX file kinds")
@pytest.mark.parametrize("name", [CONFIG_FILE, WEIGHTS_FILE])
@pytest.mark.parametrize(("make", "words"), KINDS, ids=[k[0].__name__ for k in KINDS])
@pytest.mark.parametrize("entry", ["from_pretrained", "load"])
def test_a_file_that_is_not_a_regular_file_is_refused_unopened(saved, name, make, words, entry):
    with _copy(saved["lm"]) as directory:
        (directory / name).unlink()
        make(directory / name)
        loader = TransformerLM.from_pretrained if entry == "from_pretrained" else addnorm.load
        with _fails_within(5), _recorded(TransformerLM) as record, \
                pytest.raises(CheckpointError, match=f"{name}: .*{words}"):
            loader(directory)
    assert record["builds"] == [] and record["reads"] == []


def test_a_symlink_to_a_regular_file_loads(saved, tmp_path):
    directory = tmp_path / "linked"
    directory.mkdir()
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        (directory / name).symlink_to(saved["lm"] / name)
    loaded = TransformerLM.from_pretrained(directory)
    for key, value in TransformerLM.from_pretrained(saved["lm"]).state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key


def test_safe_files_refuses_a_fifo_without_opening_it(tmp_path):
    os.mkfifo(tmp_path / "pipe")
    with _fails_within(5), pytest.raises(UnsafeFileError, match="a FIFO"):
        read_safetensors_header(tmp_path / "pipe")


def test_a_config_json_that_is_not_utf8_is_refused(saved):
    with _copy(saved["lm"]) as directory:
        (directory / CONFIG_FILE).write_bytes(b'{"addnorm_class": "\xff"}')
        _refused_before_building(TransformerLM, directory, "config.json: not UTF-8 text")
