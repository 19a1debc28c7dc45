"""EncoderModel (the BERT family), its input layer, and mean pooling.

Oracles: invariants (padding, permutation without positions, non-causality, the default
token type), ``F.layer_norm`` on the summed tables for the input layer, per-row slicing for
mean pooling, and the eager model for compiled and exported graphs. Parity with Hugging
Face's BertModel on the same weights is in ``test_transformers_interop.py``.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from tolerances import FLOAT32_MODEL, FLOAT32_ROUNDED, FLOAT64_EXACT

from addnorm.transformer.encoder_model import EncoderConfig, EncoderModel, mean_pool

V, PAD = 23, 0
CFG = EncoderConfig(
    vocab_size=V, d_model=16, n_heads=2, n_layers=2, d_ff=32, dropout=0.0, max_len=16,
    n_token_types=2, pooler=True,
)


def model(cfg: EncoderConfig = CFG) -> EncoderModel:
    torch.manual_seed(0)
    return EncoderModel(cfg).eval()


def ids(batch: int = 3, length: int = 6) -> torch.Tensor:
    return torch.randint(1, V, (batch, length), generator=torch.Generator().manual_seed(1))


def test_a_right_padded_row_gives_the_states_of_the_row_alone():
    m, x = model().double(), ids()  # float64: the invariance is exact
    x[1, 4:] = PAD
    torch.testing.assert_close(m(x)[1, :4], m(x[1:2, :4])[0], **FLOAT64_EXACT)


def test_every_token_sees_the_whole_sequence():
    m, x = model(), ids()
    changed = x.clone()
    changed[:, -1] = (x[:, -1] % (V - 1)) + 1  # another real token
    assert not torch.allclose(m(x)[:, 0], m(changed)[:, 0])


def test_without_positions_permuting_tokens_permutes_states():
    m = model(dataclasses.replace(CFG, position_encoding="none")).double()  # exact: float64
    x, order = ids(), torch.tensor([3, 0, 5, 1, 4, 2])
    torch.testing.assert_close(m(x[:, order]), m(x)[:, order], **FLOAT64_EXACT)


def test_token_types_default_to_type_zero():
    m, x = model(), ids()
    torch.testing.assert_close(m(x), m(x, token_type_ids=torch.zeros_like(x)), rtol=0, atol=0)
    assert not torch.allclose(m(x), m(x, token_type_ids=torch.ones_like(x)))


def test_input_layer_is_the_norm_of_the_summed_tables():
    m, x = model().double(), ids()  # float64: the same formula, summed in any order
    types = torch.randint(0, 2, x.shape, generator=torch.Generator().manual_seed(2))
    e = m.embed
    positions = e.pos_enc.embedding.weight[: x.shape[1]]
    summed = e.tokens.weight[x] + positions + e.token_types.weight[types]
    expected = F.layer_norm(summed, (CFG.d_model,), e.norm.weight, e.norm.bias, CFG.norm_eps)
    torch.testing.assert_close(e(x, None, token_type_ids=types), expected, **FLOAT64_EXACT)


def test_mean_pool_averages_each_rows_real_tokens():
    hidden = torch.randn(3, 5, 4, generator=torch.Generator().manual_seed(0))
    padding = torch.tensor([[False] * 5, [False, False, True, True, True], [True] * 5])
    pooled = mean_pool(hidden, padding)
    # Means of <= 5 unit-scale float32 terms, summed in any order: a few roundings.
    torch.testing.assert_close(pooled[0], hidden[0].mean(0), **FLOAT32_ROUNDED)
    torch.testing.assert_close(pooled[1], hidden[1, :2].mean(0), **FLOAT32_ROUNDED)
    torch.testing.assert_close(pooled[2], torch.zeros(4), rtol=0, atol=0)  # all padding
    torch.testing.assert_close(mean_pool(hidden), hidden.mean(1), **FLOAT32_ROUNDED)


def test_mean_pool_refuses_a_mask_of_another_shape():
    with pytest.raises(ValueError, match=r"padding_mask \(True = padding\) must have shape"):
        mean_pool(torch.zeros(2, 3, 4), torch.zeros(2, 4, dtype=torch.bool))


def test_pooler_reads_the_first_token():
    m, x = model(), ids()
    h = m(x)
    changed = h.clone()
    changed[:, 1:] = 0.0
    torch.testing.assert_close(m.pooler(h), m.pooler(changed), rtol=0, atol=0)


def test_bad_token_types_are_refused_naming_the_problem():
    m, x = model(), ids()
    with pytest.raises(ValueError, match=r"token_type_ids contains id 2 outside .*\[0, 2\)"):
        m(x, token_type_ids=torch.full_like(x, 2))
    with pytest.raises(ValueError, match="token_type_ids must have the shape of ids"):
        m(x, token_type_ids=torch.zeros_like(x[:, :2]))
    no_types = model(dataclasses.replace(CFG, n_token_types=0))
    with pytest.raises(ValueError, match="n_token_types=0"):
        no_types(x, token_type_ids=torch.zeros_like(x))


def test_config_is_validated_and_round_trips():
    assert EncoderConfig.from_dict(CFG.to_dict()) == CFG
    with pytest.raises(ValueError, match=r"pad_id \(23\) must be < vocab_size \(23\)"):
        dataclasses.replace(CFG, pad_id=V)
    with pytest.raises(ValueError, match="n_token_types must be >= 0"):
        dataclasses.replace(CFG, n_token_types=-1)
    with pytest.raises(TypeError, match="cfg must be an EncoderConfig"):
        EncoderModel(CFG.to_dict())  # type: ignore[arg-type]


def test_pad_id_none_counts_every_token_as_real():
    m = model(dataclasses.replace(CFG, pad_id=None)).double()  # float64: the claim is exact
    x = ids()
    x[0, 2] = 0
    no_padding = torch.zeros_like(x, dtype=torch.bool)
    torch.testing.assert_close(m(x), m(x, padding_mask=no_padding), **FLOAT64_EXACT)


def padded_inputs() -> tuple[torch.Tensor, torch.Tensor]:
    x = ids()
    x[1, 4:] = PAD
    return x, torch.randint(0, 2, x.shape, generator=torch.Generator().manual_seed(2))


def test_compiles_fullgraph_with_the_eager_outputs():
    m, (x, types) = model(), padded_inputs()
    compiled = torch.compile(m, fullgraph=True, backend="eager")
    expected = m(x, token_type_ids=types)
    torch.testing.assert_close(compiled(x, token_type_ids=types), expected, **FLOAT32_MODEL)


def test_exports_with_the_eager_outputs():
    m, (x, types) = model(), padded_inputs()
    program = torch.export.export(m, (x,), {"token_type_ids": types})
    expected = m(x, token_type_ids=types)
    torch.testing.assert_close(program.module()(x, token_type_ids=types), expected,
                               **FLOAT32_MODEL)  # a float32 graph of the same model


def test_save_pretrained_and_from_pretrained_give_back_the_model(tmp_path):
    m, x = model(), ids()
    m.save_pretrained(tmp_path / "encoder")
    restored = EncoderModel.from_pretrained(tmp_path / "encoder")
    assert restored.cfg == CFG and not restored.training
    torch.testing.assert_close(restored(x), m(x), rtol=0, atol=0)
