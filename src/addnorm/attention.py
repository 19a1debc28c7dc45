"""Multi-head attention (Vaswani et al., 2017, section 3.2).

    Attention(Q, K, V) = softmax(Q K^T / sqrt(Dh)) V
    MultiHead(x, m)    = Concat(head_1 .. head_H) W_o
    head_i             = Attention(x W_q^i, m W_k^i, m W_v^i)

with ``m = x`` for self-attention and ``m = memory`` (the encoder output) for cross-attention.

Shapes legend: B batch, L query length, S key length, D d_model, H heads, Dh = D / H.

Masks (``padding_mask`` True = padding key, ``attend_mask`` True = may attend, ``causal``) are
combined by :mod:`addnorm.attention_mask`, which this module re-exports. A query row that can
see no key at all (every key padding, say) gets zero attention weights and a zero output,
never NaN, on every path: SDPA's handling of such rows differs between backends, so they are
opened before the kernel and zeroed after it. NaN or inf held by padding reaches no real
output and no real input's gradient (:mod:`addnorm.attention_padding`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from addnorm.attention_kernel import EXPLICIT_DTYPE, product_with_weights, scaled_dot_product
from addnorm.attention_mask import (
    AttentionMask,
    build_attention_mask,
    causal_attend_mask,
    cross_attention_mask,
    self_attention_mask,
)
from addnorm.attention_padding import finite_padding_queries, held_padding_rows, hidden_keys
from addnorm.cache import KVCache
from addnorm.rotary import RotaryEmbedding
from addnorm.utils.checks import (
    check_int,
    check_probability,
    check_tensor,
    check_weight_dtype,
)
from addnorm.varlen_attention import varlen_attention

__all__ = [
    "AttentionMask",
    "MultiHeadAttention",
    "build_attention_mask",
    "cross_attention_mask",
    "self_attention_mask",
]


def split_heads(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    """(B, L, D) -> (B, H, L, Dh); every size explicit, so empty B or L work too."""
    batch, length, d_model = x.shape
    return x.view(batch, length, n_heads, d_model // n_heads).transpose(1, 2)  # (B, H, L, Dh)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """(B, H, L, Dh) -> (B, L, D), the Concat of the paper."""
    batch, n_heads, length, d_head = x.shape
    return x.transpose(1, 2).reshape(batch, length, n_heads * d_head)  # (B, L, D)


def _writes_at_slots(cache: KVCache | None) -> bool:
    """Whether x's keys go to a compiled static cache's slots rather than after the last key:
    there the mask does not say which columns are x's, so they are not zeroed (a compiled
    decoding step writes no padding, ``DecodingCache.extend(None, n)``, and unwritten slots
    hold the cache's initial zeros). Every other write stores zeroed padding keys."""
    return cache is not None and cache.static and torch.compiler.is_compiling()


def _plain_linear(module: nn.Module) -> bool:
    """Whether calling ``module`` runs ``nn.Linear.forward`` and nothing else: a plain Linear
    (no adapter, wrapper or parametrization in its place) with no hook of any kind, its own
    or global (the condition of ``nn.Module.__call__``'s own fast path)."""
    registry = torch.nn.modules.module
    return type(module) is nn.Linear and not (
        module._forward_hooks or module._forward_pre_hooks
        or module._backward_hooks or module._backward_pre_hooks
        or registry._global_forward_hooks or registry._global_forward_pre_hooks
        or registry._global_backward_hooks or registry._global_backward_pre_hooks
    )


def check_rotary(rotary: object, d_head: int) -> RotaryEmbedding | None:
    """``rotary`` as given: None, or a :class:`RotaryEmbedding` of width ``d_head``."""
    if rotary is not None and not isinstance(rotary, RotaryEmbedding):
        raise TypeError(f"rotary must be a RotaryEmbedding or None, got {type(rotary).__name__}")
    if rotary is not None and rotary.d_head != d_head:
        raise ValueError(f"rotary.d_head ({rotary.d_head}) must equal d_model / n_heads ({d_head})")
    return rotary


class MultiHeadAttention(nn.Module):
    """Multi-head scaled dot-product attention, self or cross, through SDPA.

    Args:
        d_model: model width D; must be divisible by ``n_heads``.
        n_heads: number of heads H; each has width Dh = D / H.
        dropout: dropout probability on the attention weights (training only).
        bias: whether the projections have biases.
        rotary: a :class:`~addnorm.rotary.RotaryEmbedding` of width Dh applied to the queries
            and keys of *self*-attention (cross-attention keys have no shared positions).

    Submodules: ``in_proj`` (Linear D -> 3D, rows ``[W_q; W_k; W_v]``, the layout of
    ``nn.MultiheadAttention.in_proj_weight``/``in_proj_bias``) and ``out_proj``
    (Linear D -> D). Attributes ``dropout`` (float), ``n_heads``, ``d_head``.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        *,
        dropout: float = 0.0,
        bias: bool = True,
        rotary: RotaryEmbedding | None = None,
    ) -> None:
        super().__init__()
        d_model = check_int("d_model", d_model, min_value=1)
        n_heads = check_int("n_heads", n_heads, min_value=1)
        if d_model % n_heads:
            raise ValueError(f"d_model ({d_model}) must be divisible by n_heads ({n_heads})")
        dropout = check_probability("dropout", dropout)
        rotary = check_rotary(rotary, d_model // n_heads)
        self.d_model, self.n_heads, self.d_head = d_model, n_heads, d_model // n_heads
        self.dropout = dropout
        self.rotary = rotary
        self.in_proj = nn.Linear(d_model, 3 * d_model, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Xavier-uniform (Glorot & Bengio, 2010) on W_q, W_k, W_v, W_o, each its own (D, D)
        matrix with bound sqrt(6 / 2D) (torch.nn draws the stacked (3D, D) as one, bound
        sqrt(6 / 4D)); zero biases."""
        for block in self.in_proj.weight.detach().chunk(3, dim=0):
            nn.init.xavier_uniform_(block)
        nn.init.xavier_uniform_(self.out_proj.weight)
        for linear in (self.in_proj, self.out_proj):
            if linear.bias is not None:
                nn.init.zeros_(linear.bias)

    def forward(
        self,
        x: torch.Tensor,
        memory: torch.Tensor | None = None,
        *,
        mask: AttentionMask | None = None,
        padding_mask: torch.Tensor | None = None,
        attend_mask: torch.Tensor | None = None,
        causal: bool = False,
        cache: KVCache | None = None,
        positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Attend from ``x`` to itself (``memory=None``) or to ``memory``.

        Args:
            x: the queries' inputs (and keys'/values' for self-attention).
            memory: the encoder output to attend to (cross-attention), or None.
            mask: a prebuilt :class:`AttentionMask` (a stack builds one for all its layers);
                trusted as it is, so nothing is checked again. Or describe the mask with:
            padding_mask: True = padding key. With a self-attention ``cache`` the keys are the
                cached ones followed by x's, so S = cache.length + L.
            attend_mask: True = may attend (see the module docstring for the shapes).
            causal: bottom-right aligned causal masking.
            cache: keys and values of earlier positions (self-attention: x's are appended in
                place; cross-attention: filled from ``memory`` on first use, then reused).
            positions: positions of x's tokens for ``rotary``; default ``cache.length + arange(L)``.

        Shapes:
            x: (B, L, D); memory: (B, S, D); padding_mask: (B, S)
            attend_mask: (L, S), (B, L, S) or (B, H, L, S); positions: (L,) or (B, L)
            returns: (B, L, D)
        """
        if mask is None:
            mask = self._checked_mask(x, memory, cache, padding_mask, attend_mask, causal)
        elif padding_mask is not None or attend_mask is not None or causal:
            raise ValueError(
                "pass either a prebuilt mask or padding_mask / attend_mask / causal, not both"
            )
        q, k, v = self._project(x, memory, cache, positions, mask)
        # the padding queries to keep out of a backward pass: none without one (inference)
        guarded = mask.query_padding if torch.is_grad_enabled() else None  # (B, L) or None
        if guarded is not None:
            q = finite_padding_queries(q, guarded)
        p = self.dropout if self.training else 0.0
        if mask.packing is not None and mask.allowed is None:  # mask.variable_length
            heads = varlen_attention(q, k, v, mask.packing, dropout_p=p)  # (N, H, Dh)
            return self.out_proj(heads.flatten(1)[None])  # (1, N, D)
        if q.dtype == EXPLICIT_DTYPE:  # the one dtype the explicit product may take
            heads = scaled_dot_product(
                q, k, v, allowed=mask.allowed, dropout_p=p, is_causal=mask.is_causal
            )
        else:
            heads = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask.allowed, dropout_p=p, is_causal=mask.is_causal
            )  # (B, H, L, Dh)
        return self._output(heads, mask, guarded)

    def forward_with_weights(
        self,
        x: torch.Tensor,
        memory: torch.Tensor | None = None,
        *,
        mask: AttentionMask | None = None,
        padding_mask: torch.Tensor | None = None,
        attend_mask: torch.Tensor | None = None,
        causal: bool = False,
        cache: KVCache | None = None,
        positions: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`forward` for inspection, also returning the attention weights (no SDPA).

        Takes :meth:`forward`'s arguments, a prebuilt ``mask`` included (trusted as there:
        :mod:`addnorm.inspection` recomputes a watched layer's weights from the arguments its
        forward received). The weights (:func:`product_with_weights`) sum to 1 per row, or are
        zeros where a row sees no key. Called directly (not through ``__call__``): no hooks.

        Shapes:
            returns: output (B, L, D), weights (B, H, L, S); with a packed ``mask``, output
            (1, N, D) and weights in the padded layout (B, H, L, L)
        """
        if mask is None:
            mask = self._checked_mask(x, memory, cache, padding_mask, attend_mask, causal)
        elif padding_mask is not None or attend_mask is not None or causal:
            raise ValueError(
                "pass either a prebuilt mask or padding_mask / attend_mask / causal, not both"
            )
        if mask.variable_length:  # the explicit product needs the padded layout's mask
            assert mask.packing is not None  # for mypy: implied by variable_length
            mask = mask._replace(allowed=mask.packing.attend_keys)  # (B, 1, 1, L)
        q, k, v = self._project(x, memory, cache, positions, mask)
        guarded = mask.query_padding if torch.is_grad_enabled() else None  # as in forward
        if guarded is not None:
            q = finite_padding_queries(q, guarded)
        allowed = mask.allowed
        if mask.is_causal:
            allowed = causal_attend_mask(q.shape[2], k.shape[2], q.device)  # (L, S)
        heads, weights = product_with_weights(
            q, k, v, allowed=allowed, dead=mask.dead,
            dropout_p=self.dropout if self.training else 0.0, training=self.training,
        )
        return self._output(heads, mask, guarded), weights

    def _checked_mask(
        self,
        x: torch.Tensor,
        memory: torch.Tensor | None,
        cache: KVCache | None,
        padding_mask: torch.Tensor | None,
        attend_mask: torch.Tensor | None,
        causal: bool,
    ) -> AttentionMask:
        """Check the arguments of a direct call and build its mask, *before* :meth:`_project`
        appends x's keys to ``cache``, so a bad call raises and leaves the cache as it was."""
        check_tensor("x", x, ndim=3, last_dim=self.d_model, floating=True)
        check_weight_dtype("x", x, self.in_proj.weight)
        if cache is not None and not isinstance(cache, KVCache):
            raise TypeError(f"cache must be a KVCache or None, got {type(cache).__name__}")
        cached = 0 if cache is None else cache.cached_before(x.shape[1])
        if memory is None:
            return self_attention_mask(
                x, n_heads=self.n_heads, padding_mask=padding_mask, attend_mask=attend_mask,
                causal=causal, cached=cached,
            )
        check_tensor("memory", memory, ndim=3, last_dim=self.d_model, floating=True)
        check_weight_dtype("memory", memory, self.in_proj.weight)
        if memory.shape[0] != x.shape[0]:
            raise ValueError(
                f"memory batch size ({memory.shape[0]}) must equal x batch size ({x.shape[0]})"
            )
        batch, query_len, _ = x.shape
        key_len = cached or memory.shape[1]  # a filled cross-attention cache holds the memory
        return build_attention_mask(
            batch=batch, n_heads=self.n_heads, query_len=query_len, key_len=key_len,
            device=x.device, padding_mask=padding_mask, attend_mask=attend_mask, causal=causal,
            self_attention=False,
        )

    def _project(
        self,
        x: torch.Tensor,
        memory: torch.Tensor | None,
        cache: KVCache | None,
        positions: torch.Tensor | None,
        mask: AttentionMask,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per-head queries, keys and values (keys/values include the cached ones).

        Self-attention uses the fused ``in_proj``; cross-attention calls it (through
        ``__call__``, so hooks and adapters see it) on x, keeping the q columns, and on the
        memory, keeping the k, v columns (not once a cross-attention cache holds them). With
        ``mask.packing``, x is packed (1, N, D): its projections stay packed, (N, H, Dh) each,
        for variable-length attention (``mask.variable_length``), or are unpacked for the
        padded kernel. Keys no query may attend come back as zeros (:mod:`.attention_padding`).

        Shapes:
            x: (B, L, D); memory: (B, S, D); positions: (L,) or (B, L)
            returns: q (B, H, L, Dh), k (B, H, S, Dh), v (B, H, S, Dh); packed: (N, H, Dh)
        """
        if mask.packing is not None:  # x packed: (1, N, D); padding left out
            if memory is not None or cache is not None:
                raise ValueError("a packed mask is for uncached self-attention only")
            return self._packed_heads(self.in_proj(x), mask, positions)
        hidden = None if mask.allowed is None else hidden_keys(mask)  # (B|1, H|1, S, 1)
        if memory is None:
            qkv = split_heads(self.in_proj(x), 3 * self.n_heads)  # (B, 3H, L, Dh)
            qk, v = qkv.split([2 * self.n_heads, self.n_heads], dim=1)  # (B, 2H | H, L, Dh)
            if self.rotary is not None:  # queries and keys rotated in one call
                if cache is not None and cache.static and positions is None:
                    raise ValueError("a static cache holds no positions: pass positions")
                offset = 0 if cache is None or cache.static else cache.length  # static: positions
                qk = self.rotary(qk, offset=offset, positions=positions)  # (B, 2H, L, Dh)
            q, k = qk.split(self.n_heads, dim=1)  # (B, H, L, Dh) each
            if hidden is not None and not _writes_at_slots(cache):  # x's keys: the last L
                new = hidden[..., hidden.shape[-2] - k.shape[2] :, :]  # (B|1, H|1, L, 1)
                k, v = k.masked_fill(new, 0.0), v.masked_fill(new, 0.0)  # cached zeroed too
            if cache is not None:
                k, v = cache.append(k, v)  # (B, H, S, Dh), S = cached + L
            return q, k, v
        q = split_heads(self._cross_projection(x, "q"), self.n_heads)  # (B, H, L, Dh)
        if cache is not None and cache.length > 0:  # memory's keys/values computed at start
            return q, *cache.view()
        if hidden is not None:  # memory rows no query reads: zeros, in values and gradients
            memory = memory.masked_fill(hidden.all(dim=1), 0.0)  # (B, S, D)
        k, v = self._cross_projection(memory, "kv").chunk(2, dim=-1)  # (B, S, D) each
        k, v = split_heads(k, self.n_heads), split_heads(v, self.n_heads)  # (B, H, S, Dh)
        if cache is not None:
            k, v = cache.append(k, v)
        return q, k, v

    def _cross_projection(self, x: torch.Tensor, part: str) -> torch.Tensor:
        """``in_proj``'s q columns (``part="q"``) or k, v columns (``"kv"``) of x, through
        ``in_proj.__call__`` (so hooks and an adapter in its place apply) and sliced; where
        that call would run ``nn.Linear.forward`` alone (:func:`_plain_linear`), only the
        rows of W needed are multiplied.

        Shapes:
            x: (B, L, D); returns: (B, L, D) for "q", (B, L, 2D) for "kv"
        """
        columns = slice(None, self.d_model) if part == "q" else slice(self.d_model, None)
        if not _plain_linear(self.in_proj):
            return self.in_proj(x)[..., columns]  # (B, L, D | 2D)
        bias = self.in_proj.bias
        return F.linear(x, self.in_proj.weight[columns], None if bias is None else bias[columns])

    def _packed_heads(
        self, qkv: torch.Tensor, mask: AttentionMask, positions: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per-head q, k, v of packed projections: packed for variable-length attention, else
        in the padded layout; rotary applies to the packed rows (padding is not rotated).

        Shapes:
            qkv: (1, N, 3D); positions: (L,) or (B, L)
            returns: q, k, v (N, H, Dh) (``mask.variable_length``), else (B, H, L, Dh), zeros
            at padding
        """
        packing = mask.packing
        assert packing is not None  # for mypy: the caller's condition
        qk, v = qkv.split([2 * self.d_model, self.d_model], dim=-1)  # (1, N, 2D), (1, N, D)
        if self.rotary is not None:
            packed_positions = packing.positions(positions)  # (1, N)
            # by default each token's index in its padded row: below the padded length
            below = packing.length if positions is None else None
            heads = split_heads(qk, 2 * self.n_heads)  # (1, 2H, N, Dh)
            rotated = self.rotary(heads, positions=packed_positions, positions_below=below)
            qk = merge_heads(rotated)  # (1, N, 2D)
        if mask.variable_length:  # each row attends to its own packed tokens
            tokens = qk.shape[1]
            q, k = qk[0].view(tokens, 2 * self.n_heads, self.d_head).split(self.n_heads, dim=1)
            return q, k, v[0].view(tokens, self.n_heads, self.d_head)  # (N, H, Dh) each
        q, k = split_heads(packing.unpack(qk), 2 * self.n_heads).split(self.n_heads, dim=1)
        return q, k, split_heads(packing.unpack(v), self.n_heads)  # (B, H, L, Dh) each

    def _output(
        self, heads: torch.Tensor, mask: AttentionMask, guarded: torch.Tensor | None
    ) -> torch.Tensor:
        """The heads merged and projected; rows that see no key give zeros, and the
        ``guarded`` padding queries' rows are held (:func:`held_padding_rows`).

        Shapes:
            heads: (B, H, L, Dh); guarded: (B, L) or None
            returns: (B, L, D); packed: (1, N, D)
        """
        if guarded is not None:
            heads = held_padding_rows(heads, guarded)  # (B, H, L, Dh)
        if mask.dead is not None:
            heads = heads.masked_fill(mask.dead, 0.0)
        merged = merge_heads(heads)  # (B, L, D)
        if mask.packing is not None:
            merged = mask.packing.pack(merged)  # (1, N, D)
        out = self.out_proj(merged)  # (B, L, D), or packed (1, N, D)
        if mask.dead_rows is not None:
            out = out.masked_fill(mask.dead_rows, 0.0)
        return out

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, n_heads={self.n_heads}, dropout={self.dropout}"
