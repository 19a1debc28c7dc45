"""A folder that diffusers' ``save_pretrained`` wrote for a ``DiTTransformer2DModel``, as a DiT.

``config.json`` (its ``_class_name`` names the class) and
``diffusion_pytorch_model.safetensors`` (or the shards that
``diffusion_pytorch_model.safetensors.index.json`` lists), read without diffusers: the config
becomes a :class:`~addnorm.dit.config.DiTConfig` and the tensors go where
:func:`~addnorm.interop.diffusers.from_diffusers` puts a model object's (the same rules,
:func:`~addnorm.interop.diffusers.diffusers_rules`), so a folder and the model it was saved
from give the same DiT. ``addnorm.load`` calls :func:`from_diffusers_folder` for such a folder.

The folder is read as a transformers folder is (:mod:`addnorm.interop.hf_folder`), without
trusting it: regular files of bounded size, JSON of bounded depth, the safetensors headers
checked; the model's size estimated from the config and refused before anything is
allocated; every tensor's name and shape checked against the config before any data is read.
A failure is a :class:`~addnorm.utils.files.CheckpointError` naming the file and the diffusers
field (``num_layers``, not ``n_layers``) or tensor. A pipeline folder (``model_index.json``)
is refused with the path of its ``transformer`` folder, the DiT in it.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from addnorm.dit.config import DiTConfig
from addnorm.dit.model import DiT
from addnorm.interop.diffusers import diffusers_conditioning, diffusers_rules, dit_config
from addnorm.interop.hf_folder import read_folder_headers
from addnorm.interop.hf_layout import infos_in, rules_in
from addnorm.pretrained.files import (
    CONFIG_FILE,
    check_fits,
    check_size,
    load_state,
    read_config_json,
    read_weights,
)
from addnorm.pretrained.mixin import check_device, check_dtype, check_path, for_inference
from addnorm.utils.files import CheckpointError, TensorInfo

__all__ = [
    "DIFFUSERS_CLASSES",
    "DIFFUSERS_WEIGHTS",
    "PIPELINE_INDEX",
    "diffusers_class_of",
    "from_diffusers_folder",
    "is_diffusers_config",
]

DIFFUSERS_WEIGHTS = "diffusion_pytorch_model.safetensors"
_SHARD_INDEX = f"{DIFFUSERS_WEIGHTS}.index.json"
_OTHER_WEIGHTS = ("diffusion_pytorch_model.bin", "diffusion_pytorch_model.bin.index.json")
PIPELINE_INDEX = "model_index.json"  # a pipeline's folder: one subfolder per component
# The _class_name values of config.json that addnorm reads, and what they become.
DIFFUSERS_CLASSES: dict[str, type[DiT]] = {"DiTTransformer2DModel": DiT}
# DiTConfig fields as diffusers' config.json spells them, for messages.
_NAMES = {
    "input_size": "sample_size", "n_layers": "num_layers", "n_heads": "num_attention_heads",
    "d_model": "num_attention_heads * attention_head_dim", "n_classes": "num_embeds_ada_norm",
    "ff_norm_eps": "norm_eps",
}
_TIMESTEP_W1 = "transformer_blocks.0.norm1.emb.timestep_embedder.linear_1.weight"  # (D, F_t)
_FF_W2 = "transformer_blocks.0.ff.net.2.weight"  # (D, F)
_COMPUTED = ("pos_embed.pos_embed",)  # the 2-D position code, saved by some versions


def is_diffusers_config(config: Mapping[str, Any]) -> bool:
    """Whether a ``config.json`` was written by diffusers (it names ``_class_name``)."""
    return "_class_name" in config and "addnorm_class" not in config


def diffusers_class_of(config: Mapping[str, Any], where: Path) -> type[DiT]:
    """The addnorm class that a diffusers folder whose ``config.json`` (at ``where``) holds
    ``config`` converts to; CheckpointError for a ``_class_name`` addnorm does not read."""
    name = config.get("_class_name")
    if not isinstance(name, str) or name not in DIFFUSERS_CLASSES:
        shown = repr(name) if len(repr(name)) <= 60 else repr(name)[:57] + "..."
        raise CheckpointError(
            f"{where}: diffusers class {shown} is not supported; supported: "
            f"{', '.join(DIFFUSERS_CLASSES)} (as addnorm's DiT)"
        )
    return DIFFUSERS_CLASSES[name]


def from_diffusers_folder(
    path: str | os.PathLike,
    *,
    dtype: torch.dtype | str | None = None,
    device: torch.device | str | None = None,
) -> DiT:
    """The DiT in a folder of diffusers' ``save_pretrained`` (a ``DiTTransformer2DModel``), in
    eval mode: what :func:`~addnorm.interop.diffusers.from_diffusers` makes of the model the
    folder was saved from (the shared layout when every block's embedders are equal, the
    per-block one otherwise), without diffusers. The weights are
    ``diffusion_pytorch_model.safetensors`` or its shards; pickled weights are refused.
    ``dtype`` and ``device`` as in
    :meth:`~addnorm.pretrained.mixin.PretrainedMixin.from_pretrained` (default: the saved
    dtype).

    Raises:
        CheckpointError: a file is missing or damaged, ``_class_name`` is not one addnorm
            reads, the config cannot be converted or describes a model larger than its
            weights or than memory (naming the field), or the tensors do not fit it (named);
            all before the model is built or its data read.
    """
    directory = check_path(path)
    dtype, device = check_dtype(dtype), check_device(device)
    if not os.path.lexists(directory / CONFIG_FILE) and (directory / PIPELINE_INDEX).is_file():
        raise CheckpointError(
            f"{directory} is a diffusers pipeline ({PIPELINE_INDEX}): load the DiT in it, "
            f"{directory / 'transformer'}"
        )
    config = read_config_json(directory)
    where = directory / CONFIG_FILE
    diffusers_class_of(config, where)
    files, saved = read_folder_headers(
        directory, weights=DIFFUSERS_WEIGHTS, index=_SHARD_INDEX, other_formats=_OTHER_WEIGHTS
    )
    named = next(iter(files)) if len(files) == 1 else directory / _SHARD_INDEX
    cfg = _per_block_config(config, saved, where, named)
    check_size(DiT, cfg, saved, directory, names=_NAMES)  # nothing allocated yet
    rules = diffusers_rules(cfg)
    try:
        expected = infos_in(saved, rules)
    except ValueError as err:
        raise CheckpointError(f"{named} does not fit the DiT of {where}: {err}") from None
    used = {source for _, sources, _ in rules for source in sources}
    unexpected = sorted(set(saved) - used - set(_COMPUTED))
    if unexpected:
        raise CheckpointError(
            f"{named} holds tensors a DiTTransformer2DModel of {where} has no place for: "
            f"{unexpected[:20]}"
        )
    with torch.device("meta"):  # names, shapes and dtypes only: nothing allocated
        shapes = DiT(cfg)
    expected["pos_embed"] = TensorInfo(shapes.pos_embed.dtype, tuple(shapes.pos_embed.shape))
    check_fits(shapes, expected, named)  # before any data is read
    tensors: dict[str, torch.Tensor] = {}
    for file, header in files.items():
        tensors.update(read_weights(file, header))
    cfg = dataclasses.replace(cfg, conditioning=diffusers_conditioning(tensors, cfg.n_layers))
    model = DiT(cfg)
    state = rules_in(tensors, diffusers_rules(cfg))
    state["pos_embed"] = model.pos_embed  # computed, not saved: the model's own
    load_state(model, state)
    floating = {t.dtype for t in tensors.values() if t.is_floating_point()}
    saved_dtype = floating.pop() if len(floating) == 1 else None
    loaded: DiT = for_inference(model, dtype=dtype or saved_dtype, device=device)
    return loaded


def _per_block_config(
    config: Mapping[str, Any], saved: Mapping[str, TensorInfo], where: Path, named: Path
) -> DiTConfig:
    """The folder's DiTConfig in the per-block layout (one embedder pair per block, as the
    file stores them: the size to check), its widths read off block 0's tensors."""
    widths = {}
    for key in (_TIMESTEP_W1, _FF_W2):
        info = saved.get(key)
        if info is None or len(info.shape) != 2:
            found = "is missing" if info is None else f"has shape {info.shape}"
            raise CheckpointError(f"{named}: {key} {found}, a (D, width) matrix in a DiT")
        widths[key] = info.shape[1]
    try:
        return dit_config(
            config, d_ff=widths[_FF_W2], d_freq=widths[_TIMESTEP_W1], conditioning="per_block"
        )
    except (TypeError, ValueError) as err:
        spelled = [f"{ours} is config.json's {theirs}" for ours, theirs in _NAMES.items()
                   if re.search(rf"\b{ours}\b", str(err))]
        extra = f" ({'; '.join(spelled)})" if spelled else ""
        raise CheckpointError(f"{where}: {err}{extra}") from None
