"""The training state a checkpoint holds besides the weights: a restored optimizer takes the same
next step and restored generators repeat their draws (identities)."""

from __future__ import annotations

import json
import random

import numpy as np
import torch
from torch import nn

from addnorm.training.state import (
    capture_rng,
    optimizer_from_parts,
    optimizer_to_parts,
    restore_rng,
)


def test_a_restored_optimizer_takes_the_same_next_step():
    def fresh():
        torch.manual_seed(0)
        model = nn.Linear(3, 2)
        return model, torch.optim.AdamW(model.parameters(), lr=0.1, betas=(0.9, 0.98))

    def step(model, optimizer):
        optimizer.zero_grad()
        model(torch.ones(4, 3)).square().sum().backward()
        optimizer.step()

    model_a, opt_a = fresh()
    step(model_a, opt_a)
    tensors, skeleton = optimizer_to_parts(opt_a)
    json.dumps(skeleton)  # the skeleton is pure JSON
    model_b, opt_b = fresh()
    model_b.load_state_dict(model_a.state_dict())
    optimizer_from_parts(opt_b, tensors, json.loads(json.dumps(skeleton)))
    assert opt_b.param_groups[0]["betas"] == (0.9, 0.98)
    step(model_a, opt_a)
    step(model_b, opt_b)
    for a, b in zip(model_a.parameters(), model_b.parameters(), strict=True):
        assert torch.equal(a, b)


def test_restored_generators_repeat_their_draws():
    tensors, state = capture_rng()
    state = json.loads(json.dumps(state))
    first = (torch.rand(3), random.random(), np.random.rand(2))
    restore_rng(tensors, state)
    again = (torch.rand(3), random.random(), np.random.rand(2))
    assert torch.equal(first[0], again[0])
    assert first[1] == again[1]
    assert np.array_equal(first[2], again[2])
