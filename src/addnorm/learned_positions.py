"""A learned table of absolute positions (GPT-style): ``dropout(x + E[pos])``.

Unlike the sinusoidal code (:mod:`addnorm.encodings`, which re-exports this class) it has no
row for a position ``>= max_len`` (SPEC claim 8).

Shapes legend: B batch, L sequence length, D d_model.
"""

from __future__ import annotations

import torch
from torch import nn

from addnorm.utils.checks import (
    assert_in_graph,
    check_int,
    check_positions,
    check_probability,
    check_tensor,
)

__all__ = ["LearnedPositionalEmbedding"]


def _whole_positions(positions: torch.Tensor) -> torch.Tensor:
    """Float positions as long indices, refusing fractional ones and, before the conversion (a
    float such as 1e20 would wrap around in it), negative ones and ones beyond int64."""
    fractional = positions != positions.round()
    if bool(fractional.any()):
        bad = positions[fractional][0].item()
        raise ValueError(f"positions must be whole numbers for a learned table, got {bad}")
    if positions.numel():
        low, high = (v.item() for v in torch.aminmax(positions))
        if low < 0:
            raise ValueError(f"positions must be >= 0, got {low}")
        if high >= 2**62:
            raise ValueError(
                f"position {high} is out of range for a learned table; it has no row for it"
            )
    return positions.long()


class LearnedPositionalEmbedding(nn.Module):
    """``dropout(x + E[pos])`` with a learned table ``E`` of ``max_len`` rows (GPT-style).

    Unlike the sinusoidal code it cannot represent a position ``>= max_len`` (SPEC claim 8):
    asking for one raises a ``ValueError`` naming the position and ``max_len``.
    """

    def __init__(self, max_len: int, d_model: int, *, dropout: float = 0.0) -> None:
        super().__init__()
        self.max_len = check_int("max_len", max_len, min_value=1)
        self.d_model = check_int("d_model", d_model, min_value=1)
        self.embedding = nn.Embedding(self.max_len, self.d_model)
        self.dropout = nn.Dropout(check_probability("dropout", dropout))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """GPT-2 / nanoGPT rule: table entries drawn from N(0, 0.02^2)."""
        nn.init.normal_(self.embedding.weight, mean=0.0, std=0.02)

    def _rows(self, positions: torch.Tensor) -> torch.Tensor:
        """``E[positions]``: integer positions in ``[0, max_len)``, or a ValueError naming the
        culprit.

        The range is the embedding kernel's own check, so nothing is read back while the
        positions are fine (a model's positions always are: a host sync per decoding step
        would stall an accelerator). On the CPU its IndexError becomes the ValueError below;
        on CUDA it is a device-side assert. While a graph is captured, an in-graph assert.
        """
        if torch.compiler.is_compiling():
            fine = (positions >= 0) & (positions < self.max_len)
            assert_in_graph(fine.all(), f"positions must be in [0, max_len ({self.max_len}))")
            return self.embedding(positions)
        try:
            return self.embedding(positions)  # (L, D) or (B, L, D)
        except IndexError:
            low, high = (v.item() for v in torch.aminmax(positions))
            if low < 0:
                raise ValueError(f"positions must be >= 0, got {low}") from None
            raise ValueError(
                f"position {high} is out of range for max_len ({self.max_len}); a learned "
                "table has no row for it"
            ) from None

    def forward(
        self, x: torch.Tensor, *, offset: int = 0, positions: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Add the learned embedding of each token's position to ``x``, then apply dropout.

        Args:
            x: token embeddings.
            offset: position of the first token; ``offset + L`` must not exceed ``max_len``.
            positions: explicit whole-number positions, (L,) or (B, L); overrides ``offset``.
                They are moved to x's device if they live elsewhere.

        Shapes:
            x: (B, L, D)
            positions: (L,) or (B, L)
            returns: (B, L, D)
        """
        x = check_tensor("x", x, ndim=3, last_dim=self.d_model, floating=True)
        offset = check_int("offset", offset, min_value=0)
        batch, length, _ = x.shape
        if positions is None:
            if offset + length > self.max_len:
                raise ValueError(
                    f"offset ({offset}) + sequence length ({length}) = {offset + length} "
                    f"exceeds max_len ({self.max_len})"
                )
            rows = self.embedding(torch.arange(offset, offset + length, device=x.device))  # (L, D)
        else:
            positions = check_positions(positions, batch, length)
            if positions.is_floating_point():  # a caller's own (models pass integers)
                positions = _whole_positions(positions)
            rows = self._rows(positions.to(x.device))  # (L, D) or (B, L, D)
        return self.dropout(x + rows.to(x.dtype))
