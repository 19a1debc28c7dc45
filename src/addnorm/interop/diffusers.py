"""Conversion to and from diffusers' ``DiTTransformer2DModel``.

**diffusers** ``DiTTransformer2DModel`` (:func:`from_diffusers`, :func:`to_diffusers`)
differs from DiT, and the differences become :class:`DiTConfig` options:

- timestep features: ``[cos | sin]`` with exponent ``-ln(10000) k / (half - 1)``
  (``timestep_downscale_freq_shift=1``; DiT's is 0);
- the norm before the MLP has its config's ``norm_eps`` (1e-5 by default; ``ff_norm_eps``),
  the others 1e-6 as in DiT;
- separate ``to_q`` / ``to_k`` / ``to_v``; ``learn_sigma`` is ``out_channels == 2 *
  in_channels``; the label table always has the null row (its dropout is fixed at 0.1);
- every block holds its own timestep MLP and label table (``norm1.emb``) and computes the
  conditioning again; the final layer uses block 0's. The paper's converted checkpoints
  hold the same weights in every block: :func:`from_diffusers` makes them the shared
  layout (DiT's). A model whose blocks' embedders differ (built or fine-tuned in diffusers)
  becomes the per-block layout, ``conditioning="per_block"``: ``block_embeds.i`` holds
  block i's pair (:mod:`addnorm.dit.conditioning`). :func:`to_diffusers` copies the
  shared pair into every block, or each block's own. In training mode diffusers draws the
  label dropout again in every block and for the final layer; addnorm draws once per
  forward, for all of them;
- its positions are a non-persistent buffer (recomputed, the same 2-D code);
- it returns ``Transformer2DModelOutput(sample=...)`` (or a tuple), not a tensor.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from addnorm.dit.config import DiTConfig
from addnorm.dit.model import DiT
from addnorm.interop.dit_checkpoint import load_like

__all__ = ["from_diffusers", "to_diffusers"]

_EMB = "norm1.emb."  # a diffusers block's embedders (timestep MLP, label table)
_EMBEDDERS = {  # diffusers key inside a block's norm1.emb -> addnorm key (shared layout;
    # prefixed "block_embeds.i." in the per-block layout)
    "timestep_embedder.linear_1.weight": "timestep_embed.w1.weight",
    "timestep_embedder.linear_1.bias": "timestep_embed.w1.bias",
    "timestep_embedder.linear_2.weight": "timestep_embed.w2.weight",
    "timestep_embedder.linear_2.bias": "timestep_embed.w2.bias",
    "class_embedder.embedding_table.weight": "class_embed.table.weight",
}
_BLOCK = {  # diffusers key inside a block -> addnorm key inside a block
    "norm1.linear": "adaLN_modulation.1",
    "attn1.to_out.0": "attn.out_proj",
    "ff.net.0.proj": "ff.w1",
    "ff.net.2": "ff.w2",
}
_TOP = {
    "pos_embed.proj": "patch_embed.proj",
    "proj_out_1": "final_layer.adaLN_modulation.1",
    "proj_out_2": "final_layer.linear",
}


def _diffusers_class() -> Any:
    try:
        from diffusers import DiTTransformer2DModel
    except ImportError as error:  # pragma: no cover - diffusers is a dev/interop extra
        raise ImportError(
            "diffusers is needed to convert DiT models: pip install 'addnorm[interop]'"
        ) from error
    return DiTTransformer2DModel


def _config_from_diffusers(model: Any, conditioning: str) -> DiTConfig:
    """The :class:`DiTConfig` of a diffusers DiT; ValueError for what addnorm's cannot hold."""
    c = model.config
    unsupported = {
        "activation_fn": (c.activation_fn, "gelu-approximate"),
        "attention_bias": (c.attention_bias, True),
        "norm_elementwise_affine": (c.norm_elementwise_affine, False),
        "dropout": (c.dropout, 0.0),
        "norm_type": (c.norm_type, "ada_norm_zero"),
    }
    for name, (value, needed) in unsupported.items():
        if value != needed:
            raise ValueError(f"cannot convert a diffusers DiT with {name}={value!r}: "
                             f"addnorm's DiT has {name}={needed!r}")
    out_channels = model.out_channels
    if out_channels not in (c.in_channels, 2 * c.in_channels):
        raise ValueError(
            f"out_channels ({out_channels}) must be in_channels ({c.in_channels}) or twice it "
            "(learned variance)"
        )
    emb = model.transformer_blocks[0].norm1.emb
    time_proj = emb.time_proj
    d_model = c.num_attention_heads * c.attention_head_dim
    return DiTConfig(
        input_size=c.sample_size, patch_size=c.patch_size, in_channels=c.in_channels,
        d_model=d_model, n_layers=c.num_layers, n_heads=c.num_attention_heads,
        mlp_ratio=model.transformer_blocks[0].ff.net[2].in_features / d_model,
        n_classes=c.num_embeds_ada_norm, class_dropout=float(emb.class_embedder.dropout_prob),
        learn_sigma=out_channels == 2 * c.in_channels, d_freq=time_proj.num_channels,
        timestep_flip_sin_to_cos=bool(time_proj.flip_sin_to_cos),
        timestep_downscale_freq_shift=float(time_proj.downscale_freq_shift),
        norm_eps=1e-6, ff_norm_eps=float(c.norm_eps), conditioning=conditioning,
    )


def _diffusers_conditioning(theirs: Mapping[str, torch.Tensor], n_layers: int) -> str:
    """``"shared"`` when every block's embedders equal block 0's (the paper's converted
    checkpoints), else ``"per_block"``."""
    for key in _EMBEDDERS:
        first = theirs[f"transformer_blocks.0.{_EMB}{key}"]
        for i in range(1, n_layers):
            if not torch.equal(theirs[f"transformer_blocks.{i}.{_EMB}{key}"], first):
                return "per_block"
    return "shared"


def _our_embedder_key(cfg: DiTConfig, i: int, key: str) -> str:
    """The addnorm key of block i's embedder weight ``key`` (an ``_EMBEDDERS`` value)."""
    return key if cfg.conditioning == "shared" else f"block_embeds.{i}.{key}"


def from_diffusers(model: Any) -> DiT:
    """A :class:`DiT` computing what a diffusers ``DiTTransformer2DModel`` computes.

    The differences from DiT (module docstring) become config options: blocks whose
    timestep and label embedders all hold the same weights give the shared layout
    (``conditioning="shared"``, DiT's), others the per-block one. The result takes the
    source's dtype, device and train/eval mode. Raises ValueError for what addnorm's DiT
    cannot hold (another activation, no attention bias, dropout, affine norms).
    """
    cls = _diffusers_class()
    if not isinstance(model, cls):
        raise TypeError(f"model must be a diffusers DiTTransformer2DModel, got {type(model)}")
    theirs = model.state_dict()
    cfg = _config_from_diffusers(model, _diffusers_conditioning(theirs, model.config.num_layers))
    converted: dict[str, torch.Tensor] = {}
    for i in range(cfg.n_layers):
        src, dst = f"transformer_blocks.{i}.", f"blocks.{i}."
        for key, ours in _EMBEDDERS.items():  # shared: block 0's equal every other block's
            converted[_our_embedder_key(cfg, i, ours)] = theirs[f"{src}{_EMB}{key}"]
        for kind in ("weight", "bias"):
            for their_name, our_name in _BLOCK.items():
                converted[f"{dst}{our_name}.{kind}"] = theirs[f"{src}{their_name}.{kind}"]
            qkv = [theirs[f"{src}attn1.to_{n}.{kind}"] for n in "qkv"]
            converted[f"{dst}attn.in_proj.{kind}"] = torch.cat(qkv, dim=0)  # rows q, k, v
    for their_name, our_name in _TOP.items():
        for kind in ("weight", "bias"):
            converted[f"{our_name}.{kind}"] = theirs[f"{their_name}.{kind}"]
    dit = DiT(cfg)
    converted["pos_embed"] = dit.pos_embed
    load_like(dit, converted, theirs["pos_embed.proj.weight"])
    return dit.train(model.training)


def _check_diffusers_compatible(cfg: DiTConfig) -> None:
    """diffusers fixes what DiTConfig makes an option; refuse a config it cannot express."""
    fixed = {
        "timestep_flip_sin_to_cos": (cfg.timestep_flip_sin_to_cos, True),
        "timestep_downscale_freq_shift": (cfg.timestep_downscale_freq_shift, 1.0),
        "d_freq": (cfg.d_freq, 256),
        "norm_eps": (cfg.norm_eps, 1e-6),
        "d_ff": (cfg.d_ff, 4 * cfg.d_model),
    }
    for name, (value, needed) in fixed.items():
        if value != needed:
            raise ValueError(
                f"diffusers' DiTTransformer2DModel fixes {name} at {needed}, the config has "
                f"{value}; the converted model would compute something else"
            )
    if not cfg.has_null_class:
        raise ValueError(
            "diffusers' DiT always has the null class row (its label dropout is 0.1); the "
            "config has class_dropout 0 and no null row"
        )


def to_diffusers(model: DiT) -> Any:
    """A diffusers ``DiTTransformer2DModel`` computing what ``model`` computes.

    Needs a config in diffusers' conventions (``timestep_downscale_freq_shift=1``,
    ``norm_eps=1e-6``, ``mlp_ratio=4``, 256 timestep channels, a null class), as
    :func:`from_diffusers` makes; ValueError otherwise. The shared layout's embedders are
    copied into every block; the per-block layout's ``block_embeds.i`` into block i. A
    ``class_dropout`` other than diffusers' fixed 0.1 is set on each block's
    ``class_embedder.dropout_prob``; diffusers' config cannot record it, so it is lost by
    ``save_pretrained``. The result takes ``model``'s dtype, device and train/eval mode.
    """
    if not isinstance(model, DiT):
        raise TypeError(f"model must be an addnorm DiT, got {type(model).__name__}")
    cfg = model.cfg
    _check_diffusers_compatible(cfg)
    cls = _diffusers_class()
    theirs = cls(
        num_attention_heads=cfg.n_heads, attention_head_dim=cfg.d_model // cfg.n_heads,
        in_channels=cfg.in_channels, out_channels=cfg.out_channels, num_layers=cfg.n_layers,
        dropout=0.0, attention_bias=True, sample_size=cfg.input_size,
        patch_size=cfg.patch_size, activation_fn="gelu-approximate",
        num_embeds_ada_norm=cfg.n_classes, norm_type="ada_norm_zero",
        norm_elementwise_affine=False, norm_eps=cfg.ff_norm_eps,
    )
    ours = model.state_dict()
    converted: dict[str, torch.Tensor] = {}
    for their_name, our_name in _TOP.items():
        for kind in ("weight", "bias"):
            converted[f"{their_name}.{kind}"] = ours[f"{our_name}.{kind}"]
    for i in range(cfg.n_layers):
        src, dst = f"blocks.{i}.", f"transformer_blocks.{i}."
        for key, our_key in _EMBEDDERS.items():
            converted[f"{dst}{_EMB}{key}"] = ours[_our_embedder_key(cfg, i, our_key)]
        for kind in ("weight", "bias"):
            for their_name, our_name in _BLOCK.items():
                converted[f"{dst}{their_name}.{kind}"] = ours[f"{src}{our_name}.{kind}"]
            q, k, v = ours[f"{src}attn.in_proj.{kind}"].chunk(3, dim=0)
            for name, part in zip("qkv", (q, k, v), strict=True):
                converted[f"{dst}attn1.to_{name}.{kind}"] = part
    load_like(theirs, converted, ours["patch_embed.proj.weight"])
    for block in theirs.transformer_blocks:
        block.norm1.emb.class_embedder.dropout_prob = cfg.class_dropout
    return theirs.train(model.training)
