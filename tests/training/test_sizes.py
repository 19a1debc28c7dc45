"""``addnorm.training.sizes``: estimates from a config, made before anything is allocated.

Provenance: parameter and buffer counts are compared with the models built from the same
configs (``sum(p.numel())``); the byte estimates with their own definition (four float32
copies of the weights at least).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from addnorm.dit import DIT_PRESETS, DiT
from addnorm.family import ActivationShape
from addnorm.training.sizes import (
    SizeError,
    check_model_fits,
    largest_setting,
    training_bytes,
)
from addnorm.transformer import Transformer, TransformerLM
from addnorm.transformer.config import PRESETS
from addnorm.transformer.encoder_model import EncoderConfig, EncoderModel

TINY, LM = PRESETS["tiny"], PRESETS["lm-tiny"]
ENCODER = EncoderConfig(vocab_size=100, d_model=32, n_heads=4, n_layers=2, d_ff=64, max_len=64)
CONFIGS = [
    TINY,
    dataclasses.replace(TINY, share_embeddings=False, src_vocab_size=50, tie_output=False,
                        position_encoding="learned", activation="swiglu", norm_position="pre"),
    dataclasses.replace(TINY, position_encoding="rotary"),
    LM,
    dataclasses.replace(LM, tie_output=False, position_encoding="learned"),
    DIT_PRESETS["DiT-digits"],
    dataclasses.replace(DIT_PRESETS["DiT-digits"], learn_sigma=False, n_layers=1),
    ENCODER,
    dataclasses.replace(ENCODER, pooler=True, position_encoding="rotary", n_token_types=0,
                        embed_norm=False, norm_position="pre"),
    dataclasses.replace(ENCODER, position_encoding="sinusoidal", activation="swiglu"),
]


def build(cfg):
    if isinstance(cfg, type(TINY)):
        return Transformer(cfg)
    if isinstance(cfg, EncoderConfig):
        return EncoderModel(cfg)
    return TransformerLM(cfg) if isinstance(cfg, type(LM)) else DiT(cfg)


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: type(c).__name__)
def test_counts_match_the_built_model_within_2_percent(cfg):
    model = build(cfg)
    built = sum(p.numel() for p in model.parameters())
    # Integer counts, no rounding: the estimate skips a few small terms (<= 0.3% measured).
    assert abs(cfg.count_parameters() - built) <= 0.02 * built
    assert cfg.count_buffers() == sum(b.numel() for b in model.buffers())


def test_counts_of_huge_configs_build_nothing(monkeypatch):
    """The counts are arithmetic on the config: no module is built, no tensor allocated."""

    def refuse(*args, **kwargs):
        raise AssertionError("counting a config built a module")

    huge = dataclasses.replace(TINY, d_ff=10**11, n_encoder_layers=10**5)
    monkeypatch.setattr(torch.nn.Module, "__init__", refuse)
    assert huge.count_parameters() > 10**5 * 2 * 64 * 10**11
    assert huge.count_buffers() >= 0


def test_training_needs_at_least_weights_grads_and_two_adam_moments():
    params = TINY.count_parameters()
    plain = training_bytes(TINY, batch_size=1, length=1, ema=False)
    assert plain >= 4 * 4 * params
    assert training_bytes(TINY, batch_size=1, length=1, ema=True) - plain == 4 * params
    assert training_bytes(TINY, batch_size=2, length=1, ema=False) > plain


def test_each_config_names_the_layers_widths_and_output_its_activations_scale_with():
    dit = DIT_PRESETS["DiT-digits"]
    expected = {
        TINY: ActivationShape(4, 64, 256, 4, TINY.tgt_vocab_size),  # both stacks, logits
        LM: ActivationShape(2, 64, 256, 4, LM.vocab_size),
        ENCODER: ActivationShape(2, 32, 64, 4, 0),  # hidden states out
        dit: ActivationShape(4, 128, int(128 * dit.mlp_ratio), 4, 0),  # DiT's truncated F
    }
    for cfg, shape in expected.items():
        assert cfg.activation_shape() == shape


def test_largest_setting_blames_the_field_whose_default_shrinks_the_estimate_most():
    defaults = dataclasses.asdict(TINY)

    def estimate(s):
        return dataclasses.replace(TINY, **s).count_parameters()

    assert largest_setting(estimate, {**defaults, "d_ff": 10**9, "n_heads": 8}, defaults) == "d_ff"
    assert largest_setting(estimate, defaults, defaults) is None


def test_check_model_fits_refuses_layers_and_sizes_no_machine_holds():
    with pytest.raises(SizeError, match="n_encoder_layers"):
        check_model_fits(dataclasses.replace(TINY, n_encoder_layers=100_000))
    with pytest.raises(SizeError, match="parameters"):
        check_model_fits(dataclasses.replace(TINY, d_ff=10**15))
    check_model_fits(TINY)
