"""What keeps the values held by padding out of attention's real outputs and gradients.

Keys that no query may attend (padding keys among them, :func:`hidden_keys`) are zeroed before
the kernel with ``torch.where``: a kernel multiplies masked weights by their values
(``0 * NaN = NaN``) and adds the mask to their scores (``-inf + NaN = NaN``), so NaN or inf held
by padding would otherwise reach every real query. Cross-attention zeroes the memory's padding
rows before projecting them, so no gradient (inputs' or weights') sees those values either;
self-attention zeroes the projected keys and values only, since padding queries keep their own
outputs (as torch.nn's).

Padding *queries* (``mask.query_padding``) are kept out of the backward pass, which runs every
query row against every key: their output rows are held constant (:func:`held_padding_rows`:
detached, values unchanged), so a gradient arriving there, NaN included, stops before the
kernel; and their non-finite query entries are set to 0 for the kernel
(:func:`finite_padding_queries`; finite ones are used as they are), whose backward would
otherwise multiply NaN weights of those rows into the real keys' gradients. Both apply only
where gradients are recorded. So NaN or inf at padding positions reaches neither the real
outputs nor the real inputs' gradients; like every position-wise Linear, the projections'
weight gradients still sum over padding rows (``0 * NaN``), as LayerNorm's do.
"""

from __future__ import annotations

import torch

from addnorm.attention_mask import AttentionMask

__all__ = ["finite_padding_queries", "held_padding_rows", "hidden_keys"]


def hidden_keys(mask: AttentionMask) -> torch.Tensor | None:
    """True where a key is visible to no query of its row (padding keys among them); None
    when every key is visible. Rows that see no key (opened for the kernel) do not count.

    Shapes:
        returns: (B|1, H|1, S, 1) bool
    """
    if mask.allowed is None:
        return None
    live = mask.allowed if mask.dead is None else mask.allowed & ~mask.dead  # (B|1, H|1, L|1, S)
    return ~live.any(dim=-2).unsqueeze(-1)  # (B|1, H|1, S, 1)


def finite_padding_queries(q: torch.Tensor, query_padding: torch.Tensor) -> torch.Tensor:
    """``q`` with the padding queries' NaN and inf entries replaced by 0 (``torch.where``).

    Real queries, and finite padding queries, are returned as they are (bit for bit), so every
    finite result is unchanged; a padding row holding NaN would make its attention weights NaN,
    and the kernel's backward multiplies them (times a zero gradient) into every key's. Only
    where a backward pass will run (the caller decides: gradients enabled).

    Shapes:
        q: (B, H, L, Dh); query_padding: (B, L) bool, True = padding
        returns: (B, H, L, Dh)
    """
    finite = q.detach().nan_to_num(0.0, posinf=0.0, neginf=0.0)  # padding rows get no gradient
    return torch.where(query_padding[:, None, :, None], finite, q)  # (B, H, L, Dh)


def held_padding_rows(heads: torch.Tensor, query_padding: torch.Tensor) -> torch.Tensor:
    """The kernel's output with the padding queries' rows detached: the same values, but a
    gradient arriving at those rows (NaN from padding downstream, say) stops there instead of
    reaching the keys and values of real tokens through the kernel's backward. Only where a
    backward pass will run (the caller decides: gradients enabled).

    Shapes:
        heads: (B, H, L, Dh); query_padding: (B, L) bool, True = padding
        returns: (B, H, L, Dh)
    """
    return torch.where(query_padding[:, None, :, None], heads.detach(), heads)  # (B, H, L, Dh)
