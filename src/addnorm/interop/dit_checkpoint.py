"""Conversion to and from the reference DiT's state dicts.

**facebookresearch/DiT** (``models.py``): the same network, so the conversion only renames
keys (:func:`from_dit_state_dict`, :func:`to_dit_state_dict`):

| DiT key                               | addnorm key                              |
|---------------------------------------|------------------------------------------|
| ``x_embedder.proj.*``                 | ``patch_embed.proj.*``                   |
| ``pos_embed`` (frozen Parameter)      | ``pos_embed`` (saved buffer)             |
| ``t_embedder.mlp.0.*`` / ``mlp.2.*``  | ``timestep_embed.w1.*`` / ``w2.*``       |
| ``y_embedder.embedding_table.weight`` | ``class_embed.table.weight``             |
| ``blocks.i.attn.qkv.*`` (timm)        | ``blocks.i.attn.in_proj.*`` (rows q,k,v) |
| ``blocks.i.attn.proj.*``              | ``blocks.i.attn.out_proj.*``             |
| ``blocks.i.mlp.fc1.*`` / ``fc2.*``    | ``blocks.i.ff.w1.*`` / ``w2.*``          |
| ``blocks.i.adaLN_modulation.1.*``     | the same                                 |
| ``final_layer.linear.*``,             | the same                                 |
| ``final_layer.adaLN_modulation.1.*``  |                                          |

timm's fused ``qkv`` is reshaped ``(B, N, 3, H, Dh)``, so its rows are ``[W_q; W_k; W_v]``,
each split into heads in order: the layout of ``MultiHeadAttention.in_proj``.

``check_keys_and_shapes`` and ``load_like`` are shared with :mod:`addnorm.interop.diffusers`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import torch

from addnorm.dit.config import DiTConfig
from addnorm.dit.model import DiT

__all__ = ["from_dit_state_dict", "to_dit_state_dict"]

# (addnorm pattern, DiT replacement); keys that match none are the same in both.
_DIT_RENAMES = [
    (r"^patch_embed\.proj\.", "x_embedder.proj."),
    (r"^timestep_embed\.w1\.", "t_embedder.mlp.0."),
    (r"^timestep_embed\.w2\.", "t_embedder.mlp.2."),
    (r"^class_embed\.table\.", "y_embedder.embedding_table."),
    (r"^blocks\.(\d+)\.attn\.in_proj\.", r"blocks.\1.attn.qkv."),
    (r"^blocks\.(\d+)\.attn\.out_proj\.", r"blocks.\1.attn.proj."),
    (r"^blocks\.(\d+)\.ff\.w1\.", r"blocks.\1.mlp.fc1."),
    (r"^blocks\.(\d+)\.ff\.w2\.", r"blocks.\1.mlp.fc2."),
]


def _dit_key(key: str) -> str:
    for pattern, replacement in _DIT_RENAMES:
        renamed, n = re.subn(pattern, replacement, key)
        if n:
            return renamed
    return key


def to_dit_state_dict(model: DiT) -> dict[str, torch.Tensor]:
    """``model``'s weights under the reference DiT's keys (tensors shared, not copied)."""
    if not isinstance(model, DiT):
        raise TypeError(f"model must be an addnorm DiT, got {type(model).__name__}")
    _check_shared_conditioning(model.cfg)
    return {_dit_key(k): v for k, v in model.state_dict().items()}


def _check_shared_conditioning(cfg: DiTConfig) -> None:
    if cfg.conditioning != "shared":
        raise ValueError(
            f"the reference DiT has one timestep MLP and label table for all blocks; a config "
            f"with conditioning={cfg.conditioning!r} has one per block (use diffusers' layout: "
            "to_diffusers / from_diffusers)"
        )


def from_dit_state_dict(state_dict: Mapping[str, torch.Tensor], cfg: DiTConfig) -> DiT:
    """A :class:`DiT` holding a reference DiT's weights (``DiT_models[name]().state_dict()``).

    ``cfg`` must describe the checkpoint (e.g. ``DIT_PRESETS["DiT-XL/2"]``; with
    ``class_dropout > 0`` the label table has the null row). The model takes the dtype and
    device of the checkpoint's weights and is returned in training mode, like a fresh one.
    Raises ValueError naming missing, unexpected or misshapen keys, and when ``pos_embed``
    is not DiT's fixed 2-D sin-cos code (a sign of another layout).
    """
    if not isinstance(cfg, DiTConfig):
        raise TypeError(f"cfg must be a DiTConfig, got {type(cfg).__name__}")
    if not isinstance(state_dict, Mapping):
        raise TypeError(f"state_dict must be a mapping, got {type(state_dict).__name__}")
    _check_shared_conditioning(cfg)
    model = DiT(cfg)
    ours = model.state_dict()
    renamed = {_dit_key(k): k for k in ours}
    check_keys_and_shapes(state_dict, {k: ours[v].shape for k, v in renamed.items()}, "DiT")
    converted = {renamed[k]: v for k, v in state_dict.items()}
    fixed = model.pos_embed.clone()
    load_like(model, converted, state_dict["x_embedder.proj.weight"])
    _check_positions(model.pos_embed, fixed)
    return model


def check_keys_and_shapes(
    given: Mapping[str, torch.Tensor], expected: Mapping[str, torch.Size], source: str
) -> None:
    missing = sorted(set(expected) - set(given))
    unexpected = sorted(set(given) - set(expected))
    if missing or unexpected:
        raise ValueError(
            f"{source} state dict does not fit the config: missing keys {missing}, "
            f"unexpected keys {unexpected}"
        )
    wrong = [
        f"{k}: {tuple(given[k].shape)}, expected {tuple(shape)}"
        for k, shape in expected.items()
        if tuple(given[k].shape) != tuple(shape)
    ]
    if wrong:
        raise ValueError(
            f"{source} state dict shapes do not fit the config ({'; '.join(wrong)}); the label "
            "table has n_classes + 1 rows when class_dropout > 0, else n_classes"
        )


def load_like(model: torch.nn.Module, state_dict: dict[str, torch.Tensor], like: torch.Tensor):
    """Move ``model`` to ``like``'s dtype and device, then copy ``state_dict`` into it."""
    model.to(device=like.device, dtype=like.dtype if like.is_floating_point() else None)
    model.load_state_dict(state_dict, strict=True)


def _check_positions(loaded: torch.Tensor, fixed: torch.Tensor) -> None:
    """The checkpoint's position table must be the fixed code (to the dtype's rounding)."""
    fixed = fixed.to(loaded.device, loaded.dtype)
    tolerance = max(1e-5, 8 * torch.finfo(loaded.dtype).eps)
    error = (loaded - fixed).abs().max().item()
    if error > tolerance:
        raise ValueError(
            f"pos_embed differs from DiT's fixed 2-D sin-cos code by up to {error:.3g} "
            f"(> {tolerance:.3g}): not a DiT-layout checkpoint (see addnorm.dit.positions "
            "for the layout: first half of the channels = column)"
        )
