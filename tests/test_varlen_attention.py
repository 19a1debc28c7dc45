"""Variable-length attention over packed rows (``Encoder(unpad=True)``, addnorm.varlen_attention).

Oracle: the same stack run on the padded batch (``unpad=False``, same weights), whose
attention masks the padding keys: at the real tokens both compute the same attention, so
outputs and gradients agree to float32 rounding (``FLOAT32_MODEL``), and to float64 rounding
in float64 (``FLOAT64_EXACT``). What the variable-length paths (the CUDA kernel's, and
attention per row length) must not do is checked by watching every tensor torch builds,
forward and backward (a ``TorchDispatchMode``), and every SDPA call (a ``TorchFunctionMode``):
no padded (B, H, L, Dh) tensor in any layout, and attention over exactly the N real tokens,
row by row, with no mask. At this test's small widths the CPU would otherwise take one padded
call (``per_length_pays``), so the per-length path is chosen by setting a zero call cost.

The CUDA flash path cannot run here; its plumbing is checked by putting a reference kernel
with ``varlen_attn``'s documented contract in its place (each row's queries attend to the same
row's keys, rows delimited by ``cu_seqlens``, int32, with ``max_seqlen`` bounding every row).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from tolerances import FLOAT32_MODEL, FLOAT64_EXACT
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

import addnorm.varlen_attention as varlen
from addnorm.packing import Packing
from addnorm.rotary import RotaryEmbedding
from addnorm.transformer.config import LayerConfig
from addnorm.transformer.stacks import Encoder

# Sizes chosen so that no legitimate tensor can take a padded shape by coincidence: the
# padded heads (B, H, L, Dh) = (3, 5, 11, 8) in any order, or flattened (B L, H, Dh).
B, L, D, H, FF = 3, 11, 40, 5, 72
DH = D // H
PADDED_HEADS = sorted((B, H, L, DH))
FLAT_PADDED_HEADS = sorted((B * L, H, DH))
LENGTHS = {  # real tokens per row: right padding, left padding, equal lengths, an empty row
    "right": ([11, 7, 3], "right"),
    "left": ([4, 11, 9], "left"),
    "equal rows": ([6, 11, 6], "right"),
    "empty row": ([11, 0, 5], "right"),
}


def padding_of(lengths: list[int], side: str) -> torch.Tensor:
    """(B, L) True = padding, each row with ``lengths[b]`` real tokens on one side."""
    index = torch.arange(L)[None, :]
    real = torch.tensor(lengths)[:, None]
    return index >= real if side == "right" else index < L - real


class ShapeWatch(TorchDispatchMode):
    """Every shape torch builds (each aten op's tensor outputs), forward and backward."""

    def __init__(self) -> None:
        super().__init__()
        self.shapes: list[tuple[int, ...]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.shapes += [tuple(t.shape) for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        return out


class SdpaWatch(TorchFunctionMode):
    """The query, key and mask of every ``F.scaled_dot_product_attention`` call."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[tuple[int, ...], tuple[int, ...], object]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            mask = kwargs.get("attn_mask", args[3] if len(args) > 3 else None)
            self.calls.append((tuple(args[0].shape), tuple(args[1].shape), mask))
        return func(*args, **kwargs)


def twins(dtype: torch.dtype = torch.float32) -> tuple[Encoder, Encoder]:
    """A padded and an unpadded two-layer rotary encoder with the same weights."""
    torch.manual_seed(0)
    cfg = LayerConfig(D, H, FF)
    rope = RotaryEmbedding(DH)
    padded = Encoder(cfg, 2, rotary=rope).to(dtype)
    unpadded = Encoder(cfg, 2, rotary=rope, unpad=True).to(dtype)
    unpadded.load_state_dict(padded.state_dict())
    return padded, unpadded


def run_with_grads(model: Encoder, x: torch.Tensor, padding: torch.Tensor
                   ) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The output at the real tokens, and the gradients of a fixed loss on them."""
    x = x.clone().requires_grad_()
    real = ~padding[..., None]  # (B, L, 1)
    out = model(x, padding_mask=padding) * real
    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out.dtype)
    grads = torch.autograd.grad((out * weights).sum(), [x, *model.parameters()])
    return out.detach(), list(grads)


def use_path(path: str, monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
    """Send variable-length attention down ``path``; returns the flash kernel's calls."""
    calls: list[tuple] = []
    if path == "per length":  # every extra kernel call pays, at any size
        monkeypatch.setattr(varlen, "KERNEL_CALL_COST", 0)
    else:  # the CUDA kernel's place taken by its contract

        def kernel(*args):
            calls.append(args)
            return reference_varlen(*args)

        monkeypatch.setattr(varlen, "flash_varlen_applies", lambda q, dropout_p: True)
        monkeypatch.setattr(varlen, "flash_varlen_kernel", kernel)
    return calls


@pytest.mark.parametrize("path", ["per length", "flash kernel"])
@pytest.mark.parametrize("case", list(LENGTHS))
def test_packed_attention_builds_no_padded_heads_and_attends_over_the_real_tokens(
    case, path, monkeypatch
):
    lengths, side = LENGTHS[case]
    padding = padding_of(lengths, side)
    padded, unpadded = twins()
    x = torch.randn(B, L, D, generator=torch.Generator().manual_seed(0))
    kernel_calls = use_path(path, monkeypatch)
    shapes, sdpa = ShapeWatch(), SdpaWatch()
    with shapes, sdpa:
        got, got_grads = run_with_grads(unpadded, x, padding)
    want, want_grads = run_with_grads(padded, x, padding)

    assert not [s for s in shapes.shapes if sorted(s) in (PADDED_HEADS, FLAT_PADDED_HEADS)]
    if path == "per length":
        # every SDPA call: a dense block of whole rows, no mask; together exactly the N real
        # tokens of each layer (2 layers), so no padding key or query took part
        assert all(mask is None and q[0] == k[0] and q[2] == k[2] for q, k, mask in sdpa.calls)
        assert sum(q[0] * q[2] for q, _, _ in sdpa.calls) == 2 * sum(lengths)
        assert all(q[2] in lengths for q, _, _ in sdpa.calls)
    else:
        assert not sdpa.calls and len(kernel_calls) == 2  # one kernel call per layer
    torch.testing.assert_close(got, want, **FLOAT32_MODEL)
    assert not got.masked_select(padding[..., None]).any()  # zeros at padding
    for g, w in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(g, w, **FLOAT32_MODEL)


@pytest.mark.parametrize("path", ["per length", "flash kernel", "padded call"])
def test_every_path_gives_the_padded_encoders_values_in_float64(path, monkeypatch):
    """The three ways (the padded call is the default at these small widths) against the
    padded encoder, to float64 rounding, with rows of every kind at once."""
    if path != "padded call":
        use_path(path, monkeypatch)
    padding = torch.cat([padding_of([11, 7, 0], "right"), padding_of([4, 11, 9], "left")])
    torch.manual_seed(0)
    cfg = LayerConfig(D, H, FF)
    padded = Encoder(cfg, 2, rotary=RotaryEmbedding(DH)).double()
    unpadded = Encoder(cfg, 2, rotary=RotaryEmbedding(DH), unpad=True).double()
    unpadded.load_state_dict(padded.state_dict())
    x = torch.randn(6, L, D, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    real = ~padding[..., None]
    with torch.no_grad():
        torch.testing.assert_close(unpadded(x, padding_mask=padding) * real,
                                   padded(x, padding_mask=padding) * real, **FLOAT64_EXACT)


def bench_packing(batch: int, length: int, shortest: int) -> Packing:
    """Rows of uniform random length in [shortest, length], the longest one full."""
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(shortest, length + 1, (batch,), generator=gen)
    lengths[0] = length
    return Packing.from_padding(torch.arange(length)[None, :] >= lengths[:, None])


def test_attention_goes_per_length_where_the_calls_pay():
    # the GPU suite's BERT-base batch (12 heads of 64, rows of 38-128) and MiniLM's sentences
    assert varlen.per_length_pays(bench_packing(64, 128, 38), n_heads=12, d_head=64)
    assert varlen.per_length_pays(bench_packing(32, 64, 8), n_heads=12, d_head=32)
    # the date translator's sources (4 heads of 16, rows of 6-32): one padded call
    assert not varlen.per_length_pays(bench_packing(64, 32, 6), n_heads=4, d_head=16)
    # one length only: no extra call, always per length
    assert varlen.per_length_pays(Packing.from_padding(padding_of([5, 5, 0], "right")),
                                  n_heads=1, d_head=1)


def reference_varlen(q, k, v, cu_q, cu_k, max_q, max_k):
    """``varlen_attn``'s contract computed row by row from ``cu_seqlens`` (float64, explicit
    softmax), after checking the arguments as the CUDA kernel requires them."""
    assert q.ndim == k.ndim == v.ndim == 3 and q.shape[1:] == (H, DH)
    assert q.stride(-1) == k.stride(-1) == v.stride(-1) == 1
    assert cu_q.dtype == cu_k.dtype == torch.int32 and torch.equal(cu_q, cu_k)
    bounds = cu_q.tolist()
    assert bounds[0] == 0 and bounds[-1] == q.shape[0]
    rows = list(zip(bounds[:-1], bounds[1:], strict=True))
    assert max(stop - start for start, stop in rows) <= min(max_q, max_k)
    out = torch.zeros(q.shape, dtype=torch.float64)
    for start, stop in rows:
        q_b, k_b, v_b = (t[start:stop].double().transpose(0, 1) for t in (q, k, v))  # (H, l, Dh)
        weights = (q_b @ k_b.transpose(-2, -1) / math.sqrt(DH)).softmax(dim=-1)
        out[start:stop] = (weights @ v_b).transpose(0, 1)
    return out.to(q.dtype)


def test_the_flash_kernel_is_chosen_only_where_it_runs():
    cpu = torch.zeros(4, H, DH, dtype=torch.bfloat16)
    assert not varlen.flash_varlen_applies(cpu, 0.0)  # the CPU takes the grouped path
    meta = torch.empty(4, H, DH, dtype=torch.bfloat16, device="meta")
    assert not varlen.flash_varlen_applies(meta, 0.0)


def test_rows_by_length_groups_whole_rows_in_packed_order():
    padding = padding_of([4, 11, 4], "left")
    packing = Packing.from_padding(padding)
    order, groups = packing.rows_by_length
    assert groups == ((4, 2), (11, 1))
    token_rows = packing.index // L  # (N,) each packed token's row
    assert order is not None
    assert token_rows[order].tolist() == [0] * 4 + [2] * 4 + [1] * 11
    assert torch.equal(packing.cu_lengths, torch.tensor([0, 4, 15, 19], dtype=torch.int32))
    in_order = Packing.from_padding(padding_of([3, 3, 11], "right"))
    assert in_order.rows_by_length == (None, ((3, 2), (11, 1)))


def sdpa_masks(call) -> list[tuple[object, bool]]:
    """(attn_mask, is_causal) of every SDPA call made by ``call()``."""
    masks: list[tuple[object, bool]] = []

    class Watch(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func is F.scaled_dot_product_attention:
                masks.append((kwargs.get("attn_mask"), bool(kwargs.get("is_causal"))))
            return func(*args, **kwargs)

    with Watch(), torch.no_grad():
        call()
    return masks


def test_no_padded_row_means_no_mask_for_sdpa_the_flash_kernels_condition():
    """SDPA's flash kernel takes no mask: a batch with no padding token, whether its padding
    mask is given (all False) or found from ``pad_id``, reaches every SDPA call maskless
    (self-attention plain or ``is_causal``, cross-attention plain)."""
    import addnorm

    torch.manual_seed(0)
    ids = torch.randint(1, 50, (3, 9))  # no pad_id (0) among them
    no_padding = torch.zeros(3, 9, dtype=torch.bool)
    encoder = addnorm.EncoderModel(addnorm.EncoderConfig(
        vocab_size=50, d_model=16, n_heads=2, n_layers=2, d_ff=32, pad_id=0)).eval()
    unpadded = addnorm.EncoderModel(addnorm.EncoderConfig(
        vocab_size=50, d_model=16, n_heads=2, n_layers=2, d_ff=32, pad_id=0, unpad=True)).eval()
    lm = addnorm.TransformerLM(addnorm.LMConfig(
        vocab_size=50, d_model=16, n_heads=2, n_layers=2, d_ff=32, pad_id=0)).eval()
    seq2seq = addnorm.Transformer(addnorm.TransformerConfig(
        src_vocab_size=50, tgt_vocab_size=50, d_model=16, n_heads=2, n_encoder_layers=2,
        n_decoder_layers=2, d_ff=32, pad_id=0)).eval()
    calls = {
        "encoder, padding from pad_id": lambda: encoder(ids),
        "encoder, padding mask given": lambda: encoder(ids, padding_mask=no_padding),
        "unpadded encoder": lambda: unpadded(ids, padding_mask=no_padding),
        "LM": lambda: lm(ids, padding_mask=no_padding),
        "encoder-decoder": lambda: seq2seq(ids, ids[:, :5]),
    }
    for name, call in calls.items():
        masks = sdpa_masks(call)
        assert masks, name
        assert all(mask is None for mask, _ in masks), name
    assert all(causal for _, causal in sdpa_masks(calls["LM"]))
    padded_ids = ids.clone()
    padded_ids[1, 6:] = 0  # the watch does see a mask where a row is padded
    assert all(mask is not None for mask, _ in sdpa_masks(lambda: encoder(padded_ids)))
