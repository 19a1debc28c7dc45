"""Vocabularies without a padding token, the embedding scale, and ties that survive meta-device
initialisation, ``load_state_dict(assign=True)`` and safetensors.

Oracles: identities (the same weights with an explicit all-False padding mask; the embedding
table itself, times sqrt(D) or not; ``is`` for shared Parameters; outputs of the model the
weights came from).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from safetensors.torch import load_file, load_model, save_file, save_model
from tolerances import FLOAT64_EXACT

from addnorm.pretrained.mixin import state_dict_without_aliases
from addnorm.transformer import Transformer, TransformerLM
from addnorm.transformer.config import LMConfig, TransformerConfig
from addnorm.transformer.embedding import Embedder

V = 19
LM = LMConfig(vocab_size=V, d_model=16, n_heads=2, n_layers=2, d_ff=32, dropout=0.0, max_len=32)
SEQ2SEQ = TransformerConfig(
    src_vocab_size=V, tgt_vocab_size=V, d_model=16, n_heads=2, n_encoder_layers=1,
    n_decoder_layers=1, d_ff=32, dropout=0.0, max_len=32,
)


def lm(cfg: LMConfig = LM, seed: int = 0) -> TransformerLM:
    torch.manual_seed(seed)
    return TransformerLM(cfg).eval()


def ids_with_zeros() -> torch.Tensor:
    ids = torch.randint(1, V, (2, 7), generator=torch.Generator().manual_seed(3))
    ids[0, 2] = ids[1, 5] = 0  # GPT-2's token 0 is "!", a real token
    return ids


# ---------------------------------------------------------------------------- pad_id None


def test_pad_id_none_treats_every_id_as_a_real_token():
    model = lm(dataclasses.replace(LM, pad_id=None))
    ids = ids_with_zeros()
    no_padding = torch.zeros_like(ids, dtype=torch.bool)
    torch.testing.assert_close(model(ids), model(ids, padding_mask=no_padding), rtol=0, atol=0)


def test_pad_id_zero_masks_token_zero_that_pad_id_none_keeps():
    padded, unpadded = lm(LM).double(), lm(dataclasses.replace(LM, pad_id=None)).double()
    unpadded.load_state_dict(padded.state_dict())  # the same weights; float64: exact claim
    ids = ids_with_zeros()
    assert not torch.allclose(padded(ids)[0, 3:], unpadded(ids)[0, 3:])
    mask = ids == 0
    torch.testing.assert_close(padded(ids, padding_mask=mask), unpadded(ids, padding_mask=mask),
                               **FLOAT64_EXACT)


def test_pad_id_none_still_takes_an_explicit_padding_mask():
    model = lm(dataclasses.replace(LM, pad_id=None)).double()  # float64: the claim is exact
    ids = ids_with_zeros()
    mask = torch.zeros_like(ids, dtype=torch.bool)
    mask[1, 5:] = True  # right padding: the real tokens' logits are those of the row alone
    torch.testing.assert_close(model(ids, padding_mask=mask)[1, :5], model(ids[1:, :5])[0],
                               **FLOAT64_EXACT)


def test_pad_id_none_config_validates_and_round_trips():
    cfg = dataclasses.replace(LM, pad_id=None, bos_id=0, eos_id=0)
    assert LMConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match=r"pad_id \(19\) must be < vocab_size \(19\)"):
        dataclasses.replace(LM, pad_id=V)


def test_generation_may_emit_token_zero_without_a_pad_id():
    cfg = dataclasses.replace(LM, pad_id=None, tie_output=False, eos_id=2)
    model = lm(cfg)
    with torch.no_grad():  # every hidden state becomes the final norm's bias, favouring id 0
        model.blocks.norm.weight.zero_()
        model.blocks.norm.bias.copy_(torch.linspace(-1, 1, cfg.d_model))
        model.to_logits.weight.zero_()
        model.to_logits.weight[0] = model.blocks.norm.bias
    config = dataclasses.replace(model.generation_config, max_new_tokens=3)
    out = model.generate(torch.tensor([[5, 6]]), config)
    assert out.tolist() == [[0, 0, 0]]


# ----------------------------------------------------------------------- embedding scale


@pytest.mark.parametrize(("scale", "factor"), [("sqrt_d_model", 4.0), ("none", 1.0)])
def test_embed_scale_multiplies_the_table_by_sqrt_d_or_nothing(scale: str, factor: float):
    cfg = dataclasses.replace(LM, position_encoding="none", embed_scale=scale)  # D = 16
    embed = Embedder(V, cfg).eval()
    ids = ids_with_zeros()
    torch.testing.assert_close(embed(ids, None), embed.tokens.weight[ids] * factor, rtol=0, atol=0)


def test_embed_scale_is_checked_and_defaults_to_the_paper():
    assert LM.embed_scale == "sqrt_d_model" and SEQ2SEQ.embed_scale == "sqrt_d_model"
    with pytest.raises(ValueError, match="embed_scale must be one of"):
        dataclasses.replace(LM, embed_scale="sqrt")


# ------------------------------------------------------------------------------- ties


def test_to_empty_unties_and_tie_weights_ties_again():
    with torch.device("meta"):
        model = TransformerLM(LM)
    model.to_empty(device="cpu")
    assert model.to_logits.weight is not model.embed.tokens.weight  # the defect tie_weights fixes
    model.tie_weights()
    assert model.to_logits.weight is model.embed.tokens.weight


def test_assign_load_unties_and_tie_weights_restores_the_source_model():
    source, target = lm(seed=0), lm(seed=1)
    target.load_state_dict(source.state_dict(), assign=True)
    target.tie_weights()
    assert target.to_logits.weight is target.embed.tokens.weight
    ids = ids_with_zeros()
    torch.testing.assert_close(target(ids), source(ids), rtol=0, atol=0)


def test_transformer_tie_weights_restores_shared_tables_and_output():
    with torch.device("meta"):
        model = Transformer(SEQ2SEQ)
    model.to_empty(device="cpu")
    model.tie_weights()
    assert model.tgt_embed.tokens is model.src_embed.tokens
    assert model.to_logits.weight is model.tgt_embed.tokens.weight


def test_tie_weights_leaves_an_untied_model_untied():
    model = lm(dataclasses.replace(LM, tie_output=False))
    model.tie_weights()
    assert model.to_logits.weight is not model.embed.tokens.weight


def test_save_file_needs_the_aliases_dropped_and_loads_back_tied(tmp_path):
    model = lm()
    with pytest.raises(RuntimeError, match="share memory"):
        save_file(model.state_dict(), tmp_path / "raw.safetensors")
    state = state_dict_without_aliases(model)
    assert "to_logits.weight" not in state and "embed.tokens.weight" in state
    save_file(state, tmp_path / "model.safetensors")
    restored = lm(seed=1)
    result = restored.load_state_dict(load_file(tmp_path / "model.safetensors"), strict=False)
    assert result.missing_keys == ["to_logits.weight"] and result.unexpected_keys == []
    restored.tie_weights()
    ids = ids_with_zeros()
    torch.testing.assert_close(restored(ids), model(ids), rtol=0, atol=0)


def test_safetensors_save_model_keeps_the_tie(tmp_path):
    model = lm()
    save_model(model, tmp_path / "model.safetensors")
    restored = lm(seed=1)
    load_model(restored, tmp_path / "model.safetensors")
    assert restored.to_logits.weight is restored.embed.tokens.weight
    ids = ids_with_zeros()
    torch.testing.assert_close(restored(ids), model(ids), rtol=0, atol=0)
