"""EncoderLayer and DecoderLayer: oracles are nn.TransformerEncoderLayer / DecoderLayer given
the same weights (copied by hand), the Glorot bound, and cached == uncached."""

from __future__ import annotations

import math

import pytest
import torch
from tolerances import FLOAT64_EXACT
from torch import nn

from addnorm import feedforward, norms
from addnorm.attention import (
    AttentionMask,
    MultiHeadAttention,
    cross_attention_mask,
    self_attention_mask,
)
from addnorm.cache import KVCache, LayerCache
from addnorm.feedforward import make_feedforward
from addnorm.norms import make_norm
from addnorm.residual import AddNorm
from addnorm.rotary import RotaryEmbedding
from addnorm.transformer import layers
from addnorm.transformer.config import LayerConfig
from addnorm.transformer.layers import DecoderLayer, EncoderLayer, norm_module, xavier_init_

D, H, FF = 16, 4, 32
F64 = torch.float64  # every comparison below is float64, so FLOAT64_EXACT bounds it


@torch.no_grad()
def copy_attention(ours: MultiHeadAttention, ref: nn.MultiheadAttention) -> None:
    ours.in_proj.weight.copy_(ref.in_proj_weight)
    ours.in_proj.bias.copy_(ref.in_proj_bias)
    ours.out_proj.load_state_dict(ref.out_proj.state_dict())


@torch.no_grad()
def copy_encoder_layer(ours: EncoderLayer, ref: nn.TransformerEncoderLayer) -> None:
    copy_attention(ours.self_attn, ref.self_attn)
    ours.ff.w1.load_state_dict(ref.linear1.state_dict())
    ours.ff.w2.load_state_dict(ref.linear2.state_dict())
    ours.attn_add_norm.norm.load_state_dict(ref.norm1.state_dict())
    ours.ff_add_norm.norm.load_state_dict(ref.norm2.state_dict())


@torch.no_grad()
def copy_decoder_layer(ours: DecoderLayer, ref: nn.TransformerDecoderLayer) -> None:
    copy_attention(ours.self_attn, ref.self_attn)
    copy_attention(ours.cross_attn, ref.multihead_attn)
    ours.ff.w1.load_state_dict(ref.linear1.state_dict())
    ours.ff.w2.load_state_dict(ref.linear2.state_dict())
    ours.self_attn_add_norm.norm.load_state_dict(ref.norm1.state_dict())
    ours.cross_attn_add_norm.norm.load_state_dict(ref.norm2.state_dict())
    ours.ff_add_norm.norm.load_state_dict(ref.norm3.state_dict())


def self_mask(x: torch.Tensor, **kwargs) -> AttentionMask:
    """The layer's self-attention mask, built as a stack builds it."""
    return self_attention_mask(x, n_heads=H, **kwargs)


def memory_mask(x: torch.Tensor, memory: torch.Tensor, padding: torch.Tensor) -> AttentionMask:
    return cross_attention_mask(x, memory, n_heads=H, padding_mask=padding)


def randn(*shape: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(*shape, dtype=F64, generator=torch.Generator().manual_seed(seed))


def right_padding(lengths: list[int], total: int) -> torch.Tensor:
    return torch.arange(total)[None, :] >= torch.tensor(lengths)[:, None]


def torch_causal(length: int) -> torch.Tensor:
    """torch.nn's bool attn_mask: True = blocked (the future)."""
    return torch.ones(length, length, dtype=torch.bool).triu(1)


CASES = [
    pytest.param(position, activation, train, id=f"{position}-{activation}-{int(train)}")
    for position in ("post", "pre")
    for activation in ("relu", "gelu")
    for train in (False, True)
]


@pytest.mark.parametrize(("position", "activation", "train"), CASES)
def test_encoder_layer_matches_torch_encoder_layer(position, activation, train):
    torch.manual_seed(0)
    ref = nn.TransformerEncoderLayer(
        D, H, FF, dropout=0.0, activation=activation, batch_first=True,
        norm_first=position == "pre",
    ).to(F64)
    cfg = LayerConfig(D, H, FF, activation=activation, norm_position=position)
    ours = EncoderLayer(cfg).to(F64)
    copy_encoder_layer(ours, ref)
    ours.train(train), ref.train(train)
    x, padding = randn(2, 5, D), right_padding([5, 3], 5)
    expected = ref(x, src_key_padding_mask=padding)
    got = ours(x, self_mask(x, padding_mask=padding))
    torch.testing.assert_close(got, expected, **FLOAT64_EXACT)


@pytest.mark.parametrize(("position", "activation", "train"), CASES)
def test_decoder_layer_matches_torch_decoder_layer(position, activation, train):
    torch.manual_seed(0)
    ref = nn.TransformerDecoderLayer(
        D, H, FF, dropout=0.0, activation=activation, batch_first=True,
        norm_first=position == "pre",
    ).to(F64)
    cfg = LayerConfig(D, H, FF, activation=activation, norm_position=position)
    ours = DecoderLayer(cfg).to(F64)
    copy_decoder_layer(ours, ref)
    ours.train(train), ref.train(train)
    x, memory = randn(2, 4, D), randn(2, 6, D, seed=2)
    padding, memory_padding = right_padding([4, 2], 4), right_padding([6, 3], 6)
    expected = ref(
        x, memory, tgt_mask=torch_causal(4), tgt_key_padding_mask=padding,
        memory_key_padding_mask=memory_padding,
    )
    masks = self_mask(x, padding_mask=padding, causal=True), memory_mask(x, memory, memory_padding)
    got = ours(x, memory, *masks)
    torch.testing.assert_close(got, expected, **FLOAT64_EXACT)


def test_decoder_layer_attend_mask_equals_causal_flag():
    """attend_mask = lower triangle (True = may attend) is the causal mask for L == S."""
    torch.manual_seed(0)
    layer = DecoderLayer(LayerConfig(D, H, FF)).to(F64)
    x, memory = randn(2, 4, D), randn(2, 3, D, seed=2)
    tril = torch.ones(4, 4, dtype=torch.bool).tril()
    by_attend_mask = layer(x, memory, self_mask(x, attend_mask=tril))
    by_causal_flag = layer(x, memory, self_mask(x, causal=True))
    torch.testing.assert_close(by_attend_mask, by_causal_flag, **FLOAT64_EXACT)


@pytest.mark.parametrize("position", ["post", "pre"])
def test_cached_decoder_layer_equals_full_recomputation(position):
    torch.manual_seed(0)
    layer = DecoderLayer(LayerConfig(D, H, FF, norm_position=position)).to(F64).eval()
    x, memory = randn(2, 5, D), randn(2, 3, D, seed=2)
    memory_padding = right_padding([3, 2], 3)
    full = layer(x, memory, self_mask(x, causal=True), memory_mask(x, memory, memory_padding))
    cache = LayerCache(KVCache(2, H, 5, D // H, dtype=F64), KVCache(2, H, 3, D // H, dtype=F64))
    steps = []
    for i in range(5):
        x_i = x[:, i : i + 1]
        masks = self_mask(x_i, causal=True, cached=i), memory_mask(x_i, memory, memory_padding)
        steps.append(layer(x_i, memory, *masks, cache=cache))
    torch.testing.assert_close(torch.cat(steps, 1), full, **FLOAT64_EXACT)


def test_causal_encoder_layer_with_cache_equals_full_recomputation():
    torch.manual_seed(0)
    layer = EncoderLayer(LayerConfig(D, H, FF, norm_position="pre")).to(F64).eval()
    x = randn(2, 6, D)
    padding = torch.tensor([[True, True, False, False, False, False], [False] * 6])  # left pad
    full = layer(x, self_mask(x, padding_mask=padding, causal=True))
    cache = LayerCache(KVCache(2, H, 6, D // H, dtype=F64))
    prompt_mask = self_mask(x[:, :4], padding_mask=padding[:, :4], causal=True)
    prompt = layer(x[:, :4], prompt_mask, cache=cache)
    steps = []
    for i in range(4, 6):
        mask = self_mask(x[:, i : i + 1], padding_mask=padding[:, : i + 1], causal=True, cached=i)
        steps.append(layer(x[:, i : i + 1], mask, cache=cache))
    torch.testing.assert_close(torch.cat([prompt, *steps], 1), full, **FLOAT64_EXACT)


@pytest.mark.parametrize("layer_class", [EncoderLayer, DecoderLayer])
def test_fresh_layer_has_xavier_uniform_weights_and_zero_biases(layer_class):
    """Glorot & Bengio (2010): U(-b, b), b = sqrt(6 / (fan_in + fan_out)), per weight matrix."""
    torch.manual_seed(0)
    layer = layer_class(LayerConfig(64, 4, 128))
    matrices = []
    for module in layer.modules():
        if isinstance(module, MultiHeadAttention):
            matrices += [*module.in_proj.weight.chunk(3), module.out_proj.weight]
    matrices += [layer.ff.w1.weight, layer.ff.w2.weight]
    for w in matrices:
        bound = math.sqrt(6 / (w.shape[0] + w.shape[1]))
        assert w.abs().max() <= bound
        assert w.abs().max() > 0.95 * bound  # >= 4096 uniform draws: misses w.p. 0.95**4096
    for name, p in layer.named_parameters():
        if name.endswith("bias") and "norm" not in name:
            assert torch.equal(p, torch.zeros_like(p)), name


def test_two_layers_built_in_a_row_have_different_weights():
    """Each construction draws its own initialisation (no deep copies)."""
    first, second = EncoderLayer(LayerConfig(D, H, FF)), EncoderLayer(LayerConfig(D, H, FF))
    assert not torch.equal(first.self_attn.in_proj.weight, second.self_attn.in_proj.weight)
    assert not torch.equal(first.ff.w1.weight, second.ff.w1.weight)


def test_bias_false_removes_every_linear_and_layer_norm_bias():
    layer = DecoderLayer(LayerConfig(D, H, FF, bias=False))
    names = [name for name, _ in layer.named_parameters()]
    assert not [n for n in names if n.endswith("bias")], names


def _settings(module: nn.Module) -> dict:
    """A module's own attributes (sizes, eps, dropout, choices), nn.Module's tables left out."""
    return {k: v for k, v in vars(module).items() if not isinstance(v, dict | set)}


@pytest.mark.parametrize("norm", ["layer", "batch", "rms", "group"])
@pytest.mark.parametrize("activation", ["relu", "swiglu"])
@pytest.mark.parametrize("bias", [True, False])
def test_layer_parts_equal_those_the_parts_public_constructors_build(norm, activation, bias):
    """A layer hands each of the config's fields to the part that takes it. Oracle: the same
    parts from their public constructors, called by hand in the layer's order from the same
    seed (so the initialisation draws in the same order too)."""
    d, eps = 32, 1e-3  # d: a multiple of GroupNorm's 32 groups
    cfg = LayerConfig(d, H, 64, dropout=0.1, activation=activation, norm=norm, norm_eps=eps,
                      norm_position="pre", bias=bias)
    torch.manual_seed(0)
    layer = EncoderLayer(cfg)
    torch.manual_seed(0)
    ref = nn.Module()
    ref.self_attn = MultiHeadAttention(d, H, dropout=0.1, bias=bias)
    ref.ff = make_feedforward(d, 64, activation=activation, dropout=0.1, bias=bias)
    for name in ("attn_add_norm", "ff_add_norm"):  # make_norm: bias=False for LayerNorm only
        kind = make_norm(norm, d, eps=eps, bias=bias or norm != "layer")
        setattr(ref, name, AddNorm(d, norm_position="pre", norm=kind, dropout=0.1))
    xavier_init_(ref)
    pairs = list(zip(layer.named_modules(), ref.named_modules(), strict=True))[1:]
    for (name, ours), (ref_name, theirs) in pairs:
        assert (name, type(ours), repr(ours)) == (ref_name, type(theirs), repr(theirs))
        assert _settings(ours) == _settings(theirs), name
    assert layer.state_dict().keys() == ref.state_dict().keys()
    for key, value in layer.state_dict().items():
        assert torch.equal(value, ref.state_dict()[key]), key


def _marked(cls: type[nn.Module]) -> type[nn.Module]:
    """A subclass of the part ``cls`` whose ``__init__`` also sets ``init_ran``."""

    class Marked(cls):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self.init_ran = True

    return Marked


_NORM_CLASSES = {"layer": "LayerNorm", "batch": "BatchNorm", "rms": "RMSNorm", "group": "GroupNorm"}
_PARTS = {
    EncoderLayer: ["self_attn", "ff", "attn_add_norm", "ff_add_norm"],
    DecoderLayer: ["self_attn", "cross_attn", "ff", "self_attn_add_norm", "cross_attn_add_norm",
                   "ff_add_norm"],
}


@pytest.mark.parametrize("norm", ["layer", "batch", "rms", "group"])
@pytest.mark.parametrize("activation", ["relu", "swiglu"])
def test_a_layer_builds_each_part_by_running_its_init(monkeypatch, norm, activation):
    """Subclasses of the parts whose ``__init__`` sets an extra attribute stand in for the
    classes the layer builds (its attentions and Add & Norms, make_norm's norm class,
    make_feedforward's class): every part of a built layer, and the config's norm, has the
    attribute, so a layer builds each part through its ``__init__``."""
    ff_class = "GatedFeedForward" if activation == "swiglu" else "FeedForward"
    monkeypatch.setattr(norms, _NORM_CLASSES[norm], _marked(getattr(norms, _NORM_CLASSES[norm])))
    monkeypatch.setattr(feedforward, ff_class, _marked(getattr(feedforward, ff_class)))
    monkeypatch.setattr(layers, "MultiHeadAttention", _marked(MultiHeadAttention))
    monkeypatch.setattr(layers, "AddNorm", _marked(AddNorm))
    cfg = LayerConfig(32, H, 64, activation=activation, norm=norm)  # 32: GroupNorm's groups
    for layer_class, names in _PARTS.items():
        layer = layer_class(cfg)
        add_norms = [name for name in names if name.endswith("add_norm")]
        parts = names + [f"{name}.norm" for name in add_norms]
        not_initialised = [n for n in parts if not getattr(layer.get_submodule(n), "init_ran", 0)]
        assert not not_initialised, (layer_class.__name__, not_initialised)
    assert norm_module(cfg).init_ran


def test_dropout_reaches_attention_sublayers_and_ffn():
    layer = DecoderLayer(LayerConfig(D, H, FF, dropout=0.25))
    assert layer.self_attn.dropout == layer.cross_attn.dropout == 0.25
    assert layer.ff.dropout.p == 0.25
    for add_norm in (layer.self_attn_add_norm, layer.cross_attn_add_norm, layer.ff_add_norm):
        assert add_norm.dropout.p == 0.25


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda e, d, x: e(x[..., :8]), ValueError, r"x last dim must be 16"),
        (lambda e, d, x: d(x, randn(2, 3, 8)), ValueError, r"memory last dim must be 16"),
        (lambda e, d, x: d(x, randn(3, 3, D)), ValueError, r"memory batch size \(3\)"),
        (lambda e, d, x: e(x, self_mask(x, padding_mask=torch.zeros(2, 5))), TypeError,
         r"torch.bool"),
        (lambda e, d, x: e(x, x), TypeError, r"mask must be an AttentionMask"),
        (lambda e, d, x: e(x, cache=KVCache(2, H, 5, 4)), TypeError, r"LayerCache"),
        (lambda e, d, x: d(x, x, cache=LayerCache(KVCache(2, H, 5, 4))), ValueError,
         r"cross_attn KVCache"),
        (lambda e, d, x: LayerConfig(D, H, FF, norm="batchy"), ValueError, r"norm must be one"),
        (lambda e, d, x: LayerConfig(D, H, FF, activation="tanh"), ValueError, r"activation"),
        (lambda e, d, x: LayerConfig(D, H, FF, norm_position="middle"), ValueError,
         r"position must be one of 'post', 'pre'; got 'middle'"),
        (lambda e, d, x: EncoderLayer(LayerConfig(D, H, FF), rotary=RotaryEmbedding(8)),
         ValueError, r"rotary.d_head \(8\) must equal d_model / n_heads \(4\)"),
        (lambda e, d, x: DecoderLayer(LayerConfig(D, H, FF), rotary="rope"), TypeError,
         r"rotary must be a RotaryEmbedding or None, got str"),
    ],
)
def test_bad_inputs_raise_naming_the_values(call, error, match):
    torch.manual_seed(0)
    cfg = LayerConfig(D, H, FF)
    encoder, decoder = EncoderLayer(cfg).to(F64), DecoderLayer(cfg).to(F64)
    with pytest.raises(error, match=match):
        call(encoder, decoder, randn(2, 5, D))
