"""Numerics at the edges: what padding holds, float16, and hooks on cross-attention.

The padding contract (docs/design.md): ``padding_mask`` True = padding, ignored as a key and
left out of BatchNorm / GroupNorm statistics; a row whose keys are all masked returns zeros.
Here the padding holds NaN, inf or 1e30 and every real output (and, where the module can
promise it, every gradient of a loss on real outputs) must equal a clean run in which the
padding holds ordinary finite values.

Provenance of the expected values: the clean run of the same module with the same weights
(an identity: padding takes no part in a real output, so the two runs perform the same
floating-point operations on the same real values). The comparisons are therefore bitwise
(``torch.equal``): the computations differ only in values that the code selects out with
``torch.where``, never in the order of any reduction, and the shapes are the same.

What self-attention cannot promise (documented in ``addnorm.attention``): its padding tokens
are also queries whose outputs torch.nn defines, computed by the same projections as the real
tokens', so the projections' weight gradients sum ``0 * NaN`` over padding rows. Its real
outputs and the real inputs' gradients (and, in a stack, a decoder memory's) are checked with
NaN and inf; its parameter gradients with finite padding of any size; the packed path
(``Encoder(unpad=True)``), which never touches padding, with NaN throughout. LayerNorm, which
ignores the mask, likewise: its real outputs and input gradients ignore padding, its ``weight``
gradient only finite padding.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from properties import examples
from tolerances import FLOAT64_EXACT, u
from torch import nn

import addnorm
from addnorm.attention import MultiHeadAttention
from addnorm.cache import KVCache
from addnorm.norms import BatchNorm, GroupNorm, LayerNorm
from addnorm.rotary import RotaryEmbedding
from addnorm.transformer.config import LayerConfig
from addnorm.transformer.stacks import Decoder, Encoder

D, H = 8, 2
POISONS = [float("nan"), float("inf"), float("-inf"), 1e30]
# tests/properties.py: bounded and derandomized by default, the same examples everywhere.
BOUNDED = examples(15)
STACKS = examples(8)  # a two-layer stack per example: fewer of them


@st.composite
def padded_batches(draw: st.DrawFn, *, max_batch: int = 4, max_len: int = 6) -> torch.Tensor:
    """A (B, L) padding mask, True = padding: any pattern, all-padding rows and B == L among
    them (the draw shrinks towards B == L when asked)."""
    batch = draw(st.integers(1, max_batch))
    length = batch if draw(st.booleans()) else draw(st.integers(1, max_len))
    rows = draw(
        st.lists(
            st.lists(st.booleans(), min_size=length, max_size=length),
            min_size=batch, max_size=batch,
        )
    )
    return torch.tensor(rows, dtype=torch.bool).reshape(batch, length)


def tensors(shape: tuple[int, ...], seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen).to(dtype)


def poisoned(x: torch.Tensor, padding_mask: torch.Tensor, value: float) -> torch.Tensor:
    """x with every padding position set to ``value`` (selected, so x's real values stay);
    a value past the dtype's range rounds to inf, as a cast would."""
    fill = torch.tensor(value, dtype=torch.float64).to(x.dtype)
    return torch.where(padding_mask[..., None], fill, x)


def grads(module: nn.Module, *inputs: torch.Tensor) -> list[torch.Tensor | None]:
    return [t.grad for t in inputs] + [p.grad for p in module.parameters()]


def assert_equal_where_real(a: torch.Tensor, b: torch.Tensor, real: torch.Tensor) -> None:
    """Bitwise equality at the real positions (see the module docstring for why bitwise)."""
    assert torch.equal(a[real], b[real]), (a[real] - b[real]).abs().max()


def backward_on_real(out: torch.Tensor, real: torch.Tensor, seed: int) -> None:
    """A loss on the real outputs only: a fixed random weighting of them."""
    weights = tensors(tuple(out.shape), seed).to(out.dtype)
    (torch.where(real[..., None], out * weights, torch.zeros_like(out))).sum().backward()


def clean_and_poisoned_runs(make, run, x_clean, x_bad):
    """Run ``run`` on two identical modules; return both modules, inputs and outputs."""
    torch.manual_seed(0)
    clean_module = make()
    bad_module = make()
    bad_module.load_state_dict(clean_module.state_dict())
    x_clean = x_clean.clone().requires_grad_()
    x_bad = x_bad.clone().requires_grad_()
    return (clean_module, x_clean, run(clean_module, x_clean)), (bad_module, x_bad,
                                                                run(bad_module, x_bad))


# ------------------------------------------------------------------------- attention


@BOUNDED
@given(padding=padded_batches(), poison=st.sampled_from(POISONS),
       dtype=st.sampled_from([torch.float32, torch.float16]), seed=st.integers(0, 2**16))
def test_self_attention_real_outputs_ignore_what_padding_holds(padding, poison, dtype, seed):
    torch.manual_seed(seed)
    attention = MultiHeadAttention(D, H).to(dtype)
    x = tensors((*padding.shape, D), seed, dtype)
    real = ~padding
    for call in (lambda t: attention(t, padding_mask=padding),
                 lambda t: attention(t, padding_mask=padding, causal=True),
                 lambda t: attention.forward_with_weights(t, padding_mask=padding)[0]):
        clean, bad = call(x), call(poisoned(x, padding, poison))
        assert_equal_where_real(bad, clean, real)
        assert torch.isfinite(clean[real]).all()
        # A row whose keys are all padding returns zeros (its queries are padding too here).
        assert torch.equal(clean[padding.all(1)], torch.zeros_like(clean[padding.all(1)]))


@BOUNDED
@given(padding=padded_batches(), scale=st.sampled_from([1.0, 1e3]), seed=st.integers(0, 2**16))
def test_self_attention_gradients_ignore_finite_padding_of_any_size(padding, scale, seed):
    """Two different finite paddings: the real outputs' gradients w.r.t. the real inputs and
    every parameter are the same (0 * finite is 0 exactly, so bitwise)."""
    real = ~padding
    x = tensors((*padding.shape, D), seed)
    other = torch.where(padding[..., None], tensors(tuple(x.shape), seed + 1) * scale, x)
    runs = clean_and_poisoned_runs(
        lambda: MultiHeadAttention(D, H).double(),
        lambda m, t: m(t, padding_mask=padding),
        x.double(), other.double(),
    )
    for _module, _inp, out in runs:
        backward_on_real(out, real, seed + 2)
    (m1, x1, y1), (m2, x2, y2) = runs
    assert_equal_where_real(y2, y1, real)
    assert_equal_where_real(x2.grad, x1.grad, real)
    for p1, p2 in zip(m1.parameters(), m2.parameters(), strict=True):
        assert torch.equal(p1.grad, p2.grad)


SELF_ATTENTION_CALLS = {
    "plain": lambda m, t, p: m(t, padding_mask=p),
    "causal": lambda m, t, p: m(t, padding_mask=p, causal=True),
    "weights": lambda m, t, p: m.forward_with_weights(t, padding_mask=p, causal=True)[0],
    "cached": lambda m, t, p: m(
        t, padding_mask=p, cache=KVCache(t.shape[0], H, t.shape[1], D // H, dtype=t.dtype)
    ),
}


@BOUNDED
@given(padding=padded_batches(), poison=st.sampled_from(POISONS),
       call=st.sampled_from(sorted(SELF_ATTENTION_CALLS)), rotary=st.booleans(),
       dtype=st.sampled_from([torch.float32, torch.float64]), seed=st.integers(0, 2**16))
def test_self_attention_input_gradients_ignore_what_padding_holds(
    padding, poison, call, rotary, dtype, seed
):
    """NaN, inf or 1e30 at padding: the real outputs and the real inputs' gradients of a loss
    on the real outputs are the clean run's, bitwise (padding queries' rows are detached and
    their non-finite entries selected out, so they add exact zeros to the real keys')."""
    real = ~padding
    x = tensors((*padding.shape, D), seed, dtype)
    runs = clean_and_poisoned_runs(
        lambda: MultiHeadAttention(
            D, H, rotary=RotaryEmbedding(D // H) if rotary else None
        ).to(dtype),
        lambda m, t: SELF_ATTENTION_CALLS[call](m, t, padding),
        x, poisoned(x, padding, poison),
    )
    for _module, _inp, out in runs:
        backward_on_real(out, real, seed + 1)
    (m1, x1, y1), (m2, x2, y2) = runs
    assert_equal_where_real(y2, y1, real)
    assert_equal_where_real(x2.grad, x1.grad, real)
    assert torch.isfinite(x2.grad[real]).all()
    assert torch.equal(m2.out_proj.weight.grad, m1.out_proj.weight.grad)


def test_compiled_self_attention_gradients_ignore_nan_padding():
    """The same under ``torch.compile(fullgraph=True)``: the compiled forward and backward give
    the eager run's real outputs and real-input gradients (one graph, no break)."""
    padding = torch.tensor([[False, False, False, True, True], [False] * 5])
    x = poisoned(tensors((2, 5, D), 3), padding, float("nan"))
    torch.manual_seed(0)
    attention = MultiHeadAttention(D, H)
    compiled = torch.compile(lambda t: attention(t, padding_mask=padding), fullgraph=True,
                             backend="eager")
    results = []
    for call in (lambda t: attention(t, padding_mask=padding), compiled):
        inp = x.clone().requires_grad_()
        out = call(inp)
        backward_on_real(out, ~padding, 4)
        results.append((out.detach(), inp.grad))
    (eager_out, eager_grad), (out, grad) = results
    assert_equal_where_real(out, eager_out, ~padding)
    assert_equal_where_real(grad, eager_grad, ~padding)
    assert torch.isfinite(grad[~padding]).all()


def decoder(norm: str) -> Decoder:
    cfg = LayerConfig(d_model=D, n_heads=H, d_ff=16, norm=norm, norm_position="pre")
    return Decoder(cfg, 2).double()


@STACKS
@given(padding=padded_batches(), poison=st.sampled_from(POISONS),
       norm=st.sampled_from(["layer", "batch", "rms"]), seed=st.integers(0, 2**16))
def test_padded_stacks_input_gradients_ignore_what_padding_holds(padding, poison, norm, seed):
    """An Encoder (padded path) and a Decoder whose target and memory padding hold NaN, inf or
    1e30: the real outputs and the real inputs' gradients, the memory's included (the
    decoder's padding queries also attend to it), are the clean run's, bitwise."""
    if norm == "batch" and int((~padding).sum()) < 2:
        return  # BatchNorm refuses fewer than 2 real tokens in training (test_masked_norms.py)
    real = ~padding
    x = tensors((*padding.shape, D), seed).double()
    runs = clean_and_poisoned_runs(
        lambda: encoder(norm, unpad=False),
        lambda m, t: m(t, padding_mask=padding),
        x, poisoned(x, padding, poison),
    )
    memory_padding = padding.flip(0)  # another pattern, same shape
    memory = tensors(tuple(x.shape), seed + 2).double()
    memories = iter([memory, poisoned(memory, memory_padding, poison)])
    given_memories = []

    def run_decoder(module: Decoder, target: torch.Tensor) -> torch.Tensor:
        given_memories.append(next(memories).requires_grad_())
        return module(target, given_memories[-1], padding_mask=padding,
                      memory_padding_mask=memory_padding)

    runs += clean_and_poisoned_runs(
        lambda: decoder(norm), run_decoder, x, poisoned(x, padding, poison)
    )
    for _module, _inp, out in runs:
        backward_on_real(out, real, seed + 1)
    for (_, x1, y1), (_, x2, y2) in (runs[:2], runs[2:]):
        assert_equal_where_real(y2, y1, real)
        assert_equal_where_real(x2.grad, x1.grad, real)
        assert torch.isfinite(x2.grad[real]).all()
    clean_memory, bad_memory = given_memories
    assert_equal_where_real(bad_memory.grad, clean_memory.grad, ~memory_padding)
    assert torch.isfinite(bad_memory.grad[~memory_padding]).all()


@BOUNDED
@given(memory_padding=padded_batches(), poison=st.sampled_from(POISONS),
       query_len=st.integers(1, 4), cached=st.booleans(), seed=st.integers(0, 2**16))
def test_cross_attention_outputs_and_gradients_ignore_what_memory_padding_holds(
    memory_padding, poison, query_len, cached, seed
):
    """Memory padding is only ever a key: outputs and every gradient are the clean run's."""
    batch, mem_len = memory_padding.shape
    x = tensors((batch, query_len, D), seed)
    memory = tensors((batch, mem_len, D), seed + 1)

    def run(module, mem):
        cache = KVCache(batch, H, mem_len, D // H) if cached else None
        out = module(x_in, mem, padding_mask=memory_padding, cache=cache)
        if cached:  # the second call reads the keys and values the first one stored
            out = out + module(x_in, mem, padding_mask=memory_padding, cache=cache)
        return out

    x_in = x.clone().requires_grad_()
    torch.manual_seed(seed)
    clean_module = MultiHeadAttention(D, H)
    bad_module = MultiHeadAttention(D, H)
    bad_module.load_state_dict(clean_module.state_dict())
    mem_clean = memory.clone().requires_grad_()
    mem_bad = poisoned(memory, memory_padding, poison).requires_grad_()
    clean = run(clean_module, mem_clean)
    clean.sum().backward()
    clean_grads = grads(clean_module, x_in, mem_clean)
    x_in = x.clone().requires_grad_()
    bad = run(bad_module, mem_bad)
    bad.sum().backward()
    bad_grads = grads(bad_module, x_in, mem_bad)
    assert torch.equal(bad, clean)
    assert torch.isfinite(clean).all()
    dead = memory_padding.all(1)  # rows that see no key: zeros
    assert torch.equal(clean[dead], torch.zeros_like(clean[dead]))
    real_keys = ~memory_padding
    assert torch.equal(bad_grads[1][real_keys], clean_grads[1][real_keys])
    padding_grad = bad_grads[1][memory_padding]
    assert torch.equal(padding_grad, torch.zeros_like(padding_grad))
    others = zip([bad_grads[0], *bad_grads[2:]], [clean_grads[0], *clean_grads[2:]], strict=True)
    for got, expected in others:
        assert torch.equal(got, expected)


def test_cross_attention_weights_ignore_what_memory_padding_holds():
    memory_padding = torch.tensor([[False, False, True, True], [True] * 4, [False] * 4])
    attention = MultiHeadAttention(D, H)
    x, memory = tensors((3, 2, D), 1), tensors((3, 4, D), 2)
    for poison in POISONS:
        bad_memory = poisoned(memory, memory_padding, poison)
        out, weights = attention.forward_with_weights(x, bad_memory, padding_mask=memory_padding)
        clean_out, clean_weights = attention.forward_with_weights(
            x, memory, padding_mask=memory_padding
        )
        assert torch.equal(out, clean_out) and torch.equal(weights, clean_weights)
        assert torch.equal(weights[1], torch.zeros_like(weights[1]))  # no key: zero weights


def encoder(norm: str, unpad: bool) -> Encoder:
    cfg = LayerConfig(d_model=D, n_heads=H, d_ff=16, norm=norm)
    return Encoder(cfg, 2, unpad=unpad).double()


@STACKS
@given(padding=padded_batches(), poison=st.sampled_from(POISONS),
       norm=st.sampled_from(["layer", "batch", "rms"]), seed=st.integers(0, 2**16))
def test_padded_encoder_real_outputs_ignore_what_padding_holds(padding, poison, norm, seed):
    """The padded path (no packing) in training mode: attention, Add & Norm, FFN."""
    if norm == "batch" and int((~padding).sum()) < 2:
        return  # BatchNorm refuses fewer than 2 real tokens in training (test_masked_norms.py)
    x = tensors((*padding.shape, D), seed).double()
    torch.manual_seed(seed)
    stack = encoder(norm, unpad=False)
    clean = stack(x, padding_mask=padding)
    bad = stack(poisoned(x, padding, poison), padding_mask=padding)
    assert_equal_where_real(bad, clean, ~padding)


@STACKS
@given(padding=padded_batches(), poison=st.sampled_from(POISONS), seed=st.integers(0, 2**16))
def test_packed_encoder_outputs_and_gradients_ignore_what_padding_holds(padding, poison, seed):
    """The unpadded path never reads padding: outputs and every gradient are the clean run's
    (padding outputs are zeros there, and padding inputs get zero gradient)."""
    x = tensors((*padding.shape, D), seed).double()
    runs = clean_and_poisoned_runs(
        lambda: encoder("layer", unpad=True),
        lambda m, t: m(t, padding_mask=padding),
        x, poisoned(x, padding, poison),
    )
    for _module, _inp, out in runs:
        backward_on_real(out, ~padding, seed + 1)
    (m1, x1, y1), (m2, x2, y2) = runs
    assert torch.equal(y2, y1)
    assert torch.equal(x2.grad, x1.grad)
    for p1, p2 in zip(m1.parameters(), m2.parameters(), strict=True):
        assert torch.equal(p1.grad, p2.grad)


# ------------------------------------------------------------------------- norms


def norm_runs(make, padding, poison, seed, *, train=True):
    """A norm on clean and poisoned input, both backpropagated from the real outputs."""
    x = tensors((*padding.shape, D), seed).double() * 3 + 1
    runs = clean_and_poisoned_runs(
        lambda: make().double().train(train),
        lambda m, t: m(t, padding_mask=padding),
        x, poisoned(x, padding, poison),
    )
    for _module, _inp, out in runs:
        backward_on_real(out, ~padding, seed + 1)
    return runs


@BOUNDED
@given(padding=padded_batches(), poison=st.sampled_from(POISONS), train=st.booleans(),
       seed=st.integers(0, 2**16))
def test_batchnorm_outputs_and_gradients_ignore_what_padding_holds(padding, poison, train, seed):
    if train and int((~padding).sum()) < 2:
        return  # refused in training: fewer than 2 real values per feature (test_masked_norms.py)
    runs = norm_runs(lambda: BatchNorm(D), padding, poison, seed, train=train)
    (m1, x1, y1), (m2, x2, y2) = runs
    real = ~padding
    assert_equal_where_real(y2, y1, real)
    assert_equal_where_real(x2.grad, x1.grad, real)
    assert torch.equal(m2.weight.grad, m1.weight.grad)
    assert torch.equal(m2.bias.grad, m1.bias.grad)
    assert torch.equal(m2.running_mean, m1.running_mean)
    assert torch.equal(m2.running_var, m1.running_var)
    assert torch.isfinite(m1.weight.grad).all() and torch.isfinite(x1.grad[real]).all()


@BOUNDED
@given(padding=padded_batches(), poison=st.sampled_from(POISONS),
       n_groups=st.sampled_from([1, 2, 8]), seed=st.integers(0, 2**16))
def test_groupnorm_outputs_and_gradients_ignore_what_padding_holds(padding, poison, n_groups,
                                                                   seed):
    runs = norm_runs(lambda: GroupNorm(n_groups, D), padding, poison, seed)
    (m1, x1, y1), (m2, x2, y2) = runs
    real = ~padding
    assert_equal_where_real(y2, y1, real)
    assert_equal_where_real(x2.grad, x1.grad, real)
    assert torch.equal(m2.weight.grad, m1.weight.grad)
    assert torch.equal(m2.bias.grad, m1.bias.grad)
    assert torch.isfinite(m1.weight.grad).all() and torch.isfinite(x1.grad[real]).all()


@pytest.mark.parametrize("kind", ["batch", "group"])
def test_masked_norm_padding_outputs_keep_their_gradient_to_their_own_input(kind):
    """Padding is normalized with the real tokens' statistics, held constant: d y_pad / d x_pad
    is weight / sqrt(var + eps), and a loss on padding outputs moves no parameter."""
    norm = (BatchNorm(D) if kind == "batch" else GroupNorm(1, D)).double()
    padding = torch.tensor([[False, False, True], [False, True, True]])
    x = (tensors((2, 3, D), 5).double() * 2).requires_grad_()
    y = norm(x, padding_mask=padding)
    y[padding].sum().backward()
    real = x.detach()[~padding] if kind == "batch" else x.detach()[0, :2]
    var = real.var(dim=0 if kind == "batch" else None, correction=0)
    slope = norm.weight.detach() / torch.sqrt(var + norm.eps)  # (D,) or broadcast scalar
    if kind == "batch":
        torch.testing.assert_close(x.grad[padding], slope.expand(3, D), **FLOAT64_EXACT)
    else:  # sample 0's one padding token; sample 1's padding uses sample 1's statistics
        torch.testing.assert_close(x.grad[0, 2], slope.expand(D), **FLOAT64_EXACT)
    assert torch.equal(x.grad[~padding], torch.zeros_like(x.grad[~padding]))
    assert torch.equal(norm.weight.grad, torch.zeros(D, dtype=torch.float64))


@BOUNDED
@given(padding=padded_batches(), poison=st.sampled_from(POISONS), seed=st.integers(0, 2**16))
def test_layernorm_real_outputs_and_input_gradients_ignore_what_padding_holds(padding, poison,
                                                                              seed):
    runs = norm_runs(lambda: LayerNorm(D), padding, poison, seed)
    (m1, x1, y1), (m2, x2, y2) = runs
    real = ~padding
    assert_equal_where_real(y2, y1, real)
    assert_equal_where_real(x2.grad, x1.grad, real)
    assert torch.equal(m2.bias.grad, m1.bias.grad)


@BOUNDED
@given(padding=padded_batches(), seed=st.integers(0, 2**16))
def test_layernorm_weight_gradient_ignores_finite_padding(padding, seed):
    """gamma's gradient sums g * x_hat over every token; at padding g = 0, so any finite
    padding adds exact zeros (NaN would add 0 * NaN: the documented limit)."""
    runs = norm_runs(lambda: LayerNorm(D), padding, 1e30, seed)
    (m1, _, _), (m2, _, _) = runs
    assert torch.equal(m2.weight.grad, m1.weight.grad)


# ------------------------------------------------------------------------- float16


def test_float16_weights_path_is_finite_where_forward_is():
    """Inputs of std 100: float16 scores q.k reach ~1e5 > 65504. The weights path computes in
    float32 like SDPA's kernel, so both outputs are finite and each weights row sums to 1."""
    torch.manual_seed(0)
    attention = MultiHeadAttention(64, 2).half()
    x = (tensors((2, 6, 64), 3) * 100).half()
    padding = torch.zeros(2, 6, dtype=torch.bool)
    padding[0, 4:] = True
    out, weights = attention.forward_with_weights(x, padding_mask=padding)
    assert torch.isfinite(attention(x, padding_mask=padding)).all()
    assert torch.isfinite(out).all() and torch.isfinite(weights).all()
    assert out.dtype == weights.dtype == torch.float16
    # Each of the 6 weights is a float32 value rounded once: the sum is off by at most
    # 6 * u(float16) relative to 1, plus the float16 rounding of the sum itself.
    row_sums = weights.float().sum(-1)
    assert (row_sums - 1).abs().max() <= 7 * u(torch.float16)
    assert torch.equal(weights[0, ..., 4:], torch.zeros_like(weights[0, ..., 4:]))


def test_float16_weights_path_equals_forward_to_float16_rounding():
    """Unit-scale inputs, same module: forward (SDPA) and the weights path compute the heads
    in float32 from the same float16 q, k, v and round them once, so the heads differ by at
    most 2 u |h| and the float16 out_proj maps that to <= 2 u (|W_o| |h|) plus the rounding
    of the two outputs (u |y| each); a factor of 2 covers the float32 arithmetic."""
    torch.manual_seed(0)
    attention = MultiHeadAttention(16, 2).half()
    x = tensors((2, 5, 16), 4).half()
    padding = torch.tensor([[False] * 3 + [True] * 2, [False] * 5])
    out, weights = attention.forward_with_weights(x, padding_mask=padding)
    expected = attention(x, padding_mask=padding)
    heads = (weights.float() @ attention.in_proj(x).float()[..., 32:].unflatten(-1, (2, 8))
             .transpose(1, 2))  # (B, H, L, Dh), float32
    merged = heads.transpose(1, 2).flatten(-2).abs()  # (B, L, D)
    w_o = attention.out_proj.weight.float().abs()
    bound = 2 * u(torch.float16) * (2 * merged @ w_o.T + 2 * expected.float().abs()) + 1e-7
    assert ((out.float() - expected.float()).abs() <= bound).all()


def test_float16_batchnorm_keeps_float32_running_statistics():
    """One batch of std ~1000 (variance ~1e6): momentum 0.1 takes the running variance to
    ~1e5, past float16's 65504 (nn.BatchNorm1d cast to float16 stores inf there). Ours keeps
    float32 buffers after .half() and equals a float32 module fed the same float16 batch
    (the same float32 arithmetic: bitwise)."""
    half, wide = BatchNorm(D).half(), BatchNorm(D)
    assert half.running_var.dtype == torch.float32 and half.weight.dtype == torch.float16
    x = (tensors((32, D), 6) * 1000).half()
    y_half, y_wide = half(x), wide(x)
    assert torch.isfinite(half.running_var).all() and half.running_var.max() > 65504
    assert torch.equal(half.running_var, wide.running_var)
    assert torch.equal(half.running_mean, wide.running_mean)
    assert torch.equal(y_half, y_wide)
    half.eval(), wide.eval()
    assert torch.equal(half(x), wide(x))
    # The buffers follow wider casts and device moves, and the state dict loads both ways.
    assert half.double().running_var.dtype == torch.float64
    ref = nn.BatchNorm1d(D).half()
    ref.load_state_dict(wide.state_dict())
    back = BatchNorm(D).half()
    back.load_state_dict(ref.state_dict())
    assert back.running_var.dtype == torch.float32
    torch.testing.assert_close(back.running_var, ref.running_var.float(), rtol=0, atol=0)


# ------------------------------------------------------------------------- cross-attention hooks


def tiny_transformer() -> addnorm.Transformer:
    torch.manual_seed(0)
    return addnorm.Transformer(dataclasses.replace(addnorm.PRESETS["tiny"], dropout=0.0))


def test_a_forward_hook_on_every_linear_fires_in_self_and_cross_attention():
    model = tiny_transformer()
    calls: dict[str, int] = {}
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear):
            module.register_forward_hook(
                lambda m, args, out, name=name: calls.__setitem__(name, calls.get(name, 0) + 1)
            )
    src = torch.randint(3, 128, (2, 7), generator=torch.Generator().manual_seed(1))
    model(src, src[:, :5])
    linears = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    assert set(calls) == set(linears), sorted(set(linears) - set(calls))
    cross = [n for n in linears if ".cross_attn.in_proj" in n]
    assert cross, "the decoder has cross-attention projections"
    for name in cross:  # called on the queries, then on the memory: 2 calls
        assert calls[name] == 2, (name, calls[name])
    for name in (n for n in linears if ".self_attn.in_proj" in n):
        assert calls[name] == 1, (name, calls[name])


class LowRankDelta(nn.Module):
    """A LoRA-style wrapper: ``base(x) + x A^T B^T``, the delta of rank r on W."""

    def __init__(self, base: nn.Linear, rank: int, seed: int) -> None:
        super().__init__()
        self.base = base
        gen = torch.Generator().manual_seed(seed)
        f64 = torch.float64
        self.a = nn.Parameter(torch.randn(rank, base.in_features, generator=gen, dtype=f64))
        self.b = nn.Parameter(torch.randn(base.out_features, rank, generator=gen, dtype=f64))

    @property
    def weight(self) -> torch.Tensor:
        """The base layer's, as PEFT's LoRA layers expose it (read for dtype checks)."""
        return self.base.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + x @ self.a.T @ self.b.T


@pytest.mark.parametrize("cached", [False, True])
def test_a_low_rank_adapter_on_in_proj_changes_cross_attention_like_merged_weights(cached):
    """Oracle: the same attention with W + B A merged into in_proj (same function)."""
    torch.manual_seed(0)
    attention = MultiHeadAttention(D, H).double()
    merged = MultiHeadAttention(D, H).double()
    merged.load_state_dict(attention.state_dict())
    x, memory = tensors((2, 3, D), 7).double(), tensors((2, 5, D), 8).double()
    padding = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
    before = attention(x, memory, padding_mask=padding)
    adapter = LowRankDelta(attention.in_proj, rank=2, seed=9)
    attention.in_proj = adapter  # type: ignore[assignment]
    with torch.no_grad():
        merged.in_proj.weight += adapter.b @ adapter.a

    def call(module):
        cache = KVCache(2, H, 5, D // H, dtype=torch.float64) if cached else None
        out = module(x, memory, padding_mask=padding, cache=cache)
        return module(x, memory, padding_mask=padding, cache=cache) if cached else out

    after = call(attention)
    assert not torch.allclose(after, before)  # the adapter reached the cross-attention
    torch.testing.assert_close(after, call(merged), **FLOAT64_EXACT)
    assert torch.isfinite(after).all()


@pytest.mark.parametrize("bias", [True, False])
def test_cross_attention_through_hooked_in_proj_equals_the_plain_path(bias):
    """With a hook (which must fire) in_proj is called and sliced; without, its rows are
    multiplied directly: the same function (float64, so equal to rounding: FLOAT64_EXACT)."""
    torch.manual_seed(0)
    attention = MultiHeadAttention(D, H, bias=bias).double()
    x, memory = tensors((2, 3, D), 10).double(), tensors((2, 5, D), 11).double()
    padding = torch.tensor([[False] * 5, [False] * 2 + [True] * 3])
    plain = attention(x, memory, padding_mask=padding)
    seen: list[tuple[int, ...]] = []
    attention.in_proj.register_forward_hook(lambda m, args, out: seen.append(tuple(out.shape)))
    hooked = attention(x, memory, padding_mask=padding)
    assert seen == [(2, 3, 3 * D), (2, 5, 3 * D)]  # the queries' call, then the memory's
    torch.testing.assert_close(hooked, plain, **FLOAT64_EXACT)


def test_a_frozen_decoder_keeps_nan_target_padding_out_of_the_memorys_gradient():
    """Only the memory asks for a gradient (a frozen decoder on a trained encoder): the
    decoder's padding queries are still kept out of the backward pass, so the memory's real
    rows get the gradient they get with clean padding."""
    torch.manual_seed(0)
    stack = decoder("layer").requires_grad_(False)
    padding = torch.tensor([[False, False, True], [False, True, True]])
    x = tensors((2, 3, D), 1).double()
    memory = tensors((2, 4, D), 2).double()
    grads_of = []
    for fill in (0.0, float("nan")):
        mem = memory.clone().requires_grad_()
        out = stack(poisoned(x, padding, fill), mem, padding_mask=padding)
        backward_on_real(out, ~padding, 3)
        grads_of.append(mem.grad)
    assert torch.isfinite(grads_of[1]).all() and torch.equal(grads_of[1], grads_of[0])
