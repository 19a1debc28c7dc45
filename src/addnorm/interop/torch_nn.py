"""Conversion between torch.nn's Transformer modules and addnorm's, weights included.

    torch.nn                        addnorm
    nn.MultiheadAttention       <-> attention.MultiHeadAttention
    nn.TransformerEncoderLayer  <-> layers.EncoderLayer
    nn.TransformerDecoderLayer  <-> layers.DecoderLayer
    nn.TransformerEncoder       <-> stacks.Encoder
    nn.TransformerDecoder       <-> stacks.Decoder
    nn.Transformer              <-> stacks.EncoderDecoder

Conventions (see ``docs/design.md``):

- addnorm modules are batch-first. ``from_torch`` of a module with ``batch_first=False`` still
  gives a batch-first module (feed it (B, L, D)); ``to_torch`` always builds
  ``batch_first=True`` modules.
- Masks: torch.nn's ``key_padding_mask`` (True = padding) is addnorm's ``padding_mask``; its
  bool ``attn_mask`` (True = *not* allowed) is the negation of ``attend_mask``; a causal
  ``tgt_mask`` / ``is_causal=True`` is ``causal=True``. ``nn.Transformer`` takes a separate
  ``memory_key_padding_mask``; ``EncoderDecoder`` uses the source padding for it, so outputs
  agree when the two masks are the same (the usual call).
- ``nn.TransformerEncoder``'s optional ``norm`` is ``Encoder(final_norm=True)`` (likewise for
  the decoder); ``nn.Transformer`` always has both, so its conversion has them; ``to_torch``
  of an ``EncoderDecoder`` passes its stacks as ``custom_encoder`` / ``custom_decoder``, so a
  stack without final norm stays without.
- One dropout probability per module, as in torch.nn; it carries over. Parameters keep their
  dtype and device; the new module has the source's train/eval mode.
- ``to_torch`` builds ``nn.TransformerEncoder(..., enable_nested_tensor=False)``: torch's
  nested-tensor fast path writes zeros at padded positions, addnorm does not.

Not convertible (``ValueError`` naming the feature): from torch.nn, separate q/k/v projections
(``kdim``/``vdim`` != ``embed_dim``), ``add_bias_kv``, ``add_zero_attn``, activations other
than ReLU and exact GELU (torch's fast path runs every ``nn.GELU``, tanh or not, as exact
GELU), norms other than an affine LayerNorm, per-submodule dropout or epsilon values that
differ; to torch.nn, rotary embeddings, norms other than LayerNorm (RMSNorm, BatchNorm,
GroupNorm), and the ``swiglu`` / ``gelu_tanh`` activations.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import TypeVar, cast

import torch
import torch.nn.functional as F
from torch import nn

from addnorm.attention import MultiHeadAttention
from addnorm.norms import LayerNorm
from addnorm.transformer.config import LayerConfig
from addnorm.transformer.layers import DecoderLayer, EncoderLayer
from addnorm.transformer.stacks import Decoder, Encoder, EncoderDecoder

__all__ = ["from_torch", "to_torch"]

Pairs = list[tuple[str, str]]  # (addnorm parameter name, torch.nn parameter name)
TorchLayer = nn.TransformerEncoderLayer | nn.TransformerDecoderLayer
TorchStack = nn.TransformerEncoder | nn.TransformerDecoder
AddnormLayer = EncoderLayer | DecoderLayer
AddnormStack = Encoder | Decoder
_T = TypeVar("_T")


def from_torch(module: nn.Module) -> nn.Module:
    """The addnorm counterpart of a torch.nn Transformer module, with its weights (the types,
    conventions and what cannot be converted: the module docstring)."""
    for torch_type, convert in _FROM_TORCH:
        if isinstance(module, torch_type):
            converted, pairs = convert(module)
            return _finish(converted, module, [(ours, theirs) for ours, theirs in pairs])
    supported = ", ".join(f"nn.{t.__name__}" for t, _ in _FROM_TORCH)
    raise TypeError(f"from_torch cannot convert {type(module).__name__}; supported: {supported}")


def to_torch(module: nn.Module) -> nn.Module:
    """The torch.nn counterpart (``batch_first=True``) of an addnorm module, with its weights
    (the types, conventions and what cannot be converted: the module docstring)."""
    for addnorm_type, convert in _TO_TORCH:
        if isinstance(module, addnorm_type):
            converted, pairs = convert(module)
            return _finish(converted, module, [(theirs, ours) for ours, theirs in pairs])
    supported = ", ".join(t.__name__ for t, _ in _TO_TORCH)
    raise TypeError(f"to_torch cannot convert {type(module).__name__}; supported: {supported}")


# ------------------------------------------------------------------------- weight copying


def _finish(target: nn.Module, source: nn.Module, pairs: Pairs) -> nn.Module:
    """Put ``target`` on the source's device/dtype and mode, then copy (target, source) pairs."""
    reference = next(source.parameters())
    target.to(device=reference.device, dtype=reference.dtype)
    target.train(source.training)
    _check_all_mapped(source, [s for _, s in pairs])
    _check_all_mapped(target, [t for t, _ in pairs])
    with torch.no_grad():
        for target_name, source_name in pairs:
            dst, src = _lookup(target, target_name), _lookup(source, source_name)
            if dst is not None and src is not None:  # both or neither: one spec, one bias
                dst.copy_(src)
    return target


def _lookup(module: nn.Module, name: str) -> torch.Tensor | None:
    """The parameter at dotted ``name``, or None where the module has it switched off."""
    return cast("torch.Tensor | None", functools.reduce(getattr, name.split("."), module))


def _check_all_mapped(module: nn.Module, names: list[str]) -> None:
    unknown = sorted(set(dict(module.named_parameters())) - set(names))
    if unknown:
        raise ValueError(
            f"{type(module).__name__} has parameters the conversion does not know: {unknown}"
        )


_MHA_PAIRS: Pairs = [
    ("in_proj.weight", "in_proj_weight"),
    ("in_proj.bias", "in_proj_bias"),
    ("out_proj.weight", "out_proj.weight"),
    ("out_proj.bias", "out_proj.bias"),
]


def _prefixed(ours: str, theirs: str, pairs: Pairs) -> Pairs:
    return [(ours + a, theirs + b) for a, b in pairs]


def _affine(ours: str, theirs: str) -> Pairs:
    return [(f"{ours}.weight", f"{theirs}.weight"), (f"{ours}.bias", f"{theirs}.bias")]


def _layer_pairs(decoder: bool) -> Pairs:
    """addnorm layer names against ``nn.Transformer{Encoder,Decoder}Layer`` names."""
    pairs = _prefixed("self_attn.", "self_attn.", _MHA_PAIRS)
    pairs += _affine("ff.w1", "linear1") + _affine("ff.w2", "linear2")
    if not decoder:
        return pairs + _affine("attn_add_norm.norm", "norm1") + _affine("ff_add_norm.norm", "norm2")
    pairs += _prefixed("cross_attn.", "multihead_attn.", _MHA_PAIRS)
    pairs += _affine("self_attn_add_norm.norm", "norm1")
    pairs += _affine("cross_attn_add_norm.norm", "norm2")
    return pairs + _affine("ff_add_norm.norm", "norm3")


def _stack_pairs(n_layers: int, decoder: bool, final_norm: bool) -> Pairs:
    pairs: Pairs = []
    for i in range(n_layers):
        pairs += _prefixed(f"layers.{i}.", f"layers.{i}.", _layer_pairs(decoder))
    return pairs + (_affine("norm", "norm") if final_norm else [])


# ----------------------------------------------------------------- reading torch.nn modules


def _same(what: str, values: Mapping[str, _T]) -> _T:
    """The one value shared by all entries, or a ValueError listing them."""
    distinct = set(values.values())
    if len(distinct) != 1:
        listing = ", ".join(f"{k}={v!r}" for k, v in values.items())
        raise ValueError(f"{what} must be the same everywhere to convert, got {listing}")
    return distinct.pop()


def _torch_mha(mha: nn.MultiheadAttention, name: str) -> tuple[int, int, float, bool]:
    """(d_model, n_heads, dropout, bias) of an ``nn.MultiheadAttention``, or why not."""
    if not mha._qkv_same_embed_dim:
        raise ValueError(
            f"{name}: kdim ({mha.kdim}) / vdim ({mha.vdim}) different from embed_dim "
            f"({mha.embed_dim}) (separate q/k/v projection weights) is not supported"
        )
    if mha.bias_k is not None or mha.bias_v is not None:
        raise ValueError(f"{name}: add_bias_kv=True is not supported")
    if mha.add_zero_attn:
        raise ValueError(f"{name}: add_zero_attn=True is not supported")
    bias = _same(f"{name} bias", {"in_proj_bias": mha.in_proj_bias is not None,
                                  "out_proj.bias": mha.out_proj.bias is not None})
    return mha.embed_dim, mha.num_heads, float(mha.dropout), bool(bias)


def _torch_activation(activation: object) -> str:
    if activation is F.relu or isinstance(activation, nn.ReLU):
        return "relu"
    exact_gelu = isinstance(activation, nn.GELU) and activation.approximate == "none"
    if activation is F.gelu or exact_gelu:
        return "gelu"
    got = getattr(activation, "__name__", None) or repr(activation)
    raise ValueError(
        f"activation {got} is not supported: only relu and exact gelu (F.relu, F.gelu, "
        "nn.ReLU(), nn.GELU()) map to addnorm; torch.nn's fast path treats any nn.GELU as exact"
    )


def _norm_spec(name: str, norm: object) -> tuple[float, bool]:
    """(eps, bias) of an affine LayerNorm over the last dim (torch.nn's or addnorm's)."""
    if not isinstance(norm, nn.LayerNorm | LayerNorm):
        raise ValueError(f"{name} must be a LayerNorm to convert, got {type(norm).__name__}")
    if norm.weight is None:
        raise ValueError(f"{name}: LayerNorm without elementwise_affine is not supported")
    return float(norm.eps), norm.bias is not None


def _torch_layer_spec(layer: TorchLayer, decoder: bool) -> LayerConfig:
    """The spec of an ``nn.TransformerEncoderLayer`` / ``nn.TransformerDecoderLayer``."""
    attn_names = ("self_attn", "multihead_attn") if decoder else ("self_attn",)
    mha = {name: _torch_mha(getattr(layer, name), name) for name in attn_names}
    d_model, n_heads = _same("(d_model, n_heads)", {n: s[:2] for n, s in mha.items()})
    norm_names = ("norm1", "norm2", "norm3") if decoder else ("norm1", "norm2")
    norms = {name: _norm_spec(name, getattr(layer, name)) for name in norm_names}
    dropout_names = ("dropout",) + tuple(f"dropout{i}" for i in range(1, len(norm_names) + 1))
    dropouts = {f"{n}.dropout": s[2] for n, s in mha.items()}
    dropouts |= {f"{n}.p": float(getattr(layer, n).p) for n in dropout_names}
    biases = {f"{n} bias": s[3] for n, s in mha.items()} | {f"{n}.bias": s[1] for n, s in
                                                           norms.items()}
    biases |= {f"{n}.bias": getattr(layer, n).bias is not None for n in ("linear1", "linear2")}
    return LayerConfig(
        d_model=d_model,
        n_heads=n_heads,
        d_ff=layer.linear1.out_features,
        dropout=_same("dropout probability", dropouts),
        activation=_torch_activation(layer.activation),
        norm_position="pre" if layer.norm_first else "post",
        norm_eps=_same("layer_norm_eps", {f"{n}.eps": s[0] for n, s in norms.items()}),
        bias=_same("bias", biases),
    )


def _stack_spec(specs: dict[str, LayerConfig], norm: object, norm_name: str, eps_name: str
                ) -> tuple[LayerConfig, bool]:
    """(layer spec shared by every layer, has a final norm) of a stack of either library,
    given its layers' specs and its final norm (None: none)."""
    spec = _same("layer configuration", specs)
    if norm is not None:
        eps, bias = _norm_spec(norm_name, norm)
        _same(eps_name, {"layers": spec.norm_eps, "norm.eps": eps})
        _same("bias", {"layers": spec.bias, "norm.bias": bias})
    return spec, norm is not None


def _torch_stack_spec(stack: TorchStack, decoder: bool) -> tuple[LayerConfig, bool]:
    # torch.nn stacks hold clones of the Transformer{Encoder,Decoder}Layer they were given
    specs = {f"layers[{i}]": _torch_layer_spec(cast(TorchLayer, layer), decoder) for i, layer in
             enumerate(stack.layers)}
    return _stack_spec(specs, stack.norm, "norm", "layer_norm_eps")


# ---------------------------------------------------------------- reading addnorm modules


def _addnorm_mha(mha: MultiHeadAttention, name: str) -> tuple[int, int, float, bool]:
    if mha.rotary is not None:
        raise ValueError(f"{name}: rotary embeddings have no torch.nn counterpart")
    bias = _same(f"{name} bias", {"in_proj.bias": mha.in_proj.bias is not None,
                                  "out_proj.bias": mha.out_proj.bias is not None})
    return mha.d_model, mha.n_heads, float(mha.dropout), bool(bias)


def _addnorm_layer_spec(layer: AddnormLayer, decoder: bool) -> LayerConfig:
    """The spec of an addnorm ``EncoderLayer`` / ``DecoderLayer``, or why torch.nn lacks it."""
    attn_names = ("self_attn", "cross_attn") if decoder else ("self_attn",)
    add_norm_names = (("self_attn_add_norm", "cross_attn_add_norm", "ff_add_norm") if decoder
                      else ("attn_add_norm", "ff_add_norm"))
    mha = {name: _addnorm_mha(getattr(layer, name), name) for name in attn_names}
    add_norms = {name: getattr(layer, name) for name in add_norm_names}
    norms = {n: _norm_spec(f"{n}.norm ({type(a.norm).__name__})", a.norm)
             for n, a in add_norms.items()}
    activation = layer.ff.activation
    if activation not in ("relu", "gelu"):
        raise ValueError(f"activation {activation!r} has no torch.nn counterpart (relu, gelu)")
    dropouts = {f"{n}.dropout": s[2] for n, s in mha.items()}
    dropouts |= {f"{n}.dropout.p": float(a.dropout.p) for n, a in add_norms.items()}
    dropouts["ff.dropout.p"] = float(layer.ff.dropout.p)
    biases = {f"{n} bias": s[3] for n, s in mha.items()}
    biases |= {f"{n}.norm.bias": s[1] for n, s in norms.items()}
    biases |= {f"ff.{w}.bias": getattr(layer.ff, w).bias is not None for w in ("w1", "w2")}
    return LayerConfig(
        d_model=_same("d_model", {n: s[0] for n, s in mha.items()}),
        n_heads=_same("n_heads", {n: s[1] for n, s in mha.items()}),
        d_ff=layer.ff.d_ff,
        dropout=_same("dropout probability", dropouts),
        activation=activation,
        norm_position=_same("norm position", {n: a.norm_position for n, a in add_norms.items()}),
        norm_eps=_same("norm eps", {f"{n}.norm.eps": s[0] for n, s in norms.items()}),
        bias=_same("bias", biases),
    )


def _addnorm_stack_spec(stack: AddnormStack, decoder: bool) -> tuple[LayerConfig, bool]:
    # Encoder / Decoder build their layers from EncoderLayer / DecoderLayer only
    specs = {f"layers[{i}]": _addnorm_layer_spec(cast(AddnormLayer, layer), decoder)
             for i, layer in enumerate(stack.layers)}
    norm = None if isinstance(stack.norm, nn.Identity) else stack.norm
    return _stack_spec(specs, norm, f"norm ({type(stack.norm).__name__})", "norm eps")


# --------------------------------------------------------------------------- conversions


def _mha_from_torch(m: nn.MultiheadAttention) -> tuple[nn.Module, Pairs]:
    d_model, n_heads, dropout, bias = _torch_mha(m, "MultiheadAttention")
    return MultiHeadAttention(d_model, n_heads, dropout=dropout, bias=bias), _MHA_PAIRS


def _mha_to_torch(m: MultiHeadAttention) -> tuple[nn.Module, Pairs]:
    d_model, n_heads, dropout, bias = _addnorm_mha(m, "MultiHeadAttention")
    converted = nn.MultiheadAttention(d_model, n_heads, dropout=dropout, bias=bias,
                                      batch_first=True)
    return converted, _MHA_PAIRS


def _torch_layer(spec: LayerConfig, decoder: bool) -> TorchLayer:
    return (nn.TransformerDecoderLayer if decoder else nn.TransformerEncoderLayer)(
        spec.d_model, spec.n_heads, dim_feedforward=spec.d_ff, dropout=spec.dropout,
        activation=spec.activation, layer_norm_eps=spec.norm_eps, batch_first=True,
        norm_first=spec.norm_position == "pre", bias=spec.bias,
    )


def _addnorm_stack(spec: LayerConfig, n_layers: int, final_norm: bool, decoder: bool):
    return (Decoder if decoder else Encoder)(spec, n_layers, final_norm=final_norm)


def _torch_stack(spec: LayerConfig, n_layers: int, final_norm: bool, decoder: bool):
    norm = nn.LayerNorm(spec.d_model, eps=spec.norm_eps, bias=spec.bias) if final_norm else None
    layer = _torch_layer(spec, decoder)
    if isinstance(layer, nn.TransformerDecoderLayer):  # exactly when decoder
        return nn.TransformerDecoder(layer, n_layers, norm=norm)
    return nn.TransformerEncoder(layer, n_layers, norm=norm, enable_nested_tensor=False)


def _layer_converter(decoder: bool, into_addnorm: bool) -> Callable:
    def convert(layer: TorchLayer | AddnormLayer) -> tuple[nn.Module, Pairs]:
        if into_addnorm:
            spec = _torch_layer_spec(cast(TorchLayer, layer), decoder)
            return (DecoderLayer if decoder else EncoderLayer)(spec), _layer_pairs(decoder)
        spec = _addnorm_layer_spec(cast(AddnormLayer, layer), decoder)
        return _torch_layer(spec, decoder), _layer_pairs(decoder)

    return convert


def _stack_converter(decoder: bool, into_addnorm: bool) -> Callable:
    def convert(stack: TorchStack | AddnormStack) -> tuple[nn.Module, Pairs]:
        if into_addnorm:
            spec, final_norm = _torch_stack_spec(cast(TorchStack, stack), decoder)
        else:
            spec, final_norm = _addnorm_stack_spec(cast(AddnormStack, stack), decoder)
        build = _addnorm_stack if into_addnorm else _torch_stack
        n_layers = len(stack.layers)
        converted = build(spec, n_layers, final_norm, decoder)
        return converted, _stack_pairs(n_layers, decoder, final_norm)

    return convert


def _transformer_from_torch(model: nn.Transformer) -> tuple[nn.Module, Pairs]:
    parts = {"encoder": (model.encoder, nn.TransformerEncoder, False),
             "decoder": (model.decoder, nn.TransformerDecoder, True)}
    converted, pairs = {}, []
    for name, (stack, stack_type, decoder) in parts.items():
        if not isinstance(stack, stack_type):
            raise TypeError(
                f"nn.Transformer.{name} must be an nn.{stack_type.__name__} to convert, "
                f"got {type(stack).__name__}"
            )
        converted[name], stack_pairs = _stack_converter(decoder, into_addnorm=True)(stack)
        pairs += _prefixed(f"{name}.", f"{name}.", stack_pairs)
    return EncoderDecoder(converted["encoder"], converted["decoder"]), pairs


def _transformer_to_torch(model: EncoderDecoder) -> tuple[nn.Module, Pairs]:
    encoder, encoder_pairs = _stack_converter(False, into_addnorm=False)(model.encoder)
    decoder, decoder_pairs = _stack_converter(True, into_addnorm=False)(model.decoder)
    first = cast(EncoderLayer, model.encoder.layers[0])  # Encoder builds EncoderLayers only
    converted = nn.Transformer(
        d_model=first.self_attn.d_model, nhead=first.self_attn.n_heads,
        custom_encoder=encoder, custom_decoder=decoder, batch_first=True,
    )
    pairs = _prefixed("encoder.", "encoder.", encoder_pairs)
    return converted, pairs + _prefixed("decoder.", "decoder.", decoder_pairs)


# from_torch / to_torch call a converter only on instances of the type it is listed with.
_FROM_TORCH: list[tuple[type, Callable]] = [
    (nn.MultiheadAttention, _mha_from_torch),
    (nn.TransformerEncoderLayer, _layer_converter(decoder=False, into_addnorm=True)),
    (nn.TransformerDecoderLayer, _layer_converter(decoder=True, into_addnorm=True)),
    (nn.TransformerEncoder, _stack_converter(decoder=False, into_addnorm=True)),
    (nn.TransformerDecoder, _stack_converter(decoder=True, into_addnorm=True)),
    (nn.Transformer, _transformer_from_torch),
]

_TO_TORCH: list[tuple[type, Callable]] = [
    (MultiHeadAttention, _mha_to_torch),
    (EncoderLayer, _layer_converter(decoder=False, into_addnorm=False)),
    (DecoderLayer, _layer_converter(decoder=True, into_addnorm=False)),
    (Encoder, _stack_converter(decoder=False, into_addnorm=False)),
    (Decoder, _stack_converter(decoder=True, into_addnorm=False)),
    (EncoderDecoder, _transformer_to_torch),
]
