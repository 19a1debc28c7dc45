"""DiT's final layer: a modulated norm, then a linear map from each token to its patch.

    shift, scale = adaLN_modulation(c)
    out = linear(modulate(norm(x), shift, scale))          # p * p * C_out values per token

Shapes legend: B batch, L tokens, D d_model, p patch size, C_out output channels.
"""

from __future__ import annotations

import torch
from torch import nn

from addnorm.dit.block import check_tokens_and_conditioning
from addnorm.dit.modulation import adaln_modulation, modulate
from addnorm.norms import LayerNorm
from addnorm.utils.checks import check_float, check_int

__all__ = ["FinalLayer"]


class FinalLayer(nn.Module):
    """``linear(modulate(norm(x), shift, scale))`` with ``(shift, scale) = adaLN_modulation(c)``.

    Args:
        d_model: D.
        d_patch: p * p * C_out, the values of one output patch.
        norm_eps: epsilon of ``norm`` (no affine parameters; 1e-6 in DiT and diffusers).

    Submodules: ``norm``, ``adaLN_modulation`` (``SiLU -> Linear(D, 2D)``, chunked
    ``(shift, scale)``), ``linear`` (Linear D -> p * p * C_out, features ordered as
    :func:`addnorm.dit.patches.unpatchify` reads them).
    """

    def __init__(self, d_model: int, d_patch: int, *, norm_eps: float = 1e-6) -> None:
        super().__init__()
        self.d_model = check_int("d_model", d_model, min_value=1)
        check_int("d_patch", d_patch, min_value=1)
        norm_eps = check_float("norm_eps", norm_eps, min_value=0.0)
        self.norm = LayerNorm(d_model, eps=norm_eps, elementwise_affine=False)
        self.adaLN_modulation = adaln_modulation(d_model, 2)
        self.linear = nn.Linear(d_model, d_patch)

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        """Each token's output patch.

        Shapes:
            x: (B, L, D); c: (B, D)
            returns: (B, L, p * p * C_out)
        """
        check_tokens_and_conditioning(x, c, self.d_model)
        shift, scale = self.adaLN_modulation(c).chunk(2, dim=-1)  # 2 x (B, D)
        return self.linear(modulate(self.norm(x), shift, scale))
