"""Per-layer activation checkpointing (``TrainConfig.activation_checkpointing``).

Provenance of expected values: recomputing a layer in the backward pass is an identity for the
gradients (non-reentrant checkpointing restores the RNG state, so even dropout draws the same
masks); the checkpointed model's state dict keys are the plain model's (the wrapper strips its
prefix); a trainer's checkpoint with the switch on loads into a plain model.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from tolerances import FLOAT64_EXACT

import addnorm
from addnorm.training.distributed import checkpoint_layers, layer_classes

WRAPPED = "_checkpoint_wrapped_module."


def _model(kind: str) -> torch.nn.Module:
    """A tiny model of each layer family, weights perturbed (a fresh DiT is all zeros at the
    output), dropout on where the model has it."""
    torch.manual_seed(0)
    if kind == "transformer":
        model: torch.nn.Module = addnorm.Transformer(
            dataclasses.replace(addnorm.PRESETS["tiny"], dropout=0.1)
        )
    elif kind == "lm":
        model = addnorm.TransformerLM(dataclasses.replace(addnorm.PRESETS["lm-tiny"], dropout=0.1))
    else:
        model = addnorm.DiT(addnorm.DIT_PRESETS["DiT-digits-tiny"])
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.02 * torch.randn_like(p))
    return model


def _loss(kind: str, model: torch.nn.Module) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    if kind == "dit":
        x = torch.randn(3, 1, 8, 8, generator=g, dtype=torch.float64)
        t, y = torch.tensor([1, 500, 999]), torch.tensor([0, 4, 9])
        return model(x, t, y).square().mean()
    ids = torch.randint(3, 128, (3, 9), generator=g)
    ids[1, 6:] = 0  # padding, so the masks are in play
    out = model(ids, ids[:, :7]) if kind == "transformer" else model(ids)
    return out.square().mean()


def _grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n.replace(WRAPPED, ""): p.grad for n, p in model.named_parameters()}


@pytest.mark.parametrize("kind", ["transformer", "lm", "dit"])
def test_checkpointed_layers_give_the_gradients_of_the_plain_model(kind):
    plain, wrapped = _model(kind).double(), _model(kind).double()  # float64: an identity
    checkpoint_layers(wrapped)
    n_layers = sum(isinstance(m, layer_classes(plain)) for m in plain.modules())
    assert sum(type(m).__name__ == "CheckpointWrapper" for m in wrapped.modules()) == n_layers
    torch.manual_seed(2)
    _loss(kind, plain).backward()
    torch.manual_seed(2)
    _loss(kind, wrapped).backward()
    expected, got = _grads(plain), _grads(wrapped)
    assert sorted(got) == sorted(expected)
    for name, grad in expected.items():
        torch.testing.assert_close(got[name], grad, **FLOAT64_EXACT, msg=name)


@pytest.mark.parametrize("kind", ["transformer", "dit"])
def test_checkpointed_model_keeps_the_state_dict_keys_both_ways(kind):
    plain, wrapped = _model(kind), _model(kind)
    checkpoint_layers(wrapped)
    state = wrapped.state_dict()
    assert list(state) == list(plain.state_dict())
    fresh = _model(kind)
    checkpoint_layers(fresh)
    with torch.no_grad():
        for p in fresh.parameters():
            p.zero_()
    fresh.load_state_dict(plain.state_dict())  # plain keys load into the wrapped model
    for name, value in fresh.state_dict().items():
        torch.testing.assert_close(value, plain.state_dict()[name], rtol=0, atol=0)


def test_a_trainer_with_checkpointing_saves_plain_keys_and_trains_the_same(train_tiny_lm):
    """Three steps with the switch on and off: the same checkpoint keys and weights (dropout
    0.1 included: the recomputation replays the RNG)."""
    cfg = dataclasses.replace(addnorm.PRESETS["lm-tiny"], dropout=0.1)
    saved = {
        switch: train_tiny_lm(cfg, str(switch), steps=3, ema_decay=0.5,
                              activation_checkpointing=switch, dtype=torch.float64)[3]
        for switch in (False, True)
    }
    for part in ("model", "ema"):
        plain, wrapped = saved[False].tensors[part], saved[True].tensors[part]
        assert list(wrapped) == list(plain)
        for name, value in plain.items():
            # float64 (see TRAJECTORY_RTOL in test_distributed.py): gradients may differ by
            # rounding, g ~ u * |terms| <= 1.1e-16; Adam (eps 1e-8) turns that into at most
            # lr * g / eps = 1.1e-10 per step on a weight whose true gradient is zero; 3 steps.
            torch.testing.assert_close(wrapped[name], value, rtol=0, atol=1e-9, msg=name)
    reloaded = addnorm.TransformerLM(dataclasses.replace(addnorm.PRESETS["lm-tiny"]))
    reloaded.load_state_dict(saved[True].tensors["model"])  # strict: no wrapper keys
