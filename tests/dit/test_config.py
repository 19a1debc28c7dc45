"""DiTConfig and DIT_PRESETS: the paper's sizes, JSON round trips, and errors naming values."""

from __future__ import annotations

import dataclasses
import json

import pytest

from addnorm.dit import DIT_PRESETS, DiT, DiTConfig

# Peebles & Xie (2023), Table 1 (and DiT's models.py): size -> (hidden size, depth, heads).
PAPER = {"S": (384, 12, 6), "B": (768, 12, 12), "L": (1024, 24, 16), "XL": (1152, 28, 16)}


@pytest.mark.parametrize("size", sorted(PAPER))
@pytest.mark.parametrize("patch", [2, 4, 8])
def test_paper_presets_have_the_papers_sizes(size, patch):
    cfg = DIT_PRESETS[f"DiT-{size}/{patch}"]
    assert (cfg.d_model, cfg.n_layers, cfg.n_heads) == PAPER[size]
    assert cfg.patch_size == patch
    # DiT's constructor defaults, shared by every paper model (256 x 256 ImageNet latents).
    assert (cfg.input_size, cfg.in_channels, cfg.n_classes) == (32, 4, 1000)
    assert (cfg.class_dropout, cfg.learn_sigma, cfg.mlp_ratio) == (0.1, True, 4.0)
    assert (cfg.norm_eps, cfg.ff_norm_eps, cfg.timestep_downscale_freq_shift) == (1e-6, 1e-6, 0)


def test_the_default_config_is_dit_xl_2():
    # DiT's constructor defaults are XL/2's sizes.
    assert DiTConfig() == DIT_PRESETS["DiT-XL/2"]


def test_digits_preset_has_about_1_3m_parameters():
    # Count from the architecture: per block 4D^2 + 4D (attention) + 8D^2 + 5D (MLP, F = 4D)
    # + 6D^2 + 6D (adaLN); plus the timestep MLP, the label table (null row included), the
    # patch embedding and the final layer. pos_embed is a buffer, not a parameter.
    cfg = DIT_PRESETS["DiT-digits"]
    d, p, c = cfg.d_model, cfg.patch_size, cfg.in_channels
    block = 18 * d * d + 15 * d
    embed = (256 * d + d + d * d + d) + (cfg.n_classes + 1) * d + (c * p * p * d + d)
    final = (2 * d * d + 2 * d) + (d * p * p * cfg.out_channels + p * p * cfg.out_channels)
    expected = cfg.n_layers * block + embed + final
    assert sum(x.numel() for x in DiT(cfg).parameters()) == expected == 1_272_324
    assert (cfg.input_size, cfg.in_channels, cfg.n_classes, cfg.learn_sigma) == (8, 1, 10, False)


def test_derived_sizes():
    cfg = DIT_PRESETS["DiT-XL/2"]
    assert (cfg.out_channels, cfg.grid_size, cfg.d_ff, cfg.has_null_class) == (8, 16, 4608, True)
    small = dataclasses.replace(cfg, learn_sigma=False, class_dropout=0.0)
    assert (small.out_channels, small.has_null_class) == (4, False)


@pytest.mark.parametrize("name", sorted(DIT_PRESETS))
def test_every_preset_round_trips_through_json(name):
    cfg = DIT_PRESETS[name]
    assert DiTConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg


def test_configs_are_frozen_and_replace_validates_again():
    cfg = DIT_PRESETS["DiT-digits"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.d_model = 64  # type: ignore[misc]
    with pytest.raises(ValueError, match=r"d_model \(128\) must be divisible by n_heads \(3\)"):
        dataclasses.replace(cfg, n_heads=3)


@pytest.mark.parametrize(
    ("changes", "error", "match"),
    [
        ({"d_model": 130, "n_heads": 4}, ValueError, r"d_model \(130\) must be divisible by n_hea"),
        ({"d_model": 6, "n_heads": 3}, ValueError, r"d_model \(6\) must be divisible by 4"),
        ({"input_size": 9}, ValueError, r"input_size \(9\) must be divisible by patch_size \(2\)"),
        ({"patch_size": 0}, ValueError, r"patch_size must be >= 1, got 0"),
        ({"in_channels": 1.0}, TypeError, r"in_channels must be an int, got float"),
        ({"class_dropout": 1.0}, ValueError, r"class_dropout must be in \[0, 1\), got 1.0"),
        ({"learn_sigma": 1}, TypeError, r"learn_sigma must be a bool"),
        ({"mlp_ratio": 0}, ValueError, r"mlp_ratio must be > 0.0, got 0.0"),
        ({"mlp_ratio": 0.001}, ValueError, r"int\(d_model \* mlp_ratio\) must be >= 1"),
        ({"n_classes": 0}, ValueError, r"n_classes must be >= 1, got 0"),
        ({"d_freq": 2, "timestep_downscale_freq_shift": 1.0}, ValueError,
         r"d_freq // 2 \(1\) must exceed timestep_downscale_freq_shift \(1.0\)"),
        ({"norm_eps": -1.0}, ValueError, r"norm_eps must be >= 0.0, got -1.0"),
        ({"conditioning": "per-block"}, ValueError,
         r"conditioning must be one of 'shared', 'per_block'; got 'per-block'"),
    ],
)
def test_bad_values_raise_naming_them(changes, error, match):
    with pytest.raises(error, match=match):
        dataclasses.replace(DIT_PRESETS["DiT-digits"], **changes)


@pytest.mark.parametrize("name", ["DiT-digits", "DiT-digits-tiny"])
def test_per_block_counts_match_the_built_model(name):
    # Provenance: the built model's sum(numel). Per block: one timestep MLP and label table
    # more than the shared layout has, (256 D + D + D^2 + D) + (n_classes + 1) D each.
    shared = DIT_PRESETS[name]
    cfg = dataclasses.replace(shared, conditioning="per_block")
    dit = DiT(cfg)
    built = sum(p.numel() for p in dit.parameters())
    d = cfg.d_model
    pair = (256 * d + d + d * d + d) + (cfg.n_classes + 1) * d
    assert built == sum(p.numel() for p in DiT(shared).parameters()) + (cfg.n_layers - 1) * pair
    assert cfg.count_parameters() == built  # the label table has its null row (dropout 0.1)
    assert cfg.count_buffers() == sum(b.numel() for b in dit.buffers())
    assert cfg.activation_shape() == shared.activation_shape()  # the blocks' widths alone
    assert DiTConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
