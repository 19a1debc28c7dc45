"""addnorm.bench.measure: the bytes of a model's training state and the CPU's unmeasured peak."""

from __future__ import annotations

import torch
from torch import nn

from addnorm.bench.measure import peak_memory, state_bytes


def test_state_bytes_counts_parameters_gradients_and_optimizer_state():
    model = nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(model.parameters(), fused=True)
    assert state_bytes(model, optimizer) == 15 * 4  # 12 + 3 float32, no gradient yet
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    # parameters, gradients, exp_avg and exp_avg_sq: 4 x 15 floats; a float32 step per tensor
    assert state_bytes(model, optimizer) == 4 * 15 * 4 + 2 * 4
    assert peak_memory(lambda: None, torch.device("cpu"), 123) is None
