"""Tests for addnorm.rotary: half-split RoPE.

Oracles: the complex-number statement of RoPE (pair (x_j, x_{j+Dh/2}) times e^{i pos theta_j}),
and the identities a rotation must satisfy (norms kept, relative-offset dot products, offset
equals slicing, per-row positions equal per-row offsets).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from addnorm.encodings import MAX_CACHED_POSITIONS
from addnorm.rotary import RotaryEmbedding, rotate_half


def complex_rope(x: torch.Tensor, positions: torch.Tensor, base: float) -> torch.Tensor:
    """RoPE as complex multiplication, half-split pairing; positions broadcast as (.., L)."""
    half = x.shape[-1] // 2
    theta = base ** (-2 * torch.arange(half, dtype=torch.float64) / x.shape[-1])
    z = torch.complex(x[..., :half].double(), x[..., half:].double())
    rotated = z * torch.polar(torch.ones_like(theta), positions.double()[..., None] * theta)
    return torch.cat([rotated.real, rotated.imag], dim=-1)


def test_rotate_half_is_multiplication_by_i_per_pair():
    # Identity: i * (a + ib) = -b + ia, i.e. [a | b] -> [-b | a].
    x = torch.tensor([1.0, 2.0, 3.0, 4.0])
    assert torch.equal(rotate_half(x), torch.tensor([-3.0, -4.0, 1.0, 2.0]))


@pytest.mark.parametrize("d_head", [2, 8, 64])
def test_rope_equals_the_complex_number_formulation(d_head):
    # Oracle: complex_rope above.
    torch.manual_seed(0)
    x = torch.randn(2, 3, 11, d_head, dtype=torch.float64)
    rope = RotaryEmbedding(d_head, base=500.0).double()
    expected = complex_rope(x, torch.arange(11), 500.0)
    torch.testing.assert_close(rope(x), expected, atol=1e-12, rtol=0)


@settings(max_examples=30, deadline=None)
@given(
    half=st.integers(1, 16),
    positions=st.lists(st.floats(-1000, 1000), min_size=1, max_size=6),
    seed=st.integers(0, 2**16),
)
def test_rope_keeps_norms_and_matches_complex_form_at_fractional_positions(half, positions, seed):
    # Invariant: a rotation preserves each head vector's norm; oracle: complex_rope.
    gen = torch.Generator().manual_seed(seed)
    pos = torch.tensor(positions, dtype=torch.float64)
    x = torch.randn(1, 2, len(positions), 2 * half, dtype=torch.float64, generator=gen)
    out = RotaryEmbedding(2 * half).double()(x, positions=pos)
    torch.testing.assert_close(out.norm(dim=-1), x.norm(dim=-1), atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(out, complex_rope(x, pos, 10000.0), atol=1e-9, rtol=0)


@settings(max_examples=30, deadline=None)
@given(k=st.integers(-50, 50), p=st.lists(st.integers(0, 500), min_size=2, max_size=6))
def test_query_key_dot_product_depends_on_the_offset_only(k, p):
    # Identity (RoPE's point): <R(p) q, R(p+k) k'> = Re(sum conj(q) k' e^{i k theta}), free of p.
    gen = torch.Generator().manual_seed(0)
    q, key = torch.randn(2, 16, dtype=torch.float64, generator=gen)
    rope = RotaryEmbedding(16).double()
    pos = torch.tensor(p, dtype=torch.float64)
    n = len(p)
    rq = rope(q.expand(1, 1, n, 16), positions=pos)
    rk = rope(key.expand(1, 1, n, 16), positions=pos + k)
    dots = (rq * rk).sum(-1).flatten()
    at_zero = (q * rope(key.expand(1, 1, 1, 16), positions=torch.tensor([float(k)]))).sum()
    torch.testing.assert_close(dots, at_zero.expand(n), atol=1e-9, rtol=0)


def test_offset_equals_slicing_a_longer_sequence():
    # Identity: rotating positions offset.. equals the tail of the full rotation.
    torch.manual_seed(0)
    x = torch.randn(2, 4, 12, 8)
    rope = RotaryEmbedding(8)
    torch.testing.assert_close(rope(x[:, :, 7:], offset=7), rope(x)[:, :, 7:])


def test_per_row_positions_equal_per_row_offsets():
    # Identity: row b with positions offset_b + arange(L) equals a call with offset=offset_b.
    torch.manual_seed(0)
    x = torch.randn(3, 2, 5, 8)
    offsets = [0, 4, 9]
    positions = torch.stack([torch.arange(o, o + 5) for o in offsets])  # (B, L)
    rope = RotaryEmbedding(8)
    out = rope(x, positions=positions)
    for b, o in enumerate(offsets):
        torch.testing.assert_close(out[b : b + 1], rope(x[b : b + 1], offset=o))


def test_cache_growth_matches_direct_computation_and_stays_out_of_state_dict():
    # Oracle: complex_rope at positions beyond the first cached table; cache is not saved.
    rope = RotaryEmbedding(8).double()
    rope(torch.zeros(1, 1, 2, 8, dtype=torch.float64))
    rows = rope.cos_cached.shape[0]
    x = torch.randn(1, 2, 3 * rows, 8, dtype=torch.float64)
    out = rope(x, offset=5)
    assert rope.cos_cached.shape[0] >= 3 * rows + 5
    expected = complex_rope(x, torch.arange(5, 5 + 3 * rows), 10000.0)
    torch.testing.assert_close(out, expected, atol=1e-12, rtol=0)
    assert len(rope.state_dict()) == 0


def test_offset_past_the_cache_cap_is_computed_and_not_cached():
    # Oracles: explicit positions (same computation, bit for bit) and complex_rope; the cached
    # tables keep their size however large the offset.
    rope = RotaryEmbedding(8).double()
    rope(torch.zeros(1, 1, 5, 8, dtype=torch.float64))
    cached_rows = rope.cos_cached.shape[0]
    x = torch.randn(2, 2, 3, 8, dtype=torch.float64)
    offset = 2**40
    out = rope(x, offset=offset)
    positions = torch.arange(offset, offset + 3)
    assert torch.equal(out, rope(x, positions=positions))
    torch.testing.assert_close(out, complex_rope(x, positions, 10000.0), atol=1e-9, rtol=0)
    assert rope.cos_cached.shape[0] == rope.sin_cached.shape[0] == cached_rows
    rope(x[:, :, :1], offset=MAX_CACHED_POSITIONS - 1)  # ends at the cap: cached
    assert rope.cos_cached.shape[0] == MAX_CACHED_POSITIONS


# Integer positions are gathered from the cached tables; these pin that the gathered rotation
# is the direct float64 one (the complex-number form) to float32 rounding.
SHARED_POSITIONS = torch.tensor([0, 3, 40, 2, 7])  # (L,): 40 is past the first cached table
PER_ROW_POSITIONS = torch.tensor([[0, 0, 0, 1, 2], [5, 6, 7, 8, 99]])  # (B, L): left-padded


@pytest.mark.parametrize("positions", [SHARED_POSITIONS, PER_ROW_POSITIONS])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_integer_positions_use_cached_tables_equal_to_the_complex_form(positions, dtype):
    # Oracle: complex_rope (float64), to the rounding of the tables' dtype; the tables grow to
    # cover max(positions), which is past the rows they held.
    torch.manual_seed(0)
    x = torch.randn(2, 3, 5, 16, dtype=dtype)
    rope = RotaryEmbedding(16).to(dtype)
    rope(torch.zeros(1, 1, 4, 16, dtype=dtype))
    assert rope.cos_cached.shape[0] <= int(positions.max())
    out = rope(x, positions=positions)
    assert rope.cos_cached.shape[0] == rope.sin_cached.shape[0] > int(positions.max())
    rows = positions if positions.ndim == 1 else positions[:, None]  # (L,) or (B, 1, L)
    tol = 1e-12 if dtype == torch.float64 else 1e-6
    torch.testing.assert_close(out, complex_rope(x, rows, 10000.0).to(dtype), atol=tol, rtol=0)


@pytest.mark.parametrize("int_dtype", [torch.uint8, torch.int16, torch.int32, torch.int64])
def test_every_integer_dtype_matches_the_same_positions_as_floats(int_dtype):
    # Oracle: the same positions as float64, computed directly (float32 rounding apart).
    x = torch.randn(2, 3, 5, 8)
    rope = RotaryEmbedding(8)
    out = rope(x, positions=PER_ROW_POSITIONS.to(int_dtype))
    expected = rope(x, positions=PER_ROW_POSITIONS.double())
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=0)


@pytest.mark.parametrize(
    "positions",
    [
        torch.tensor([[0, 1, 2], [5, 6, MAX_CACHED_POSITIONS]]),  # one past the cap
        torch.tensor([2**40, 2**40 + 1, 3]),  # far past the cap
        torch.tensor([[-2, -1, 0], [0, 1, 2]]),  # negative: no row to gather
    ],
)
def test_integer_positions_outside_the_cache_range_are_computed(positions):
    # Oracle: complex_rope at the same positions; the cached tables do not grow.
    rope = RotaryEmbedding(8).double()
    rope(torch.zeros(1, 1, 5, 8, dtype=torch.float64))
    cached_rows = rope.cos_cached.shape[0]
    x = torch.randn(2, 2, 3, 8, dtype=torch.float64)
    out = rope(x, positions=positions)
    rows = positions if positions.ndim == 1 else positions[:, None]  # (L,) or (B, 1, L)
    torch.testing.assert_close(out, complex_rope(x, rows, 10000.0), atol=1e-9, rtol=0)
    assert rope.cos_cached.shape[0] == rope.sin_cached.shape[0] == cached_rows


def test_under_torch_compile_integer_positions_are_computed_without_a_host_sync(monkeypatch):
    # Documented: no host sync under torch.compile, so no gather and no cache growth there.
    rope = RotaryEmbedding(8)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    x = torch.randn(2, 2, 5, 8, dtype=torch.float64)
    out = rope.double()(x, positions=PER_ROW_POSITIONS)
    assert rope.cos_cached.shape[0] == 0
    expected = complex_rope(x, PER_ROW_POSITIONS[:, None], 10000.0)
    torch.testing.assert_close(out, expected, atol=1e-12, rtol=0)


@pytest.mark.parametrize("positions", [torch.arange(3), torch.tensor([[0, 1, 2], [4, 5, 6]])])
def test_positions_are_moved_to_the_device_of_x(positions):
    # Documented: positions on another device are moved to x's ('meta' stands in for an
    # accelerator: it checks devices and shapes without computing values).
    rope = RotaryEmbedding(8).to("meta")
    out = rope(torch.zeros(2, 2, 3, 8, device="meta"), positions=positions)
    assert out.device.type == "meta" and out.shape == (2, 2, 3, 8)


def test_rotate_half_keeps_leading_dims():
    # Identity: rotating twice is multiplication by i^2 = -1, for any leading dims.
    x = torch.randn(2, 3, 4, 6)
    assert torch.equal(rotate_half(rotate_half(x)), -x)


def test_low_precision_input_keeps_its_dtype():
    # Oracle: the float64 complex form, rounded once to bfloat16 (tolerance of bf16).
    torch.manual_seed(0)
    x = torch.randn(1, 2, 6, 16).bfloat16()
    out = RotaryEmbedding(16)(x, offset=3)
    assert out.dtype == torch.bfloat16
    expected = complex_rope(x.double(), torch.arange(3, 9), 10000.0)
    torch.testing.assert_close(out.double(), expected, atol=2e-2, rtol=1e-2)


@pytest.mark.parametrize(
    ("make", "error", "match"),
    [
        (lambda: RotaryEmbedding(7), ValueError, r"d_head \(7\) must be even"),
        (lambda: RotaryEmbedding(0), ValueError, r"d_head must be >= 2, got 0"),
        (lambda: RotaryEmbedding(8.0), TypeError, r"d_head must be an int, got float"),
        (lambda: RotaryEmbedding(True), TypeError, r"d_head must be an int, got bool"),
        (lambda: RotaryEmbedding(8, base=0.5), ValueError, r"base must be > 1.0, got 0.5"),
        (lambda: RotaryEmbedding(8, base=-1.0), ValueError, r"base must be > 1.0, got -1.0"),
    ],
)
def test_constructor_rejects_bad_arguments(make, error, match):
    with pytest.raises(error, match=match):
        make()


@pytest.mark.parametrize(
    ("x", "kwargs", "error", "match"),
    [
        (torch.zeros(2, 3, 5), {}, ValueError, r"x must have 4 dims, got shape \(2, 3, 5\)"),
        (torch.zeros(1, 2, 3, 6), {}, ValueError, r"d_head \(8\), got shape \(1, 2, 3, 6\)"),
        (torch.zeros(1, 2, 3, 8, dtype=torch.bool), {}, TypeError, r"floating.*torch.bool"),
        (torch.zeros(1, 2, 3, 8), {"offset": -2}, ValueError, r"offset must be >= 0, got -2"),
        (
            torch.zeros(2, 2, 3, 8),
            {"positions": torch.zeros(4)},
            ValueError,
            r"positions must have shape \(3,\) or \(2, 3\) to match x, got \(4,\)",
        ),
        (
            torch.zeros(2, 2, 3, 8),
            {"positions": torch.tensor([0.0, float("nan"), 1.0])},
            ValueError,
            r"positions must be finite, got nan",
        ),
    ],
)
def test_forward_rejects_bad_inputs(x, kwargs, error, match):
    with pytest.raises(error, match=match):
        RotaryEmbedding(8)(x, **kwargs)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_runs_on_cuda_and_matches_cpu():
    # Oracle: the CPU result.
    x = torch.randn(2, 2, 5, 8)
    positions = torch.tensor([[0, 1, 2, 3, 4], [2, 3, 4, 5, 6]])
    cpu = RotaryEmbedding(8)(x, positions=positions)
    gpu = RotaryEmbedding(8).cuda()(x.cuda(), positions=positions.cuda())
    torch.testing.assert_close(gpu.cpu(), cpu)
