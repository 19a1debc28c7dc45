"""Unpadding (``Encoder(unpad=True)``, ``TransformerConfig.unpad``, ``EncoderConfig.unpad``).

Oracle: the same stack run on the padded batch (``unpad=False``, same weights). Every layer
but attention acts on each token alone, so the real tokens' outputs and every gradient must
agree to float64 rounding, and the padding positions of an unpadded output are zero.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from tolerances import FLOAT64_EXACT

from addnorm.attention import MultiHeadAttention, self_attention_mask
from addnorm.attention_mask import packed_mask
from addnorm.cache import KVCache
from addnorm.generation.config import GenerationConfig
from addnorm.packing import Packing
from addnorm.rotary import RotaryEmbedding
from addnorm.transformer.config import PRESETS, LayerConfig, TransformerConfig
from addnorm.transformer.encoder_decoder import Transformer
from addnorm.transformer.encoder_model import EncoderConfig, EncoderModel, mean_pool
from addnorm.transformer.stacks import Encoder

F64 = torch.float64  # every comparison is float64 (the export test casts): FLOAT64_EXACT
D, H, FF = 16, 4, 32
PADDING = torch.tensor([
    [0, 0, 0, 0, 0, 0, 0],  # no padding
    [0, 0, 0, 0, 1, 1, 1],  # right padding
    [1, 1, 0, 0, 0, 0, 0],  # left padding
]).bool()


def twins(cfg: LayerConfig, *, rotary: bool = True) -> tuple[Encoder, Encoder]:
    torch.manual_seed(0)
    rope = RotaryEmbedding(cfg.d_head) if rotary else None
    padded = Encoder(cfg, 2, rotary=rope).double()
    unpadded = Encoder(cfg, 2, rotary=rope, unpad=True).double()
    unpadded.load_state_dict(padded.state_dict())
    return padded, unpadded


@pytest.mark.parametrize("norm", ["layer", "rms", "batch"])
@pytest.mark.parametrize("norm_position", ["post", "pre"])
def test_unpadded_encoder_equals_padded_at_real_tokens_with_gradients(norm, norm_position):
    cfg = LayerConfig(D, H, FF, norm=norm, norm_position=norm_position)
    padded, unpadded = twins(cfg)
    x = torch.randn(3, 7, D, dtype=F64, requires_grad=True)
    real = ~PADDING[..., None]  # (B, L, 1)
    outputs = [model(x, padding_mask=PADDING) for model in (padded, unpadded)]
    torch.testing.assert_close(outputs[1] * real, outputs[0] * real, **FLOAT64_EXACT)
    assert not outputs[1].masked_select(~real).any()  # zeros at padding
    grads = [
        torch.autograd.grad((out * real).square().sum(), [x, *model.parameters()])
        for out, model in zip(outputs, (padded, unpadded), strict=True)
    ]
    for want, got in zip(*grads, strict=True):
        torch.testing.assert_close(got, want, **FLOAT64_EXACT)
    if norm == "batch":  # the running statistics saw the same real tokens
        for a, b in zip(padded.buffers(), unpadded.buffers(), strict=True):
            torch.testing.assert_close(a, b, **FLOAT64_EXACT)


def test_a_real_query_that_sees_no_key_is_zero_on_both_paths():
    padded, unpadded = twins(LayerConfig(D, H, FF), rotary=False)
    attend = torch.ones(7, 7, dtype=torch.bool)
    attend[4] = False  # query 4 may attend nowhere: a dead row
    x = torch.randn(3, 7, D, dtype=F64)
    with torch.no_grad():
        got = unpadded(x, padding_mask=PADDING, attend_mask=attend)
        want = padded(x, padding_mask=PADDING, attend_mask=attend)
    real = ~PADDING[..., None]
    torch.testing.assert_close(got * real, want * real, **FLOAT64_EXACT)
    assert got.isfinite().all()


def test_every_layer_sees_the_packed_row_and_no_padding_means_no_packing():
    _, unpadded = twins(LayerConfig(D, H, FF))
    shapes = []
    for layer in unpadded.layers:
        layer.register_forward_hook(lambda module, args, out: shapes.append(tuple(out.shape)))
    x = torch.randn(3, 7, D, dtype=F64)
    unpadded(x, padding_mask=PADDING)
    unpadded(x[:1], padding_mask=PADDING[:1])  # nothing to leave out: padded layout
    n_real = int((~PADDING).sum())
    assert shapes == [(1, n_real, D)] * 2 + [(1, 7, D)] * 2


def test_compiled_encoder_gives_the_packed_paths_values_everywhere(fresh_dynamo):
    _, unpadded = twins(LayerConfig(D, H, FF))
    x = torch.randn(3, 7, D, dtype=F64)
    want = unpadded(x, padding_mask=PADDING)
    compiled = torch.compile(unpadded, fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(x, padding_mask=PADDING), want, **FLOAT64_EXACT)


def test_a_packed_mask_is_refused_with_a_cache_or_a_memory():
    attention = MultiHeadAttention(D, H).double()
    x = torch.randn(1, 5, D, dtype=F64)
    padded_x = torch.randn(2, 3, D, dtype=F64)
    padding = torch.tensor([[0, 0, 1], [0, 0, 0]]).bool()
    mask = self_attention_mask(padded_x, n_heads=H, padding_mask=padding)
    mask = packed_mask(mask, Packing.from_padding(padding))
    with pytest.raises(ValueError, match="uncached self-attention only"):
        attention(x, mask=mask, cache=KVCache(2, H, 8, D // H, dtype=F64))
    with pytest.raises(ValueError, match="uncached self-attention only"):
        attention(x, x, mask=mask)


def test_unpad_is_refused_with_group_norm_and_must_be_a_bool():
    with pytest.raises(ValueError, match="norm='group'"):
        Encoder(LayerConfig(D, H, FF, norm="group"), 1, unpad=True)
    with pytest.raises(ValueError, match="norm='group'"):
        EncoderConfig(norm="group", unpad=True)
    with pytest.raises(TypeError, match="unpad"):
        TransformerConfig(unpad="yes")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="unpad"):
        Encoder(LayerConfig(D, H, FF), 1, unpad=1)  # type: ignore[arg-type]


def test_unpadded_transformer_gives_the_same_logits_and_translations():
    base = dataclasses.replace(PRESETS["tiny"], dropout=0.0, position_encoding="rotary")
    torch.manual_seed(0)
    padded = Transformer(base).double().eval()
    unpadded = Transformer(dataclasses.replace(base, unpad=True)).double().eval()
    unpadded.load_state_dict(padded.state_dict())
    src = torch.randint(3, 128, (3, 7)).masked_fill(PADDING, 0)
    tgt = torch.randint(3, 128, (3, 5))
    with torch.no_grad():
        torch.testing.assert_close(unpadded(src, tgt), padded(src, tgt), **FLOAT64_EXACT)
    for beams in (1, 3):  # greedy, and beam search (its memory is repeated per beam)
        config = GenerationConfig(max_new_tokens=6, num_beams=beams)
        assert torch.equal(unpadded.generate(src, config), padded.generate(src, config))


def test_unpadded_encoder_model_gives_the_same_sentence_embeddings():
    cfg = EncoderConfig(vocab_size=50, d_model=D, n_heads=H, n_layers=2, d_ff=FF, dropout=0.0)
    torch.manual_seed(0)
    padded = EncoderModel(cfg).double().eval()
    unpadded = EncoderModel(dataclasses.replace(cfg, unpad=True)).double().eval()
    unpadded.load_state_dict(padded.state_dict())
    ids = torch.randint(1, 50, (3, 7)).masked_fill(PADDING, 0)
    with torch.no_grad():
        embeddings = [mean_pool(model(ids), PADDING) for model in (padded, unpadded)]
    torch.testing.assert_close(embeddings[1], embeddings[0], **FLOAT64_EXACT)


@pytest.mark.parametrize("shared", [True, False])
def test_explicit_rotary_positions_are_packed_with_their_tokens(shared):
    padded, unpadded = twins(LayerConfig(D, H, FF))
    x = torch.randn(3, 7, D, dtype=F64)
    # not arange plus a shift, which rotary would not see (it depends on offsets only)
    gen = torch.Generator().manual_seed(0)
    positions = torch.randint(0, 20, (7,) if shared else (3, 7), generator=gen)
    real = ~PADDING[..., None]
    with torch.no_grad():
        want = padded(x, padding_mask=PADDING, positions=positions)
        got = unpadded(x, padding_mask=PADDING, positions=positions)
        default = unpadded(x, padding_mask=PADDING)
    torch.testing.assert_close(got * real, want * real, **FLOAT64_EXACT)
    assert not torch.allclose(got * real, default * real)  # the positions did matter


def test_an_unpadded_transformer_exports_with_the_eager_outputs():
    """Export traces the padded path (the packed shape depends on the data), which zeroes the
    encoder's padding positions as the packed path does."""
    cfg = dataclasses.replace(PRESETS["tiny"], dropout=0.0, position_encoding="rotary",
                              unpad=True)
    torch.manual_seed(0)
    model = Transformer(cfg).double().eval()  # float64: the same function, two paths
    src = torch.randint(3, 128, (3, 7)).masked_fill(PADDING, 0)
    tgt = torch.randint(3, 128, (3, 5))
    program = torch.export.export(model, (src, tgt))
    torch.testing.assert_close(program.module()(src, tgt), model(src, tgt), **FLOAT64_EXACT)
