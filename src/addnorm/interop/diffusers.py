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
from addnorm.interop.hf_layout import Rule, rules_in, rules_out

__all__ = [
    "DIFFUSERS_DEFAULTS",
    "diffusers_conditioning",
    "diffusers_rules",
    "dit_config",
    "from_diffusers",
    "to_diffusers",
]

# DiTTransformer2DModel's defaults (its __init__), for a config.json that leaves fields out.
DIFFUSERS_DEFAULTS: dict[str, Any] = {
    "num_attention_heads": 16, "attention_head_dim": 72, "in_channels": 4, "out_channels": None,
    "num_layers": 28, "dropout": 0.0, "attention_bias": True, "sample_size": 32,
    "patch_size": 2, "activation_fn": "gelu-approximate", "num_embeds_ada_norm": 1000,
    "norm_type": "ada_norm_zero", "norm_elementwise_affine": False, "norm_eps": 1e-5,
}
# What its code fixes (CombinedTimestepLabelEmbeddings): the timestep features' convention
# and the label dropout, which its config does not record.
_TIMESTEP_FLIP_SIN_TO_COS, _TIMESTEP_SHIFT, _CLASS_DROPOUT = True, 1.0, 0.1

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


def dit_config(
    config: Mapping[str, Any],
    *,
    d_ff: int,
    d_freq: int,
    conditioning: str,
    class_dropout: float = _CLASS_DROPOUT,
    flip_sin_to_cos: bool = _TIMESTEP_FLIP_SIN_TO_COS,
    downscale_freq_shift: float = _TIMESTEP_SHIFT,
) -> DiTConfig:
    """The :class:`DiTConfig` of a diffusers DiT whose config (``model.config``, or its
    ``config.json``; missing fields take :data:`DIFFUSERS_DEFAULTS`) is ``config``, whose MLP
    is ``d_ff`` wide and whose timestep features are ``d_freq`` wide (read off the weights);
    the timestep convention and label dropout are its code's unless given. ValueError or
    TypeError for what addnorm's DiT cannot hold."""
    c = {**DIFFUSERS_DEFAULTS, **config}
    unsupported = {
        "activation_fn": "gelu-approximate", "attention_bias": True,
        "norm_elementwise_affine": False, "dropout": 0.0, "norm_type": "ada_norm_zero",
    }
    for name, needed in unsupported.items():
        if c[name] != needed:
            raise ValueError(f"cannot convert a diffusers DiT with {name}={c[name]!r}: "
                             f"addnorm's DiT has {name}={needed!r}")
    in_channels = c["in_channels"]
    out_channels = in_channels if c["out_channels"] is None else c["out_channels"]
    if out_channels not in (in_channels, 2 * in_channels):
        raise ValueError(
            f"out_channels ({out_channels}) must be in_channels ({in_channels}) or twice it "
            "(learned variance)"
        )
    n_heads, head_dim = c["num_attention_heads"], c["attention_head_dim"]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (n_heads, head_dim)):
        raise TypeError(f"num_attention_heads ({n_heads!r}) and attention_head_dim "
                        f"({head_dim!r}) must be ints")
    d_model = n_heads * head_dim
    return DiTConfig(
        input_size=c["sample_size"], patch_size=c["patch_size"], in_channels=in_channels,
        d_model=d_model, n_layers=c["num_layers"], n_heads=n_heads,
        mlp_ratio=d_ff / max(d_model, 1), n_classes=c["num_embeds_ada_norm"],
        class_dropout=float(class_dropout), learn_sigma=out_channels == 2 * in_channels,
        d_freq=d_freq, timestep_flip_sin_to_cos=bool(flip_sin_to_cos),
        timestep_downscale_freq_shift=float(downscale_freq_shift), norm_eps=1e-6,
        ff_norm_eps=c["norm_eps"], conditioning=conditioning,
    )


def _config_from_diffusers(model: Any, conditioning: str) -> DiTConfig:
    """The :class:`DiTConfig` of a diffusers DiT object (its embedders read off the module)."""
    emb = model.transformer_blocks[0].norm1.emb
    time_proj = emb.time_proj
    return dit_config(
        dict(model.config), d_ff=model.transformer_blocks[0].ff.net[2].in_features,
        d_freq=time_proj.num_channels, conditioning=conditioning,
        class_dropout=emb.class_embedder.dropout_prob,
        flip_sin_to_cos=time_proj.flip_sin_to_cos,
        downscale_freq_shift=time_proj.downscale_freq_shift,
    )


def diffusers_conditioning(theirs: Mapping[str, torch.Tensor], n_layers: int) -> str:
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


def diffusers_rules(cfg: DiTConfig) -> list[Rule]:
    """Where each tensor of a diffusers DiT goes in a :class:`DiT` of ``cfg``, as the rules of
    :mod:`addnorm.interop.hf_layout` (``"same"``: copied; ``"rows"``: ``to_q``, ``to_k``,
    ``to_v`` stacked into ``in_proj``). In the shared layout every block's embedders map to
    the one pair (into diffusers, each block gets a copy; from it, they must be equal)."""
    rules: list[Rule] = []
    for their_name, our_name in _TOP.items():
        rules += [(f"{our_name}.{kind}", (f"{their_name}.{kind}",), "same")
                  for kind in ("weight", "bias")]
    for i in range(cfg.n_layers):
        src, dst = f"transformer_blocks.{i}.", f"blocks.{i}."
        rules += [(_our_embedder_key(cfg, i, ours), (f"{src}{_EMB}{key}",), "same")
                  for key, ours in _EMBEDDERS.items()]
        for kind in ("weight", "bias"):
            rules += [(f"{dst}{our_name}.{kind}", (f"{src}{their_name}.{kind}",), "same")
                      for their_name, our_name in _BLOCK.items()]
            qkv = tuple(f"{src}attn1.to_{n}.{kind}" for n in "qkv")
            rules.append((f"{dst}attn.in_proj.{kind}", qkv, "rows"))  # rows q, k, v
    return rules


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
    cfg = _config_from_diffusers(model, diffusers_conditioning(theirs, model.config.num_layers))
    converted = rules_in(theirs, diffusers_rules(cfg))
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
    converted = rules_out(ours, diffusers_rules(cfg))
    load_like(theirs, converted, ours["patch_embed.proj.weight"])
    for block in theirs.transformer_blocks:
        block.norm1.emb.class_embedder.dropout_prob = cfg.class_dropout
    return theirs.train(model.training)
