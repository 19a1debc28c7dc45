"""addnorm.inspection.model_map: the layers and parameter groups of each model family, found
from the module tree alone, named as the state dict names them.

Provenance: the expected names are the models' own submodule paths (``model.named_modules()``,
``state_dict()`` keys); every parameter counts in exactly one layer or owner group and in
``"total"``.
"""

from __future__ import annotations

import dataclasses

import torch

import addnorm
from addnorm.inspection import ModelMap
from addnorm.training.distributed import checkpoint_layers


def _lm(**overrides):
    cfg = dataclasses.replace(addnorm.PRESETS["lm-tiny"], vocab_size=32, d_model=16,
                              n_heads=2, d_ff=32, n_layers=3, **overrides)
    return addnorm.TransformerLM(cfg)


def test_an_lms_layers_and_groups():
    found = ModelMap.of(_lm())
    assert found.layers == ("blocks.layers.0", "blocks.layers.1", "blocks.layers.2")
    names = [name for name, _ in found.params]
    assert names == [name for name, _ in _lm().named_parameters()]
    for layer in found.layers:
        assert {f"{layer}.{s}" for s in ("self_attn", "ff", "attn_add_norm", "ff_add_norm")
                } <= set(found.groups)
    # each parameter is in exactly one layer or owner group (sublayers split the layers)
    sublayers = {g for g in found.groups if any(g.startswith(f"{l}.") for l in found.layers)}
    outer = set(found.groups) - sublayers - {"total"}
    counted = sorted(i for g in outer for i in found.groups[g])
    assert counted == list(range(len(names)))
    assert found.groups["total"] == tuple(range(len(names)))


def test_an_encoder_decoder_and_a_dit_are_mapped_by_structure():
    cfg = dataclasses.replace(addnorm.PRESETS["tiny"], src_vocab_size=20, tgt_vocab_size=20,
                              n_encoder_layers=2, n_decoder_layers=2)
    found = ModelMap.of(addnorm.Transformer(cfg))
    assert found.layers == ("encoder.layers.0", "encoder.layers.1", "decoder.layers.0",
                            "decoder.layers.1")
    assert "decoder.layers.1.cross_attn" in found.groups
    dit = addnorm.DiT(dataclasses.replace(addnorm.DIT_PRESETS["DiT-S/2"], input_size=8,
                                          n_layers=2, d_model=32, n_heads=2, n_classes=3))
    found = ModelMap.of(dit)
    assert found.layers == ("blocks.0", "blocks.1")
    assert {"blocks.0.attn", "blocks.0.ff", "blocks.0.adaLN_modulation"} <= set(found.groups)


def test_wrappers_leave_the_names_as_the_state_dict_has_them():
    model = _lm()
    plain = ModelMap.of(model)
    checkpoint_layers(model)
    wrapped = ModelMap.of(model)
    assert wrapped.layers == plain.layers
    assert [n for n, _ in wrapped.params] == [n for n, _ in plain.params]
    assert {n for n, _ in wrapped.params} <= set(model.state_dict())
    assert wrapped.groups == plain.groups


def test_per_parameter_groups_name_each_parameter():
    found = ModelMap.of(_lm(), per_parameter=True)
    assert found.groups["blocks.layers.1.ff.w2.weight"] == (
        [n for n, _ in found.params].index("blocks.layers.1.ff.w2.weight"),)
    assert torch.is_tensor(found.params[0][1])
