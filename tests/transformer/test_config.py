"""TransformerConfig, LMConfig and PRESETS: the paper's numbers, JSON round trips, and clear
errors for every bad value."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import fields, replace

import pytest

from addnorm.transformer.config import PRESETS, LayerConfig, LMConfig, TransformerConfig


def test_base_preset_is_the_papers_base_model():
    """Vaswani et al. (2017), Table 3, row "base"; post-LN as in section 3.1."""
    base = PRESETS["base"]
    assert isinstance(base, TransformerConfig)
    assert (base.n_encoder_layers, base.n_decoder_layers) == (6, 6)
    assert (base.d_model, base.n_heads, base.d_ff, base.dropout) == (512, 8, 2048, 0.1)
    assert (base.norm_position, base.activation) == ("post", "relu")
    assert base.position_encoding == "sinusoidal"


@pytest.mark.parametrize(
    ("name", "d_model", "layers", "n_heads", "d_ff"),
    [("tiny", 64, 2, 4, 256), ("small", 128, 3, 4, 512)],  # the presets' documented sizes
)
def test_cpu_presets_have_the_issue_sizes(name, d_model, layers, n_heads, d_ff):
    cfg = PRESETS[name]
    assert (cfg.d_model, cfg.n_encoder_layers, cfg.n_decoder_layers) == (d_model, layers, layers)
    assert (cfg.n_heads, cfg.d_ff) == (n_heads, d_ff)


def test_lm_config_defaults_to_pre_ln():
    assert LMConfig().norm_position == "pre"


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_round_trips_through_json(name):
    cfg = PRESETS[name]
    restored = type(cfg).from_dict(json.loads(json.dumps(cfg.to_dict())))
    assert restored == cfg


def test_from_dict_refuses_unknown_keys_naming_them():
    data = PRESETS["tiny"].to_dict() | {"n_layer": 3}
    with pytest.raises(ValueError, match=r"unknown TransformerConfig keys \['n_layer'\]"):
        TransformerConfig.from_dict(data)


def test_configs_are_frozen_and_replace_validates_again():
    cfg = PRESETS["tiny"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.d_model = 32  # type: ignore[misc]
    with pytest.raises(ValueError, match=r"d_model \(64\) must be divisible by n_heads \(3\)"):
        dataclasses.replace(cfg, n_heads=3)


@pytest.mark.parametrize(
    ("changes", "error", "match"),
    [
        (dict(d_model=510), ValueError, r"d_model \(510\) must be divisible by n_heads \(8\)"),
        (dict(dropout=1.0), ValueError, r"dropout must be in \[0, 1\), got 1.0"),
        (dict(dropout=-0.1), ValueError, r"dropout must be >= 0.0, got -0.1"),
        (dict(norm="batchnorm"), ValueError, r"norm must be one of .*got 'batchnorm'"),
        (dict(position_encoding="alibi"), ValueError,
         r"position_encoding must be one of .*got 'alibi'"),
        (dict(activation="tanh"), ValueError, r"activation must be one of .*got 'tanh'"),
        (dict(norm_position="middle"), ValueError, r"norm_position must be one of"),
        (dict(d_model=24, n_heads=8, position_encoding="rotary"), ValueError,
         r"rotary' needs an even d_head; d_model \(24\) / n_heads \(8\) = 3"),
        (dict(src_vocab_size=0), ValueError, r"src_vocab_size must be >= 1, got 0"),
        (dict(src_vocab_size=100, tgt_vocab_size=200), ValueError,
         r"share_embeddings needs equal vocab sizes, got src_vocab_size \(100\) and "
         r"tgt_vocab_size \(200\)"),
        (dict(pad_id=37000), ValueError, r"pad_id \(37000\) must be < src_vocab_size \(37000\)"),
        (dict(eos_id=-1), ValueError, r"eos_id must be >= 0, got -1"),
        (dict(share_embeddings=False, tgt_vocab_size=2), ValueError,
         r"eos_id \(2\) must be < tgt_vocab_size \(2\)"),
        (dict(max_len=0), ValueError, r"max_len must be >= 1, got 0"),
        (dict(n_heads=8.0), TypeError, r"n_heads must be an int, got float"),
        (dict(final_norm="yes"), TypeError, r"final_norm must be a bool or None"),
    ],
)
def test_bad_transformer_config_values_raise_naming_them(changes, error, match):
    with pytest.raises(error, match=match):
        TransformerConfig(**changes)


@pytest.mark.parametrize(
    ("changes", "error", "match"),
    [
        (dict(vocab_size=2), ValueError, r"eos_id \(2\) must be < vocab_size \(2\)"),
        (dict(n_layers=0), ValueError, r"n_layers must be >= 1, got 0"),
        (dict(d_model=100, n_heads=3), ValueError, r"d_model \(100\) must be divisible by n_heads"),
        (dict(tie_output=1), TypeError, r"tie_output must be a bool"),
    ],
)
def test_bad_lm_config_values_raise_naming_them(changes, error, match):
    with pytest.raises(error, match=match):
        LMConfig(**changes)


@pytest.mark.parametrize("config", [TransformerConfig, LMConfig])
def test_group_norm_is_refused_because_a_causal_decoder_would_see_the_future(config):
    """GroupNorm pools statistics over all positions of a row; both models have a causal
    decoder (the encoder-decoder shares one norm field between its stacks), so it is refused.
    tests/test_stacks.py shows the leak it would cause."""
    with pytest.raises(ValueError, match=rf"norm='group' is refused by {config.__name__}: "
                                         r"GroupNorm's statistics span positions"):
        config(norm="group")


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        (dict(pad_id=1, bos_id=1), r"pad_id \(1\) must differ from bos_id \(1\)"),
        (dict(pad_id=2, eos_id=2), r"pad_id \(2\) must differ from eos_id \(2\)"),
        (dict(bos_id=2, eos_id=2), r"bos_id \(2\) must differ from eos_id \(2\): generation "
                                   r"never emits bos_id"),
    ],
)
def test_transformer_special_ids_must_all_differ(changes, match):
    with pytest.raises(ValueError, match=match):
        TransformerConfig(**changes)


def test_lm_pad_id_must_differ_from_bos_and_eos_but_bos_may_equal_eos():
    """bos == eos is GPT-2's one <|endoftext|> separator; the LM never masks bos_id."""
    with pytest.raises(ValueError, match=r"pad_id \(1\) must differ from bos_id \(1\)"):
        LMConfig(pad_id=1)
    with pytest.raises(ValueError, match=r"pad_id \(0\) must differ from eos_id \(0\)"):
        LMConfig(eos_id=0)
    assert LMConfig(bos_id=2, eos_id=2).bos_id == 2


def test_a_config_saved_with_the_old_positions_key_still_loads():
    """Checkpoints written before the rename store ``positions``; from_dict maps it."""
    data = PRESETS["tiny"].to_dict()
    data["positions"] = data.pop("position_encoding")
    assert TransformerConfig.from_dict(data) == PRESETS["tiny"]


def test_layer_config_carries_the_model_configs_layer_settings():
    cfg = replace(PRESETS["lm-tiny"], norm="rms", dropout=0.25, activation="swiglu")
    layer = cfg.layer_config()
    assert isinstance(layer, LayerConfig) and layer.d_head == cfg.d_model // cfg.n_heads
    shared = {f.name for f in fields(LayerConfig)}
    assert {n: getattr(layer, n) for n in shared} == {n: getattr(cfg, n) for n in shared}
