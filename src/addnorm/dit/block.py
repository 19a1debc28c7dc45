"""The DiT block with adaLN-Zero conditioning (Peebles & Xie, 2023, section 3.2, Figure 3).

    shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = adaLN_modulation(c)
    x = x + gate_msa * attn(modulate(attn_norm(x), shift_msa, scale_msa))
    x = x + gate_mlp * ff(modulate(ff_norm(x), shift_mlp, scale_mlp))

``c`` is the conditioning vector (timestep embedding + class embedding). The norms have no
parameters of their own (their scale and shift come from ``c``); eps 1e-6. Attention is full
(no mask) multi-head self-attention over the patch tokens, with biases; the MLP is
``w2(GELU_tanh(w1(x)))``. With ``adaLN_modulation`` zero-initialised (the "Zero") every gate
is 0 and the block is the identity map.

Shapes legend: B batch, L tokens (patches), D d_model, F d_ff.
"""

from __future__ import annotations

import torch
from torch import nn

from addnorm.attention import MultiHeadAttention
from addnorm.dit.modulation import adaln_modulation, modulate
from addnorm.feedforward import FeedForward
from addnorm.norms import LayerNorm
from addnorm.utils.checks import check_float, check_int, check_tensor

__all__ = ["DiTBlock", "check_tokens_and_conditioning"]

def check_tokens_and_conditioning(x: object, c: object, d_model: int) -> None:
    """x (B, L, D) and c (B, D), floating point, with the same B."""
    x = check_tensor("x", x, ndim=3, last_dim=d_model, floating=True)
    c = check_tensor("c", c, ndim=2, last_dim=d_model, floating=True)
    if c.shape[0] != x.shape[0]:
        raise ValueError(f"c has batch size {c.shape[0]}, x has {x.shape[0]}")


class DiTBlock(nn.Module):
    """One adaLN-Zero block (formulas in the module docstring).

    Args:
        d_model: D; divisible by ``n_heads``.
        n_heads: H.
        d_ff: F, the MLP width (``int(mlp_ratio * D)``, 4D in the paper).
        norm_eps: epsilon of ``attn_norm`` (1e-6 in DiT).
        ff_norm_eps: epsilon of ``ff_norm`` (1e-6 in DiT; diffusers' port: its ``norm_eps``).

    Submodules: ``attn_norm``, ``attn`` (:class:`MultiHeadAttention`, fused ``in_proj`` rows
    ``[W_q; W_k; W_v]``), ``ff_norm``, ``ff`` (:class:`FeedForward`, GELU tanh),
    ``adaLN_modulation`` (``SiLU -> Linear(D, 6D)``, chunked in the order of the formulas).
    Special initialisation (adaLN-Zero) is the model's, in one place:
    :meth:`addnorm.dit.DiT.initialize_weights`; a block built alone has torch's defaults.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        *,
        d_ff: int,
        norm_eps: float = 1e-6,
        ff_norm_eps: float = 1e-6,
    ) -> None:
        super().__init__()
        self.d_model = check_int("d_model", d_model, min_value=1)
        norm_eps = check_float("norm_eps", norm_eps, min_value=0.0)
        ff_norm_eps = check_float("ff_norm_eps", ff_norm_eps, min_value=0.0)
        self.attn_norm = LayerNorm(d_model, eps=norm_eps, elementwise_affine=False)
        self.attn = MultiHeadAttention(d_model, n_heads, bias=True)
        self.ff_norm = LayerNorm(d_model, eps=ff_norm_eps, elementwise_affine=False)
        self.ff = FeedForward(d_model, d_ff, activation="gelu_tanh")
        self.adaLN_modulation = adaln_modulation(d_model, 6)

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        """Attention and MLP, each modulated and gated by the conditioning ``c``.

        Shapes:
            x: (B, L, D); c: (B, D)
            returns: (B, L, D)
        """
        check_tokens_and_conditioning(x, c, self.d_model)
        modulation = self.adaLN_modulation(c).chunk(6, dim=-1)  # 6 x (B, D)
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = modulation
        h = modulate(self.attn_norm(x), shift_msa, scale_msa)  # (B, L, D)
        x = torch.addcmul(x, gate_msa[:, None], self.attn(h))  # x + g * attn, unmasked
        h = modulate(self.ff_norm(x), shift_mlp, scale_mlp)  # (B, L, D)
        return torch.addcmul(x, gate_mlp[:, None], self.ff(h))  # x + g * ff(h), one pass
