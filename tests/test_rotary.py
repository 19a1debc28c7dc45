"""Tests for addnorm.rotary: half-split RoPE.

Oracles: the complex-number statement of RoPE (pair (x_j, x_{j+Dh/2}) times e^{i pos theta_j}),
and the identities a rotation must satisfy (norms kept, relative-offset dot products, offset
equals slicing, per-row positions equal per-row offsets).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from properties import examples
from tolerances import u

from addnorm.rotary import RotaryEmbedding, rotate_half

# The float64 comparisons below evaluate the same float64 angles on both sides (the same
# theta = base ** (-2j / Dh) and one IEEE product, even at 2**40), so they differ only by the
# cos/sin kernels' ulp and a few roundings of each unit-scale pair: ~1e-15. atol=1e-12 and
# 1e-9 hold that on any machine; where the angles themselves differ, the test says so.


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


@examples(30)
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
    # float64: a rotation's rounding is a few u of each pair's modulus.
    torch.testing.assert_close(out.norm(dim=-1), x.norm(dim=-1), atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(out, complex_rope(x, pos, 10000.0), atol=1e-9, rtol=0)


@examples(30)
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
    # Here the angles differ: p theta and (p + k) theta up to 550 round to ~550 * 2u = 1.2e-13
    # each, and a 16-term dot of randn vectors (sum |q_j k_j| < 30) scales that to < 1e-11.
    torch.testing.assert_close(dots, at_zero.expand(n), atol=1e-9, rtol=0)


def test_offset_equals_slicing_a_longer_sequence():
    # Identity: rotating positions offset.. equals the tail of the full rotation.
    torch.manual_seed(0)
    x = torch.randn(2, 4, 12, 8)
    rope = RotaryEmbedding(8)
    # The same table rows and ops: equal, so float32 defaults fit.
    torch.testing.assert_close(rope(x[:, :, 7:], offset=7), rope(x)[:, :, 7:])


def test_per_row_positions_equal_per_row_offsets():
    # Identity: row b with positions offset_b + arange(L) equals a call with offset=offset_b.
    torch.manual_seed(0)
    x = torch.randn(3, 2, 5, 8)
    offsets = [0, 4, 9]
    positions = torch.stack([torch.arange(o, o + 5) for o in offsets])  # (B, L)
    rope = RotaryEmbedding(8)
    out = rope(x, positions=positions)
    for b, o in enumerate(offsets):  # the same table rows and ops: float32 defaults fit
        torch.testing.assert_close(out[b : b + 1], rope(x[b : b + 1], offset=o))


def cos_sin_formula(n: int, d_head: int, base: float, dtype: torch.dtype):
    """cos/sin of p * base^(-2j/Dh) for p < n, angles in float64, each half repeated."""
    theta = base ** (-torch.arange(0, d_head, 2, dtype=torch.float64) / d_head)
    angles = torch.arange(n, dtype=torch.float64)[:, None] * theta
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def test_tables_hold_max_len_positions_from_construction_and_stay_out_of_state_dict():
    # Oracle: cos_sin_formula (the module docstring's formula, restated); tables not saved.
    rope = RotaryEmbedding(8, base=500.0, max_len=37)
    cos, sin = cos_sin_formula(37, 8, 500.0, torch.float32)
    assert rope.max_len == 37 and torch.equal(rope.cos_cached, cos)
    assert torch.equal(rope.sin_cached, sin)
    assert RotaryEmbedding(8).max_len == 2048
    assert len(rope.state_dict()) == 0


def test_positions_past_max_len_match_the_complex_form():
    # Oracle: complex_rope for a sequence that runs past the tables.
    rope = RotaryEmbedding(8, max_len=8).double()
    x = torch.randn(1, 2, 25, 8, dtype=torch.float64)
    expected = complex_rope(x, torch.arange(5, 30), 10000.0)
    torch.testing.assert_close(rope(x, offset=5), expected, atol=1e-12, rtol=0)
    assert rope.max_len == 8


@pytest.mark.parametrize(
    "call",
    [
        lambda r, x: r(x, offset=2**40),  # far past the tables
        lambda r, x: r(x, offset=6),  # runs one position past the end
        lambda r, x: r(x),  # inside the tables
        lambda r, x: r(x, positions=torch.tensor([[0, 1, 8], [5, 6, 7]])),  # one past the end
        lambda r, x: r(x, positions=torch.tensor([-1, 0, 1])),  # negative
        lambda r, x: r(x, positions=torch.tensor([0.5, 1.5, 2.5])),  # fractional
        lambda r, x: r(x, positions=torch.tensor([0, 5, 7])),  # gathered from the tables
    ],
)
def test_forward_never_writes_the_tables(call):
    # Invariant (no hidden state written in forward): same buffers, storage and values after.
    rope = RotaryEmbedding(8, max_len=8)
    tables = rope.cos_cached, rope.sin_cached
    pointers = [t.data_ptr() for t in tables]
    values = [t.clone() for t in tables]
    call(rope, torch.randn(2, 2, 3, 8))
    assert rope.cos_cached is tables[0] and rope.sin_cached is tables[1]
    assert [t.data_ptr() for t in tables] == pointers
    assert all(torch.equal(t, v) for t, v in zip(tables, values, strict=True))


def test_reserve_enlarges_the_tables_ahead_of_time_and_forward_reads_them():
    # Oracle: cos_sin_formula(100); forward then reads the same buffer objects.
    rope = RotaryEmbedding(8, max_len=16)
    rope.reserve(100)
    cos, sin = rope.cos_cached, rope.sin_cached
    expected = cos_sin_formula(100, 8, 10000.0, torch.float32)
    assert rope.max_len == 100 and torch.equal(cos, expected[0]) and torch.equal(sin, expected[1])
    rope(torch.zeros(1, 1, 60, 8), offset=40)
    rope.reserve(50)  # already held: nothing to do
    assert rope.cos_cached is cos and rope.sin_cached is sin


def test_a_module_moved_to_float64_has_the_exact_float64_tables():
    # Oracle: the formula in float64, bit for bit (not float32 values upcast).
    rope = RotaryEmbedding(8, base=300.0, max_len=50).double()
    cos, sin = cos_sin_formula(50, 8, 300.0, torch.float64)
    assert rope.cos_cached.dtype == torch.float64
    assert torch.equal(rope.cos_cached, cos) and torch.equal(rope.sin_cached, sin)
    assert not torch.equal(cos, cos.float().double())  # the upcast would differ


def test_a_module_built_on_meta_stays_meta_and_to_empty_recomputes_its_tables():
    # Oracle: the formula; to_empty leaves uninitialized storage, the formula refills it.
    with torch.device("meta"):
        rope = RotaryEmbedding(8, max_len=20)
    assert rope.cos_cached.is_meta and rope.to(torch.float64).sin_cached.is_meta
    rope.to_empty(device="cpu")
    cos, sin = cos_sin_formula(20, 8, 10000.0, torch.float64)
    assert torch.equal(rope.cos_cached, cos) and torch.equal(rope.sin_cached, sin)


@pytest.mark.parametrize("offset", [2**40, 13, 14])
def test_offset_in_or_past_the_tables_matches_explicit_positions_and_the_complex_form(offset):
    # Oracles: explicit positions and complex_rope, whether the positions end at the tables'
    # last row (13), run one past it (14) or lie far beyond (2**40).
    rope = RotaryEmbedding(8, max_len=16).double()
    x = torch.randn(2, 2, 3, 8, dtype=torch.float64)
    out = rope(x, offset=offset)
    positions = torch.arange(offset, offset + 3)
    assert torch.equal(out, rope(x, positions=positions))  # the same rows, bit for bit
    torch.testing.assert_close(out, complex_rope(x, positions, 10000.0), atol=1e-9, rtol=0)


# Explicit integer positions are computed from the formula, or read from the tables when the
# caller gives a bound (positions_below) within them; both are the direct float64 rotation
# (the complex-number form) to the rounding of the tables' dtype.
SHARED_POSITIONS = torch.tensor([0, 3, 40, 2, 7])  # (L,)
PER_ROW_POSITIONS = torch.tensor([[0, 0, 0, 1, 2], [5, 6, 7, 8, 99]])  # (B, L): left-padded


@pytest.mark.parametrize("below", [None, 100])
@pytest.mark.parametrize("positions", [SHARED_POSITIONS, PER_ROW_POSITIONS])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_integer_positions_equal_the_complex_form(positions, dtype, below):
    # Oracle: complex_rope (float64), to the rounding of the tables' dtype.
    torch.manual_seed(0)
    x = torch.randn(2, 3, 5, 16, dtype=dtype)
    rope = RotaryEmbedding(16, max_len=100).to(dtype)
    out = rope(x, positions=positions, positions_below=below)
    rows = positions if positions.ndim == 1 else positions[:, None]  # (L,) or (B, 1, L)
    # Per pair z = (x_j, x_j+Dh/2): cos/sin rounded to dtype, two products and a sum cost
    # <= 3u|z| (Cauchy-Schwarz over the pair), the oracle rounded to dtype u|z|, its own
    # float64 arithmetic 3 u64|z|: tol = 4 (u + u64) max|z| (9.96e-7 in float32 here).
    radius = (x[..., :8].double() ** 2 + x[..., 8:].double() ** 2).sqrt().max().item()
    tol = 4 * (u(dtype) + u(torch.float64)) * radius
    torch.testing.assert_close(out, complex_rope(x, rows, 10000.0).to(dtype), atol=tol, rtol=0)


@pytest.mark.parametrize("int_dtype", [torch.uint8, torch.int16, torch.int32, torch.int64])
def test_every_integer_dtype_matches_the_same_positions_as_floats(int_dtype):
    # Oracle: the same positions as float64, computed directly (float32 rounding apart).
    x = torch.randn(2, 3, 5, 8)
    rope = RotaryEmbedding(8)
    out = rope(x, positions=PER_ROW_POSITIONS.to(int_dtype))
    expected = rope(x, positions=PER_ROW_POSITIONS.double())
    # Gathered and computed rows round the same float64 angles' cos/sin (kernels may differ by
    # an ulp, which survives float32 rounding as <= 6e-8), times |x| <= ~5: <= 3e-7.
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=0)


@pytest.mark.parametrize(
    "positions",
    [
        torch.tensor([[0, 1, 2], [5, 6, 16]]),  # one past the tables
        torch.tensor([2**40, 2**40 + 1, 3]),  # far past the tables
        torch.tensor([[-2, -1, 0], [0, 1, 2]]),  # negative: no row to gather
    ],
)
def test_integer_positions_outside_the_tables_are_computed(positions):
    # Oracle: complex_rope at the same positions.
    rope = RotaryEmbedding(8, max_len=16).double()
    x = torch.randn(2, 2, 3, 8, dtype=torch.float64)
    below = int(positions.max()) + 1 if int(positions.min()) >= 0 else None  # a true bound
    out = rope(x, positions=positions, positions_below=below)
    rows = positions if positions.ndim == 1 else positions[:, None]  # (L,) or (B, 1, L)
    torch.testing.assert_close(out, complex_rope(x, rows, 10000.0), atol=1e-9, rtol=0)


@examples(20)
@given(bound=st.integers(1, 40), max_len=st.integers(1, 40), seed=st.integers(0, 2**16))
def test_a_bound_within_the_tables_reads_the_rows_the_formula_computes(bound, max_len, seed):
    # Oracle: the same positions without a bound (computed from the formula). The table rows
    # and the computed ones round the same float64 angles' cos/sin to float32 (kernels may
    # differ by an ulp of float64, which survives as at most one ulp of float32, u(float32)
    # relative), times |x| <= 6 over two products and a sum: 3 * 6 * u(float32) = 2.1e-6.
    generator = torch.Generator().manual_seed(seed)
    rope = RotaryEmbedding(8, max_len=max_len)
    positions = torch.randint(0, bound, (2, 5), generator=generator)
    x = torch.randn(2, 3, 5, 8, generator=generator).clamp(-6, 6)
    out = rope(x, positions=positions, positions_below=bound)  # rows: tables if bound fits
    expected = rope(x, positions=positions)
    torch.testing.assert_close(out, expected, atol=18 * u(torch.float32), rtol=0)


def test_explicit_positions_are_never_read_back(monkeypatch):
    # Documented: choosing rows of the tables would read the positions back (a host sync on
    # an accelerator), so without a bound they are computed; torch.aminmax is never called.
    rope = RotaryEmbedding(8)
    monkeypatch.setattr(torch, "aminmax", lambda *a, **k: pytest.fail("host sync"))
    x = torch.randn(2, 2, 5, 8, dtype=torch.float64)
    out = rope.double()(x, positions=PER_ROW_POSITIONS)
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
    # Oracle: the float64 complex form. bfloat16 x with float32 tables computes in float32
    # (a few float32 u of |z| <= 4: < 1e-5, the atol) and rounds once to bfloat16 (rtol u).
    torch.manual_seed(0)
    x = torch.randn(1, 2, 6, 16).bfloat16()
    out = RotaryEmbedding(16)(x, offset=3)
    assert out.dtype == torch.bfloat16
    expected = complex_rope(x.double(), torch.arange(3, 9), 10000.0)
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=u(torch.bfloat16))


@pytest.mark.parametrize(
    ("make", "error", "match"),
    [
        (lambda: RotaryEmbedding(7), ValueError, r"d_head \(7\) must be even"),
        (lambda: RotaryEmbedding(0), ValueError, r"d_head must be >= 2, got 0"),
        (lambda: RotaryEmbedding(8.0), TypeError, r"d_head must be an int, got float"),
        (lambda: RotaryEmbedding(True), TypeError, r"d_head must be an int, got bool"),
        (lambda: RotaryEmbedding(8, base=0.5), ValueError, r"base must be > 1.0, got 0.5"),
        (lambda: RotaryEmbedding(8, base=-1.0), ValueError, r"base must be > 1.0, got -1.0"),
        (lambda: RotaryEmbedding(8, max_len=0), ValueError, r"max_len must be >= 1, got 0"),
        (lambda: RotaryEmbedding(8, max_len=None), TypeError, r"max_len must be an int"),
        (lambda: RotaryEmbedding(8).reserve(-1), ValueError, r"length must be >= 0, got -1"),
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
    # CUDA's float64 cos/sin may be an ulp off before the float32 rounding, then 3 roundings
    # of |z| <= ~5: a few float32 ulps, inside the defaults (rtol 1.3e-6, atol 1e-5).
    torch.testing.assert_close(gpu.cpu(), cpu)
