"""Variable-length attention: each row of a packed batch attends to its own tokens only.

A packed row (see :mod:`addnorm.packing`) holds the real tokens of B rows back to back, row b
at ``cu_lengths[b] .. cu_lengths[b + 1] - 1``. Attention within each row,

    out[t] = softmax(q[t] K_b^T / sqrt(Dh)) V_b      for every token t of row b,

is what padded attention computes at the real tokens when the mask is the padding alone, but
over ``sum l_b^2`` scores instead of ``B L^2``, and with no padded (B, H, L, Dh) tensor built.

Three ways, one result (each exact attention over each row's real keys; only the order of
the kernels' own sums differs):

- CUDA, float16 / bfloat16, no attention dropout, a head width the flash kernel takes (a
  multiple of 8, at most 256) on an sm80+ device with SDPA's flash backend enabled: torch's
  variable-length flash attention (``torch.nn.attention.varlen.varlen_attn``, torch >= 2.9),
  one kernel for the whole batch, forward and backward, with ``cu_lengths`` as its
  ``cu_seqlens`` and the padded length L as the bound on a row's length (no host read).
- Otherwise (the CPU, float32, attention dropout), rows of equal length are attended
  together: one dense attention call (no mask) per distinct length
  (:attr:`Packing.rows_by_length`), where that saves more work than the extra kernel calls
  cost (:func:`per_length_pays`).
- Where it does not (small widths and short rows, such as the date translator's on the CPU,
  where a kernel call costs more than the padding's scores), one padded attention call: the
  projections unpacked to (B, H, L, Dh), the padding keys masked, the output packed back.

Attention per length pays at wide heads or long rows and loses where the calls' fixed cost
dominates (the measurements: ``benchmarks/PERF_NOTES.md``, ``benchmarks/unpadded_attention.py``).

Shapes legend: N packed tokens, H heads, Dh head dim.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import cast

import torch

from addnorm.attention_kernel import scaled_dot_product
from addnorm.packing import Packing

__all__ = ["flash_varlen_applies", "per_length_pays", "varlen_attention"]

FLASH_DTYPES = (torch.float16, torch.bfloat16)
FLASH_MAX_HEAD_DIM = 256
# What one more SDPA call costs, in score multiply-adds (q . k products) it must save to pay:
# the CPU break-even measured in benchmarks/PERF_NOTES.md.
KERNEL_CALL_COST = 400_000

# The kernel called for a flash-eligible batch: ``(q, k, v, cu_q, cu_k, max_q, max_k) -> out``
# with torch's ``varlen_attn`` positional signature (the same from torch 2.9 to 2.13).
VarlenKernel = Callable[..., torch.Tensor]


def _torch_kernel() -> VarlenKernel | None:
    """torch's variable-length flash attention (torch >= 2.9), or None before it."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:  # pragma: no cover - older torch: the other two ways everywhere
        return None
    return cast(VarlenKernel, varlen_attn)


flash_varlen_kernel: VarlenKernel | None = _torch_kernel()


@functools.lru_cache(maxsize=16)
def _sm80_or_newer(device_index: int) -> bool:
    return torch.cuda.get_device_capability(device_index) >= (8, 0)


def flash_varlen_applies(q: torch.Tensor, dropout_p: float) -> bool:
    """Whether torch's variable-length flash kernel takes these queries (see the module
    docstring); reads no tensor value."""
    if flash_varlen_kernel is None or q.device.type != "cuda":
        return False
    d_head = q.shape[-1]
    return (
        q.dtype in FLASH_DTYPES and dropout_p == 0.0
        and d_head % 8 == 0 and d_head <= FLASH_MAX_HEAD_DIM
        and torch.backends.cuda.flash_sdp_enabled()
        and _sm80_or_newer(q.device.index if q.device.index is not None else 0)
    )


def varlen_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, packing: Packing, *, dropout_p: float = 0.0
) -> torch.Tensor:
    """``softmax(Q K^T / sqrt(Dh)) V`` within each packed row (see the module docstring).

    Args:
        q, k, v: the packed tokens' per-head queries, keys and values, in ``packing``'s order.
        packing: where each row's tokens sit.
        dropout_p: dropout on the attention weights (pass 0.0 outside training).

    Shapes:
        q, k, v: (N, H, Dh)
        returns: (N, H, Dh)
    """
    if flash_varlen_applies(q, dropout_p):
        assert flash_varlen_kernel is not None  # for mypy: checked by flash_varlen_applies
        cu = packing.cu_lengths  # (B + 1,) int32
        return flash_varlen_kernel(q, k, v, cu, cu, packing.length, packing.length)
    if per_length_pays(packing, n_heads=q.shape[1], d_head=q.shape[2]):
        return _by_length(q, k, v, packing, dropout_p)
    return _padded(q, k, v, packing, dropout_p)


def per_length_pays(packing: Packing, *, n_heads: int, d_head: int) -> bool:
    """Whether attending per row length saves more score work than its extra kernel calls
    cost: ``(B L^2 - sum l_b^2) H Dh >= (calls - 1) KERNEL_CALL_COST``, with one call per
    distinct length. Reads the row lengths (free on the CPU, one host sync on a GPU, kept for
    every layer)."""
    lengths = packing.row_lengths
    saved = (len(lengths) * packing.length**2 - sum(n * n for n in lengths)) * n_heads * d_head
    extra_calls = len(packing.rows_by_length[1]) - 1
    return saved >= extra_calls * KERNEL_CALL_COST


def _padded(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, packing: Packing, dropout_p: float
) -> torch.Tensor:
    """One SDPA call in the padded layout, padding keys masked (:attr:`Packing.attend_keys`).

    Shapes:
        q, k, v: (N, H, Dh); returns: (N, H, Dh)
    """
    tokens, n_heads, d_head = q.shape
    q, k, v = (
        packing.unpack(t.reshape(1, tokens, n_heads * d_head))
        .view(packing.batch, packing.length, n_heads, d_head).transpose(1, 2)
        for t in (q, k, v)
    )  # (B, H, L, Dh), zeros at padding
    out = scaled_dot_product(q, k, v, allowed=packing.attend_keys,
                             dropout_p=dropout_p)  # (B, H, L, Dh)
    return packing.pack(out.transpose(1, 2))[0]  # (N, H, Dh)


def _by_length(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, packing: Packing, dropout_p: float
) -> torch.Tensor:
    """One dense SDPA per distinct row length, over the rows of that length.

    Shapes:
        q, k, v: (N, H, Dh); returns: (N, H, Dh)
    """
    order, groups = packing.rows_by_length
    groups = groups or ((0, 1),)  # no real token (N = 0): one empty block, still in the graph
    if order is not None:  # rows of one length together
        q, k, v = q.index_select(0, order), k.index_select(0, order), v.index_select(0, order)
    n_heads, d_head = q.shape[1:]
    outputs, start = [], 0
    for length, rows in groups:
        block = slice(start, start + rows * length)
        start = block.stop
        q_b, k_b, v_b = (
            t[block].view(rows, length, n_heads, d_head).transpose(1, 2) for t in (q, k, v)
        )  # (rows, H, length, Dh)
        out = scaled_dot_product(q_b, k_b, v_b, dropout_p=dropout_p)
        outputs.append(out.transpose(1, 2).reshape(rows * length, n_heads, d_head))
    out = torch.cat(outputs) if len(outputs) != 1 else outputs[0]  # (N, H, Dh)
    if order is None:
        return out
    return torch.empty_like(out).index_copy_(0, order, out)  # back to the packed order
