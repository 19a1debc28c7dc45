"""from_torch / to_torch: torch.nn's Transformer modules are the oracle.

Every parity test gives both libraries the same weights (the conversion copies them) and the
same inputs, in float64, and expects the same outputs to FLOAT64_EXACT. torch.nn's fast path
("BetterTransformer", nested tensors that zero padded positions in eval mode) is switched off
for these tests through its documented switch, so every position is compared.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from tolerances import FLOAT64_EXACT
from torch import nn

from addnorm.attention import MultiHeadAttention, cross_attention_mask, self_attention_mask
from addnorm.feedforward import FeedForward
from addnorm.interop.torch_nn import from_torch, to_torch
from addnorm.rotary import RotaryEmbedding
from addnorm.transformer.config import LayerConfig
from addnorm.transformer.layers import DecoderLayer, EncoderLayer
from addnorm.transformer.stacks import Decoder, Encoder, EncoderDecoder

pytestmark = pytest.mark.filterwarnings("ignore:enable_nested_tensor is True")

D, H, F_, B, L, S = 8, 2, 16, 3, 5, 6
KINDS = ["mha", "encoder_layer", "decoder_layer", "encoder", "decoder", "transformer"]
CONFIGS = [
    {"norm_first": nf, "activation": act, "bias": bias, "eps": eps}
    for (nf, act, bias), eps in zip(
        itertools.product([False, True], ["relu", "gelu"], [True, False]),
        [1e-5, 1e-6] * 4,
        strict=True,
    )
]


@pytest.fixture(autouse=True)
def no_torch_fast_path():
    enabled = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    yield
    torch.backends.mha.set_fastpath_enabled(enabled)


def torch_module(
    kind, *, norm_first=False, activation="relu", bias=True, eps=1e-5, dropout=0.0,
    batch_first=True, final_norm=True,
) -> nn.Module:
    """A torch.nn module of ``kind`` with every parameter perturbed away from its init."""
    torch.manual_seed(0)
    layer_args = {
        "dim_feedforward": F_, "dropout": dropout, "activation": activation,
        "layer_norm_eps": eps, "batch_first": batch_first, "norm_first": norm_first, "bias": bias,
    }
    norm = nn.LayerNorm(D, eps=eps, bias=bias) if final_norm else None
    builders = {
        "mha": lambda: nn.MultiheadAttention(D, H, dropout=dropout, bias=bias,
                                             batch_first=batch_first),
        "encoder_layer": lambda: nn.TransformerEncoderLayer(D, H, **layer_args),
        "decoder_layer": lambda: nn.TransformerDecoderLayer(D, H, **layer_args),
        "encoder": lambda: nn.TransformerEncoder(
            nn.TransformerEncoderLayer(D, H, **layer_args), 2, norm=norm,
            enable_nested_tensor=False,
        ),
        "decoder": lambda: nn.TransformerDecoder(
            nn.TransformerDecoderLayer(D, H, **layer_args), 2, norm=norm
        ),
        "transformer": lambda: nn.Transformer(
            D, H, 2, 2, F_, dropout, activation, layer_norm_eps=eps, batch_first=batch_first,
            norm_first=norm_first, bias=bias,
        ),
    }
    module = builders[kind]().double()
    with torch.no_grad():  # biases start at 0 and norms at 1: move them, so swaps show
        for p in module.parameters():
            p.add_(0.2 * torch.randn_like(p))
    return module


def inputs():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(B, L, D, generator=gen, dtype=torch.float64)
    memory = torch.randn(B, S, D, generator=gen, dtype=torch.float64)
    # Right padding only, so that no query row (causal or not) is left without a real key.
    padding = torch.arange(L)[None] >= torch.tensor([L, L - 2, 3])[:, None]  # (B, L)
    memory_padding = torch.arange(S)[None] >= torch.tensor([S - 1, S, 2])[:, None]  # (B, S)
    return x, memory, padding, memory_padding


def causal_bool_mask(length: int) -> torch.Tensor:
    """torch.nn's causal mask as bool (True = not allowed), from its own helper."""
    return nn.Transformer.generate_square_subsequent_mask(length) != 0


def run_torch(kind, module, causal, batch_first=True):
    x, memory, padding, memory_padding = inputs()
    if not batch_first:
        x, memory = x.transpose(0, 1), memory.transpose(0, 1)  # (L, B, D) for torch.nn
    mask = causal_bool_mask(L) if causal else None
    if kind == "mha":
        out = module(x, x, x, key_padding_mask=padding, attn_mask=mask, is_causal=causal,
                     need_weights=False)[0]
    elif kind == "encoder_layer":
        out = module(x, src_mask=mask, src_key_padding_mask=padding, is_causal=causal)
    elif kind == "encoder":
        out = module(x, mask=mask, src_key_padding_mask=padding, is_causal=causal)
    elif kind in ("decoder_layer", "decoder"):
        out = module(x, memory, tgt_mask=mask, tgt_key_padding_mask=padding,
                     memory_key_padding_mask=memory_padding, tgt_is_causal=causal)
    else:  # the encoder-decoder is causal on the target side by construction
        out = module(memory, x, tgt_mask=causal_bool_mask(L), src_key_padding_mask=memory_padding,
                     tgt_key_padding_mask=padding, memory_key_padding_mask=memory_padding,
                     tgt_is_causal=True)
    return out if batch_first else out.transpose(0, 1)


def run_addnorm(kind, module, causal):
    x, memory, padding, memory_padding = inputs()
    if kind in ("encoder_layer", "decoder_layer"):  # a layer takes the masks a stack builds
        mask = self_attention_mask(x, n_heads=H, padding_mask=padding, causal=causal)
        if kind == "encoder_layer":
            return module(x, mask)
        return module(x, memory, mask, cross_attention_mask(x, memory, n_heads=H,
                                                            padding_mask=memory_padding))
    if kind in ("mha", "encoder"):
        return module(x, padding_mask=padding, causal=causal)
    if kind == "decoder":
        return module(x, memory, padding_mask=padding, memory_padding_mask=memory_padding,
                      causal=causal)
    return module(memory, x, src_padding_mask=memory_padding, tgt_padding_mask=padding)


def assert_same(a: torch.Tensor, b: torch.Tensor) -> None:
    # Two float64 implementations of one layer or stack (unit-scale values): FLOAT32_MODEL's
    # bound is ~170 u of float32; at u = 2**-53 that is 2e-14, inside FLOAT64_EXACT.
    torch.testing.assert_close(a, b, **FLOAT64_EXACT)


# -------------------------------------------------------------------------------- parity


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "-".join(map(str, c.values())))
@pytest.mark.parametrize(("mode", "causal"), [("eval", True), ("train", False)])
@pytest.mark.parametrize("kind", KINDS)
def test_from_torch_gives_the_same_outputs(kind, mode, causal, config):
    # eval: dropout 0.1 is inactive in both; train: dropout 0, so both are deterministic.
    dropout = 0.1 if mode == "eval" else 0.0
    if kind == "mha":
        config = {"bias": config["bias"]}
    reference = torch_module(kind, dropout=dropout, **config).train(mode == "train")
    converted = from_torch(reference)
    assert converted.training == (mode == "train")
    assert_same(run_addnorm(kind, converted, causal), run_torch(kind, reference, causal))


@pytest.mark.parametrize("kind", KINDS)
def test_batch_first_false_converts_to_a_batch_first_module(kind):
    reference = torch_module(kind, batch_first=False).eval()
    converted = from_torch(reference)
    expected = run_torch(kind, reference, causal=True, batch_first=False)
    assert_same(run_addnorm(kind, converted, causal=True), expected)


@pytest.mark.parametrize("kind", ["encoder", "decoder"])
@pytest.mark.parametrize("norm_first", [False, True])
def test_stacks_without_a_final_norm_stay_without(kind, norm_first):
    reference = torch_module(kind, final_norm=False, norm_first=norm_first).eval()
    converted = from_torch(reference)
    assert isinstance(converted.norm, nn.Identity)
    assert_same(run_addnorm(kind, converted, True), run_torch(kind, reference, True))


def test_cross_attention_and_attention_weights_match_torch():
    reference = torch_module("mha").eval()
    converted = from_torch(reference)
    x, memory, _, memory_padding = inputs()
    expected, expected_weights = reference(
        x, memory, memory, key_padding_mask=memory_padding, average_attn_weights=False
    )
    out, weights = converted.forward_with_weights(x, memory, padding_mask=memory_padding)
    assert_same(out, expected)
    assert_same(weights, expected_weights)  # (B, H, L, S), per head


def test_attend_mask_is_the_negation_of_torch_attn_mask():
    reference = torch_module("encoder_layer").eval()
    x = inputs()[0]
    attend = torch.rand(L, L, generator=torch.Generator().manual_seed(2)) < 0.5
    attend |= torch.eye(L, dtype=torch.bool)  # every query sees at least itself
    expected = reference(x, src_mask=~attend)
    mask = self_attention_mask(x, n_heads=H, attend_mask=attend)
    assert_same(from_torch(reference)(x, mask), expected)


# ------------------------------------------------------------------- round trips, to_torch


@pytest.mark.parametrize("config", CONFIGS[::3], ids=lambda c: "-".join(map(str, c.values())))
@pytest.mark.parametrize("kind", KINDS)
def test_round_trip_through_addnorm_reproduces_the_state_dict(kind, config):
    if kind == "mha":
        config = {"bias": config["bias"]}
    reference = torch_module(kind, dropout=0.1, **config)
    back = to_torch(from_torch(reference))
    expected, got = reference.state_dict(), back.state_dict()
    assert list(got) == list(expected)
    for name, value in expected.items():
        assert got[name].dtype == value.dtype and torch.equal(got[name], value), name


def addnorm_module(kind, *, norm_position="post", activation="gelu", bias=True,
                   final_norm=None) -> nn.Module:
    torch.manual_seed(3)
    cfg = LayerConfig(D, H, F_, dropout=0.1, activation=activation, norm_position=norm_position,
                      norm_eps=1e-6, bias=bias)
    builders = {
        "mha": lambda: MultiHeadAttention(D, H, dropout=0.1, bias=bias),
        "encoder_layer": lambda: EncoderLayer(cfg),
        "decoder_layer": lambda: DecoderLayer(cfg),
        "encoder": lambda: Encoder(cfg, 2, final_norm=final_norm),
        "decoder": lambda: Decoder(cfg, 2, final_norm=final_norm),
        "transformer": lambda: EncoderDecoder(
            Encoder(cfg, 2, final_norm=final_norm), Decoder(cfg, 3, final_norm=final_norm)
        ),
    }
    module = builders[kind]().double()
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.2 * torch.randn_like(p))
    return module


@pytest.mark.parametrize(
    ("norm_position", "bias", "final_norm"),
    [("post", True, None), ("pre", False, None), ("post", False, True), ("pre", True, False)],
)
@pytest.mark.parametrize("kind", KINDS)
def test_to_torch_gives_the_same_outputs(kind, norm_position, bias, final_norm):
    ours = addnorm_module(kind, norm_position=norm_position, bias=bias,
                          final_norm=final_norm).eval()
    converted = to_torch(ours)
    assert all(p.dtype == torch.float64 for p in converted.parameters())
    assert not converted.training
    if kind != "mha":
        assert (converted.batch_first if kind == "transformer"
                else next(m for m in converted.modules()
                          if isinstance(m, nn.MultiheadAttention)).batch_first)
    assert_same(run_torch(kind, converted, True), run_addnorm(kind, ours, True))
    back = from_torch(converted)
    assert all(torch.equal(a, b) for a, b in
               zip(back.state_dict().values(), ours.state_dict().values(), strict=True))


def dropout_sites(module: nn.Module) -> list[float]:
    """Every dropout probability in a module: nn.Dropout's p and the attention modules'."""
    sites = (nn.Dropout, nn.MultiheadAttention, MultiHeadAttention)
    return [m.p if isinstance(m, nn.Dropout) else m.dropout for m in module.modules()
            if isinstance(m, sites)]


@pytest.mark.parametrize("kind", KINDS)
def test_dropout_probability_carries_over_to_every_site(kind):
    source_torch, source_ours = torch_module(kind, dropout=0.3), addnorm_module(kind)
    ours, theirs = from_torch(source_torch), to_torch(source_ours)  # 0.3 and 0.1
    # The sites correspond one to one: an attention module's p, plus per encoder (decoder)
    # layer 3 (4) nn.Dropout in torch.nn, as in addnorm (FFN, and one per Add & Norm).
    assert len(dropout_sites(ours)) == len(dropout_sites(source_torch)) > 0
    assert len(dropout_sites(theirs)) == len(dropout_sites(source_ours)) > 0
    assert set(dropout_sites(ours)) == {0.3} and set(dropout_sites(theirs)) == {0.1}


# ------------------------------------------------------------------------------ refusals


class ExtraParameterLayer(nn.TransformerEncoderLayer):
    def __init__(self):
        super().__init__(D, H, F_, batch_first=True)
        self.scale = nn.Parameter(torch.ones(1))


def torch_layer_with(**changes):
    layer = nn.TransformerEncoderLayer(D, H, F_, batch_first=True)
    for name, value in changes.items():
        setattr(layer, name, value)
    return layer


def encoder_with_mixed_layers():
    encoder = nn.TransformerEncoder(torch_layer_with(), 2, enable_nested_tensor=False)
    encoder.layers[1] = nn.TransformerEncoderLayer(D, H, F_, batch_first=True, norm_first=True)
    return encoder


@pytest.mark.parametrize(
    ("build", "words"),
    [
        (lambda: nn.MultiheadAttention(D, H, kdim=4, vdim=4), r"kdim \(4\)"),
        (lambda: nn.MultiheadAttention(D, H, add_bias_kv=True), "add_bias_kv"),
        (lambda: nn.MultiheadAttention(D, H, add_zero_attn=True), "add_zero_attn"),
        (lambda: nn.TransformerEncoderLayer(D, H, F_, activation=nn.SiLU()), "activation SiLU"),
        (lambda: nn.TransformerEncoderLayer(D, H, F_, activation=nn.GELU(approximate="tanh")),
         "activation GELU"),
        (lambda: nn.TransformerEncoderLayer(D, H, F_, activation=torch.tanh), "activation tanh"),
        (lambda: torch_layer_with(dropout1=nn.Dropout(0.5)), r"dropout1\.p=0\.5"),
        (lambda: torch_layer_with(norm2=nn.LayerNorm(D, eps=1e-3)), r"norm2\.eps=0\.001"),
        (lambda: torch_layer_with(norm1=nn.Identity()), "norm1 must be a LayerNorm"),
        (lambda: torch_layer_with(norm1=nn.LayerNorm(D, elementwise_affine=False)),
         "elementwise_affine"),
        (lambda: nn.TransformerEncoder(torch_layer_with(), 2, norm=nn.LayerNorm(D, eps=1e-3),
                                       enable_nested_tensor=False), r"norm\.eps=0\.001"),
        (encoder_with_mixed_layers, "layer configuration"),
        (ExtraParameterLayer, r"does not know: \['scale'\]"),
    ],
)
def test_from_torch_refuses_features_addnorm_lacks(build, words):
    with pytest.raises(ValueError, match=words):
        from_torch(build())


@pytest.mark.parametrize(
    ("build", "words"),
    [
        (lambda: MultiHeadAttention(D, H, rotary=RotaryEmbedding(D // H)), "rotary"),
        (lambda: EncoderLayer(LayerConfig(D, H, F_), rotary=RotaryEmbedding(D // H)), "rotary"),
        (lambda: EncoderLayer(LayerConfig(D, H, F_, norm="rms")), "must be a LayerNorm.*RMSNorm"),
        (lambda: DecoderLayer(LayerConfig(D, H, F_, norm="batch")),
         "must be a LayerNorm.*BatchNorm"),
        (lambda: EncoderLayer(LayerConfig(D, H, F_, activation="swiglu")), "'swiglu'"),
        (lambda: EncoderLayer(LayerConfig(D, H, F_, activation="gelu_tanh")), "'gelu_tanh'"),
        (lambda: Encoder(LayerConfig(D, H, F_, norm="rms", norm_position="pre"), 2), "RMSNorm"),
    ],
)
def test_to_torch_refuses_features_torch_nn_lacks(build, words):
    with pytest.raises(ValueError, match=words):
        to_torch(build())


@pytest.mark.parametrize(
    ("convert", "module", "words"),
    [
        (from_torch, nn.Linear(D, D), "from_torch cannot convert Linear; supported: nn.Multi"),
        (from_torch, EncoderLayer(LayerConfig(D, H, F_)), "from_torch cannot convert EncoderLayer"),
        (to_torch, FeedForward(D, F_), "to_torch cannot convert FeedForward; supported: Multi"),
        (to_torch, nn.TransformerEncoderLayer(D, H, F_), "cannot convert TransformerEncoderLayer"),
        (from_torch, nn.Transformer(D, H, 1, 1, F_, custom_encoder=nn.Identity()),
         "nn.Transformer.encoder must be an nn.TransformerEncoder"),
    ],
)
def test_unknown_module_types_are_rejected_with_the_supported_ones(convert, module, words):
    with pytest.raises(TypeError, match=words):
        convert(module)
