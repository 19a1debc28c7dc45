"""Encoder, Decoder, EncoderDecoder: oracles are nn.TransformerEncoder / Decoder /
nn.Transformer given the same weights (copied by hand), and invariants (padding, causality,
permutation equivariance, independent initialisation)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from properties import examples
from tolerances import FLOAT32_MODEL, FLOAT64_EXACT
from torch import nn

from addnorm.cache import memory_attention_mask
from addnorm.norms import LayerNorm, NoNorm
from addnorm.transformer.config import LayerConfig
from addnorm.transformer.stacks import Decoder, Encoder, EncoderDecoder

D, H, FF, N = 16, 4, 32, 2
CFG = LayerConfig(D, H, FF)
F64 = torch.float64  # float64 comparisons: FLOAT64_EXACT (tests/tolerances.py)


@torch.no_grad()
def copy_attention(ours, ref: nn.MultiheadAttention) -> None:
    ours.in_proj.weight.copy_(ref.in_proj_weight)
    ours.in_proj.bias.copy_(ref.in_proj_bias)
    ours.out_proj.load_state_dict(ref.out_proj.state_dict())


@torch.no_grad()
def copy_encoder(ours: Encoder, ref: nn.TransformerEncoder) -> None:
    for mine, theirs in zip(ours.layers, ref.layers, strict=True):
        copy_attention(mine.self_attn, theirs.self_attn)
        mine.ff.w1.load_state_dict(theirs.linear1.state_dict())
        mine.ff.w2.load_state_dict(theirs.linear2.state_dict())
        mine.attn_add_norm.norm.load_state_dict(theirs.norm1.state_dict())
        mine.ff_add_norm.norm.load_state_dict(theirs.norm2.state_dict())
    if ref.norm is not None:
        ours.norm.load_state_dict(ref.norm.state_dict())


@torch.no_grad()
def copy_decoder(ours: Decoder, ref: nn.TransformerDecoder) -> None:
    for mine, theirs in zip(ours.layers, ref.layers, strict=True):
        copy_attention(mine.self_attn, theirs.self_attn)
        copy_attention(mine.cross_attn, theirs.multihead_attn)
        mine.ff.w1.load_state_dict(theirs.linear1.state_dict())
        mine.ff.w2.load_state_dict(theirs.linear2.state_dict())
        mine.self_attn_add_norm.norm.load_state_dict(theirs.norm1.state_dict())
        mine.cross_attn_add_norm.norm.load_state_dict(theirs.norm2.state_dict())
        mine.ff_add_norm.norm.load_state_dict(theirs.norm3.state_dict())
    if ref.norm is not None:
        ours.norm.load_state_dict(ref.norm.state_dict())


def randn(*shape: int, seed: int = 1, dtype: torch.dtype = F64) -> torch.Tensor:
    return torch.randn(*shape, dtype=dtype, generator=torch.Generator().manual_seed(seed))


def right_padding(lengths: list[int], total: int) -> torch.Tensor:
    return torch.arange(total)[None, :] >= torch.tensor(lengths)[:, None]


def torch_causal(length: int) -> torch.Tensor:
    return torch.ones(length, length, dtype=torch.bool).triu(1)  # torch.nn: True = blocked


def torch_stacks(position: str, activation: str):
    pre = position == "pre"
    kw = dict(dropout=0.0, activation=activation, batch_first=True, norm_first=pre)
    encoder = nn.TransformerEncoder(
        nn.TransformerEncoderLayer(D, H, FF, **kw), N,
        norm=nn.LayerNorm(D) if pre else None, enable_nested_tensor=False,
    )
    decoder = nn.TransformerDecoder(
        nn.TransformerDecoderLayer(D, H, FF, **kw), N, norm=nn.LayerNorm(D) if pre else None
    )
    return encoder.to(F64), decoder.to(F64)


CASES = [(p, a) for p in ("post", "pre") for a in ("relu", "gelu")]


@pytest.mark.parametrize(("position", "activation"), CASES)
def test_encoder_and_decoder_match_torch_stacks(position, activation):
    torch.manual_seed(0)
    ref_encoder, ref_decoder = torch_stacks(position, activation)
    kw = dict(activation=activation, norm_position=position)
    cfg = LayerConfig(D, H, FF, **kw)
    encoder, decoder = Encoder(cfg, N).to(F64), Decoder(cfg, N).to(F64)
    copy_encoder(encoder, ref_encoder)
    copy_decoder(decoder, ref_decoder)
    src, tgt = randn(2, 6, D), randn(2, 4, D, seed=2)
    src_padding, tgt_padding = right_padding([6, 4], 6), right_padding([4, 3], 4)
    memory = encoder(src, padding_mask=src_padding)
    torch.testing.assert_close(
        memory, ref_encoder(src, src_key_padding_mask=src_padding), **FLOAT64_EXACT
    )
    expected = ref_decoder(
        tgt, memory, tgt_mask=torch_causal(4), tgt_key_padding_mask=tgt_padding,
        memory_key_padding_mask=src_padding,
    )
    got = decoder(tgt, memory, padding_mask=tgt_padding, memory_padding_mask=src_padding)
    torch.testing.assert_close(got, expected, **FLOAT64_EXACT)


def test_encoder_decoder_with_final_norms_matches_nn_transformer():
    """final_norm=True on a post-LN stack mirrors nn.Transformer's extra norms."""
    torch.manual_seed(0)
    ref = nn.Transformer(D, H, N, N, FF, dropout=0.0, batch_first=True).to(F64)
    ours = EncoderDecoder(
        Encoder(CFG, N, final_norm=True), Decoder(CFG, N, final_norm=True)
    ).to(F64)
    copy_encoder(ours.encoder, ref.encoder)
    copy_decoder(ours.decoder, ref.decoder)
    src, tgt = randn(2, 5, D), randn(2, 3, D, seed=2)
    src_padding = right_padding([5, 2], 5)
    expected = ref(
        src, tgt, tgt_mask=torch_causal(3), src_key_padding_mask=src_padding,
        memory_key_padding_mask=src_padding,
    )
    torch.testing.assert_close(
        ours(src, tgt, src_padding_mask=src_padding), expected, **FLOAT64_EXACT
    )


@pytest.mark.parametrize("stack", [Encoder, Decoder])
def test_layers_of_a_stack_are_initialised_independently(stack):
    model = stack(LayerConfig(D, H, FF), N)
    first, second = model.layers[0], model.layers[1]
    assert not torch.equal(first.self_attn.in_proj.weight, second.self_attn.in_proj.weight)
    assert not torch.equal(first.ff.w1.weight, second.ff.w1.weight)
    assert first.self_attn.in_proj.weight.data_ptr() != second.self_attn.in_proj.weight.data_ptr()


@pytest.mark.parametrize(
    ("position", "final_norm", "expected"),
    [
        ("post", None, NoNorm),  # post-LN already ends in a norm: never two in a row
        ("pre", None, LayerNorm),  # pre-LN's residual stream needs one at the end
        ("post", True, LayerNorm),  # explicitly mirroring nn.Transformer
        ("pre", False, NoNorm),
    ],
)
def test_final_norm_only_where_it_belongs(position, final_norm, expected):
    for stack in (Encoder, Decoder):
        model = stack(LayerConfig(D, H, FF, norm_position=position), N, final_norm=final_norm)
        assert type(model.norm) is expected


def test_encoder_output_of_a_sequence_is_the_same_alone_and_in_a_padded_batch():
    torch.manual_seed(0)
    encoder = Encoder(LayerConfig(D, H, FF, norm_position="pre"), N).eval()
    x = randn(3, 7, D, dtype=torch.float32)
    padding = right_padding([7, 4, 2], 7)
    batched = encoder(x, padding_mask=padding)
    for row, length in enumerate([7, 4, 2]):
        alone = encoder(x[row : row + 1, :length])
        # float32, two shapes so two kernel blockings: two float32 evaluations of one stack.
        torch.testing.assert_close(batched[row, :length], alone[0], **FLOAT32_MODEL)


def test_decoder_output_of_a_sequence_is_the_same_alone_and_in_a_padded_batch():
    torch.manual_seed(0)
    decoder = Decoder(LayerConfig(D, H, FF), N).eval()
    tgt, memory = randn(2, 5, D, dtype=torch.float32), randn(2, 6, D, seed=2, dtype=torch.float32)
    tgt_padding, memory_padding = right_padding([5, 3], 5), right_padding([6, 2], 6)
    batched = decoder(tgt, memory, padding_mask=tgt_padding, memory_padding_mask=memory_padding)
    alone = decoder(tgt[1:, :3], memory[1:, :2])
    torch.testing.assert_close(batched[1, :3], alone[0], **FLOAT32_MODEL)  # as above


def test_all_padding_source_row_gives_no_nan():
    torch.manual_seed(0)
    encoder, decoder = Encoder(LayerConfig(D, H, FF), N), Decoder(LayerConfig(D, H, FF), N)
    src, tgt = randn(2, 4, D, dtype=torch.float32), randn(2, 3, D, dtype=torch.float32)
    padding = torch.tensor([[True] * 4, [False, False, True, True]])
    memory = encoder(src, padding_mask=padding)
    out = decoder(tgt, memory, memory_padding_mask=padding)
    assert torch.isfinite(memory).all() and torch.isfinite(out).all()


def test_decoder_outputs_do_not_depend_on_future_target_positions():
    torch.manual_seed(0)
    decoder = Decoder(LayerConfig(D, H, FF, norm_position="pre"), N).to(F64)
    tgt, memory = randn(2, 6, D), randn(2, 3, D, seed=2)
    changed = tgt.clone()
    changed[:, 3:] = randn(2, 3, D, seed=5)
    torch.testing.assert_close(
        decoder(tgt, memory)[:, :3], decoder(changed, memory)[:, :3], atol=0, rtol=0
    )


@pytest.mark.parametrize("norm", ["layer", "group"])
def test_group_norm_lets_a_causal_stack_see_the_future_so_the_configs_refuse_it(norm):
    """Causality (an invariant) holds with LayerNorm, per-token statistics, and fails with
    GroupNorm, whose statistics pool every position of a row; hence TransformerConfig and
    LMConfig refuse norm="group" (tests/test_config.py)."""
    torch.manual_seed(0)
    d = 32  # GroupNorm's default n_groups is 32
    encoder = Encoder(LayerConfig(d, H, FF, norm=norm), N).to(F64)
    x = randn(2, 6, d)
    changed = x.clone()
    changed[:, 3:] = randn(2, 3, d, seed=5)
    leak = (encoder(x, causal=True)[:, :3] - encoder(changed, causal=True)[:, :3]).abs().max()
    # GroupNorm's leak is O(1) (2.8 measured), float64 rounding ~1e-15: 1e-3 splits them.
    assert (leak == 0) if norm == "layer" else (leak > 1e-3)


@examples(15)
@given(seed=st.integers(0, 2**16), length=st.integers(2, 6))
def test_encoder_without_positions_is_permutation_equivariant(seed, length):
    torch.manual_seed(0)
    encoder = Encoder(LayerConfig(D, H, FF), N).to(F64)
    x = randn(2, length, D, seed=seed)
    perm = torch.randperm(length, generator=torch.Generator().manual_seed(seed))
    torch.testing.assert_close(encoder(x[:, perm]), encoder(x)[:, perm], **FLOAT64_EXACT)


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda m: m(randn(2, 5, D), randn(3, 4, D)), ValueError,
         r"src batch size \(2\) must equal tgt batch size \(3\)"),
        (lambda m: m(randn(2, 5, 8), randn(2, 4, D)), ValueError, r"src last dim must be 16"),
        (lambda m: m.decoder(randn(2, 4, D), randn(2, 5, 8)), ValueError,
         r"memory last dim must be 16"),
        (lambda m: m.decoder(randn(2, 4, D), randn(3, 5, D)), ValueError,
         r"memory batch size \(3\) must equal x batch size \(2\)"),
        (lambda m: m.encoder(randn(2, 4, D), padding_mask=torch.zeros(2, 5, dtype=torch.bool)),
         ValueError, r"padding_mask .* must have shape \(2, 4\), got \(2, 5\)"),
        (lambda m: m.encoder(randn(2, 4, D), cache=[]), TypeError, r"DecodingCache"),
        (lambda m: EncoderDecoder(m.encoder, Decoder(LayerConfig(8, H, FF), N)), ValueError,
         r"encoder d_model \(16\) must equal decoder d_model \(8\)"),
        (lambda m: Encoder(LayerConfig(D, H, FF), 0), ValueError, r"n_layers must be >= 1, got 0"),
        (lambda m: Decoder(CFG, N, final_norm="yes"), TypeError, r"final_norm must be"),
        (lambda m: m.decoder(randn(2, 1, D), randn(2, 5, D),
                             memory_padding_mask=torch.zeros(2, 5, dtype=torch.bool),
                             memory_mask=memory_attention_mask(randn(2, 5, D), None)),
         ValueError, r"give memory_padding_mask or a built memory_mask, not both"),
    ],
)
def test_bad_inputs_raise_naming_the_values(call, error, match):
    torch.manual_seed(0)
    model = EncoderDecoder(Encoder(CFG, N), Decoder(CFG, N)).to(F64)
    with pytest.raises(error, match=match):
        call(model)


@examples(10)
@given(lengths=st.lists(st.integers(0, 6), min_size=1, max_size=3), new=st.integers(1, 3))
def test_a_memory_mask_built_ahead_gives_what_the_memory_padding_gives(lengths, new):
    # Identity: a decoding cache builds the memory's mask once, from the same padding the
    # decoder would build it from (rows of no real token included: they see no key).
    torch.manual_seed(0)
    decoder = Decoder(CFG, N).to(F64).eval()
    tgt, memory = randn(len(lengths), new, D), randn(len(lengths), 6, D, seed=2)
    padding = right_padding(lengths, 6)
    built = decoder(tgt, memory, memory_mask=memory_attention_mask(memory, padding))
    assert torch.equal(built, decoder(tgt, memory, memory_padding_mask=padding))
