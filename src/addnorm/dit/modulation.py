"""adaLN modulation: a normalized token stream scaled and shifted by the conditioning.

    modulate(x, shift, scale) = x * (1 + scale) + shift        (per sample, every token)

The ``1 +`` makes a zero scale the identity, so a zero-initialised modulation layer
(adaLN-Zero) leaves the normalized input as it is. Shapes legend: B batch, L tokens, D d_model.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["adaln_modulation", "modulate"]


def modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``x * (1 + scale) + shift``, one shift and scale per sample broadcast over its tokens.

    One fused ``addcmul``: one pass over the (B, L, D) stream and one new tensor, not two.

    Shapes:
        x: (B, L, D); shift, scale: (B, D)
        returns: (B, L, D)
    """
    return torch.addcmul(shift[:, None], x, 1 + scale[:, None])  # (B, L, D)


def adaln_modulation(d_model: int, n_chunks: int) -> nn.Sequential:
    """``SiLU -> Linear(D, n_chunks * D)``: the conditioning vector to its n_chunks
    modulation vectors (DiT's ``adaLN_modulation``; index 1 is the Linear).

    Shapes:
        (called) c: (B, D) -> (B, n_chunks * D)
    """
    return nn.Sequential(nn.SiLU(), nn.Linear(d_model, n_chunks * d_model))
