"""Inputs and references shared by the norms' tests (tests/test_norms.py,
tests/test_masked_norms.py)."""

from __future__ import annotations

import torch
from tolerances import LOW_PRECISION
from torch import nn

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
F64 = torch.float64
# Comparisons in float64 use FLOAT64_EXACT: a norm is a few reductions over <= 64 unit-scale
# values, so two correct implementations agree to ~1e-14 on any machine.

# SPEC section 3, seed 003: 3 samples, 2 features.
SPEC_X = [[1.0, 2.0], [2.0, 4.0], [3.0, 6.0]]

LOW = [torch.float16, torch.bfloat16]
# Ours and torch's kernels both compute in float32 and round once to the low dtype, so an
# output differs by at most one ulp (<= 2u|y|); a running statistic, rounded at each of two
# steps, by two (<= 4u|y|). LOW_PRECISION's 4u relative (and 4u absolute near 0) holds both.
LOW_TOL = LOW_PRECISION


def randomize_parameters(module: nn.Module, seed: int) -> nn.Module:
    """Give every parameter a non-trivial value (weights away from 1, biases away from 0)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * 0.5 + 1.0)
    return module


def padded_batch(lengths: list[int], max_len: int, d_model: int, seed: int, fill: float):
    """Sentences of the given lengths, padded to ``max_len`` with ``fill``; True = padding."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(len(lengths), max_len, d_model, generator=gen, dtype=F64) * 2.0 + 0.5
    padding_mask = torch.arange(max_len)[None, :] >= torch.tensor(lengths)[:, None]
    x = x.masked_fill(padding_mask[..., None], fill)
    return x, padding_mask


def bn_reference(x: torch.Tensor, ref: nn.BatchNorm1d) -> torch.Tensor:
    """nn.BatchNorm1d on (B, D) or, transposed to its (B, D, L) layout, on (B, L, D)."""
    return ref(x) if x.ndim == 2 else ref(x.transpose(1, 2)).transpose(1, 2)


def gn_reference(x: torch.Tensor, ref: nn.GroupNorm) -> torch.Tensor:
    """nn.GroupNorm on (B, D) or, transposed to its (B, D, L) layout, on (B, L, D)."""
    return ref(x) if x.ndim == 2 else ref(x.transpose(1, 2)).transpose(1, 2)
