"""A folder that Hugging Face transformers' ``save_pretrained`` wrote, as an addnorm model.

``config.json`` and ``model.safetensors`` (or the shards a ``model.safetensors.index.json``
lists), read without transformers: ``config.json``'s ``model_type`` says which model it is
("bert": ``BertModel``, ``BertFor...`` checkpoints, whose heads are left out, the MiniLM /
sentence-transformers layout; "gpt2": ``GPT2LMHeadModel``, ``GPT2Model``), and
:mod:`addnorm.interop.hf_layout` where each field and tensor goes.
``addnorm.load`` calls :func:`from_transformers_folder` for such a folder.

The folder is read as addnorm's own pretrained folders are, without trusting it, through the
checked steps of :mod:`addnorm.pretrained.mixin`: regular files of bounded size, JSON of bounded
depth, the safetensors headers checked; the model's size estimated from the config and
refused before anything is allocated; every tensor's name, shape and dtype checked (through
the conversion's rules, on the headers) before any data is read. A failure is a
:class:`~addnorm.utils.files.CheckpointError` naming the file and the Hugging Face field
(``hidden_size``, not ``d_model``) or tensor.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import torch
from torch import nn

from addnorm.interop.hf_layout import (
    BERT_DEFAULTS,
    BERT_NAMES,
    GPT2_DEFAULTS,
    GPT2_NAMES,
    Rule,
    bert_config,
    bert_rules,
    gpt2_config,
    gpt2_rules,
    infos_in,
    rules_in,
)
from addnorm.pretrained.files import (
    CONFIG_FILE,
    WEIGHTS_FILE,
    check_fits,
    check_size,
    load_state,
    read_config_json,
    read_weights,
    read_weights_header,
)
from addnorm.pretrained.mixin import check_device, check_dtype, check_path, for_inference
from addnorm.transformer.config import LMConfig
from addnorm.transformer.encoder_model import EncoderConfig, EncoderModel
from addnorm.transformer.lm import TransformerLM
from addnorm.utils.files import (
    MAX_JSON_BYTES,
    CheckpointError,
    TensorInfo,
    UnsafeFileError,
    parse_json,
    read_text,
)

__all__ = [
    "MODEL_TYPES",
    "SHARD_INDEX",
    "from_transformers_folder",
    "load_bert",
    "transformers_class_of",
]

# The model_type values of config.json that addnorm reads, and what they cover.
MODEL_TYPES = {
    "bert": "BertModel (BertFor... checkpoints with their heads left out; MiniLM, "
            "sentence-transformers)",
    "gpt2": "GPT2LMHeadModel, GPT2Model",
}
SHARD_INDEX = "model.safetensors.index.json"
# Weights in formats addnorm does not read (pickles run code when loaded).
_OTHER_WEIGHTS = ("pytorch_model.bin", "pytorch_model.bin.index.json", "tf_model.h5",
                  "flax_model.msgpack")



def from_transformers_folder(
    path: str | os.PathLike,
    *,
    dtype: torch.dtype | str | None = None,
    device: torch.device | str | None = None,
) -> EncoderModel | TransformerLM:
    """The model in a folder of Hugging Face transformers' ``save_pretrained``, in eval mode.

    ``model_type`` "bert" -> :class:`EncoderModel` (a pooler when the weights have one);
    "gpt2" -> :class:`TransformerLM` (its head tied to the token table unless ``config.json``
    sets ``tie_word_embeddings`` false and the weights hold ``lm_head.weight``; its special
    ids come from ``config.json``, not ``generation_config.json``). The weights
    are ``model.safetensors`` or the shards of ``model.safetensors.index.json``; pickled
    weights (``pytorch_model.bin``) are refused. Tensors the model has no place for (a
    ``BertFor...`` head, GPT-2's old ``attn.bias`` masks) are left out, as transformers'
    ``BertModel.from_pretrained`` leaves them. ``dtype`` and ``device`` as in
    :meth:`~addnorm.pretrained.mixin.PretrainedMixin.from_pretrained` (default: the saved dtype).

    Raises:
        CheckpointError: a file is missing or damaged, ``model_type`` is not one of
            :data:`MODEL_TYPES` (naming it and those), the config cannot be converted or
            describes a model larger than its weights or than memory (naming the field), or
            the tensors do not fit it; all before the model is built or its data read.
    """
    return _load_folder(check_path(path), dtype=check_dtype(dtype), device=check_device(device))


def load_bert(directory: str | os.PathLike, *, unpad: bool = False) -> EncoderModel:
    """A BERT checkpoint directory as an :class:`EncoderModel` in eval mode, float32, CPU.

    :func:`from_transformers_folder` for ``model_type`` "bert" only (keys as in
    ``BertModel``, or under ``bert.``); ``unpad=True`` builds it with
    :attr:`EncoderConfig.unpad` (faster on padded batches; the hidden states are then zero at
    padding). Raises :class:`~addnorm.utils.files.CheckpointError` as that function does.
    """
    model = _load_folder(check_path(directory), dtype=torch.float32, device=None, unpad=unpad,
                         kinds=("bert",))
    return cast(EncoderModel, model)  # the one kind allowed


def transformers_class_of(config: Mapping[str, Any], where: Path) -> type[nn.Module]:
    """The addnorm class that a transformers folder whose ``config.json`` (at ``where``)
    holds ``config`` converts to; CheckpointError for a ``model_type`` addnorm does not read."""
    return _CLASSES[_model_type(config, where, tuple(MODEL_TYPES))]


_CLASSES: dict[str, type[nn.Module]] = {"bert": EncoderModel, "gpt2": TransformerLM}


def _model_type(config: Mapping[str, Any], where: Path, kinds: tuple[str, ...]) -> str:
    kind = config.get("model_type")
    if "addnorm_class" in config:
        raise CheckpointError(
            f"{where} is a folder of addnorm's save_pretrained, not of transformers: load it "
            "with addnorm.load(path)"
        )
    if kind not in kinds:
        supported = "; ".join(f"{k!r}: {MODEL_TYPES[k]}" for k in kinds)
        raise CheckpointError(
            f"{where}: model_type {_short(kind)} is not supported; supported: {supported}"
        )
    return str(kind)


def _short(value: object, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclasses.dataclass(frozen=True)
class _Plan:
    """What a folder converts to: the class, its config, and the weights by name (built
    once the config's layer count is known to be bounded)."""

    target: type[nn.Module]
    cfg: EncoderConfig | LMConfig
    names: dict[str, str]  # our config fields as config.json spells them
    rules: Callable[[], list[Rule]]


def _load_folder(
    directory: Path,
    *,
    dtype: torch.dtype | None,
    device: torch.device | None,
    unpad: bool = False,
    kinds: tuple[str, ...] = tuple(MODEL_TYPES),
) -> EncoderModel | TransformerLM:
    """:func:`from_transformers_folder` on checked arguments: the config, then the headers,
    the size, the tensors' names and shapes, and only then the model and its data."""
    config = read_config_json(directory)
    where = directory / CONFIG_FILE
    kind = _model_type(config, where, kinds)
    files, saved = read_folder_headers(directory)
    try:
        plan = _bert_plan(config, saved, unpad) if kind == "bert" else _gpt2_plan(config, saved)
    except (TypeError, ValueError) as err:
        names = BERT_NAMES if kind == "bert" else GPT2_NAMES
        raise CheckpointError(f"{where}: {err}{_spelled(str(err), names)}") from None
    check_size(plan.target, plan.cfg, saved, directory, names=plan.names)  # nothing allocated
    rules: list[Rule] = plan.rules()
    named = next(iter(files)) if len(files) == 1 else directory / SHARD_INDEX
    try:
        expected = infos_in(saved, rules)
    except ValueError as err:
        raise CheckpointError(
            f"{named} does not fit the {kind} model of {where}: {err}"
        ) from None
    model = plan.target(plan.cfg)
    check_fits(model, expected, named)  # before any data is read
    tensors: dict[str, torch.Tensor] = {}
    for file, header in files.items():
        tensors.update(read_weights(file, header))
    saved_dtype = load_state(model, rules_in(tensors, rules))
    loaded: EncoderModel | TransformerLM = for_inference(
        model, dtype=dtype or saved_dtype, device=device
    )
    return loaded


def _spelled(message: str, names: dict[str, str]) -> str:
    """``" (d_model is config.json's hidden_size)"`` for the addnorm fields ``message`` names."""
    found = [f"{ours} is config.json's {theirs}" for ours, theirs in names.items()
             if ours != theirs and re.search(rf"\b{ours}\b", message)]
    return f" ({'; '.join(found)})" if found else ""


def _settings(config: Mapping[str, Any], defaults: dict[str, Any]) -> SimpleNamespace:
    """The fields a conversion reads, from ``config.json`` or the transformers defaults."""
    return SimpleNamespace(**{name: config.get(name, value) for name, value in defaults.items()})


def _bert_plan(config: Mapping[str, Any], saved: dict[str, TensorInfo], unpad: bool) -> _Plan:
    prefix = "bert." if "bert.embeddings.word_embeddings.weight" in saved else ""
    pooler = f"{prefix}pooler.dense.weight" in saved
    hf = _settings(config, BERT_DEFAULTS | {"is_decoder": False, "add_cross_attention": False})
    cfg = dataclasses.replace(bert_config(hf, pooler, "BERT"), unpad=unpad)
    return _Plan(EncoderModel, cfg, BERT_NAMES, lambda: bert_rules(cfg.n_layers, pooler, prefix))


def _gpt2_plan(config: Mapping[str, Any], saved: dict[str, TensorInfo]) -> _Plan:
    prefix = "transformer." if "transformer.wte.weight" in saved else ""
    tied = config.get("tie_word_embeddings", True) is not False or "lm_head.weight" not in saved
    hf = _settings(config, GPT2_DEFAULTS | {"add_cross_attention": False})
    cfg = gpt2_config(hf, tied, "GPT-2")

    def rules() -> list[Rule]:
        head = [] if tied else [("to_logits.weight", ("lm_head.weight",), "same")]
        return gpt2_rules(cfg.n_layers, prefix) + head

    return _Plan(TransformerLM, cfg, GPT2_NAMES, rules)


def read_folder_headers(
    directory: Path,
    *,
    weights: str = WEIGHTS_FILE,
    index: str = SHARD_INDEX,
    other_formats: tuple[str, ...] = _OTHER_WEIGHTS,
) -> tuple[dict[Path, dict[str, TensorInfo]], dict[str, TensorInfo]]:
    """``({file: its header}, every tensor of them)``: the folder's ``weights`` file
    (transformers' ``model.safetensors`` by default), or the shards that its ``index``
    names (plain file names in the folder, each tensor in one shard, as the index says). A
    folder with only ``other_formats`` (pickles) is refused, naming them."""
    single, index_path = directory / weights, directory / index
    if os.path.lexists(single) or not os.path.lexists(index_path):
        if not os.path.lexists(single):
            other = [name for name in other_formats if os.path.lexists(directory / name)]
            why = (f" (it has {other}, a format addnorm does not read: save the model with "
                   "safetensors, the default of transformers and diffusers)") if other else ""
            raise CheckpointError(f"weights missing: {single} or {index_path}{why}")
        header = read_weights_header(single)
        return {single: header}, header
    weight_map = _weight_map(index_path)
    files: dict[Path, dict[str, TensorInfo]] = {}
    merged: dict[str, TensorInfo] = {}
    for shard in sorted(set(weight_map.values())):
        header = read_weights_header(directory / shard)
        twice = sorted(set(header) & set(merged))
        if twice:
            raise CheckpointError(f"{index_path}: the tensors {twice[:20]} are in several shards")
        files[directory / shard] = header
        merged.update(header)
    astray = sorted(
        name for name, shard in weight_map.items() if name not in files[directory / shard]
    )
    if astray:
        raise CheckpointError(f"{index_path} names tensors their shards lack: {astray[:20]}")
    return files, merged


def _weight_map(index: Path) -> dict[str, str]:
    """The ``weight_map`` of a shard index: tensor name -> a file name in the same folder."""
    try:
        data = parse_json(read_text(index, max_bytes=MAX_JSON_BYTES, what="shard index"))
    except UnsafeFileError as err:
        raise CheckpointError(f"cannot read {err}") from None
    except json.JSONDecodeError as err:
        raise CheckpointError(f"{index} is not valid JSON: {err}") from None
    except ValueError as err:  # nested too deeply
        raise CheckpointError(f"{index} is refused: {err}") from None
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(f"{index} must hold a 'weight_map' object of tensor -> file")
    for name, shard in weight_map.items():
        if not isinstance(shard, str) or shard in ("", ".", "..") or shard != Path(shard).name \
                or "\\" in shard:
            raise CheckpointError(
                f"{index}: tensor {_short(name)} is in {_short(shard)}, which is not a file "
                "name in the folder"
            )
    return weight_map
