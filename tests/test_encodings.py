"""Tests for addnorm.encodings: sinusoidal layouts, T(k), and the two position modules (the
learned table alone: tests/test_learned_positions.py).

Provenance of expected values is stated per test: the SPEC section 1 worked example, the
SPEC formula restated with scalar math, restatements of Marian / x-transformers / Whisper
formulas, identities (rotation, permutation), or torch built-ins.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st
from properties import examples
from tolerances import FLOAT64_EXACT, u

from addnorm.encodings import (
    LearnedPositionalEmbedding,
    SinusoidalPositionalEncoding,
    angle_dtype,
    relative_shift_matrix,
    sinusoidal_encoding,
)

# ---------------------------------------------------------------- restatements (oracles)


def spec_pe(pos: float, d: int, base: float) -> list[float]:
    """SPEC section 1 read literally: column 2i is sin(pos / base^(2i/d)), 2i+1 the cos."""
    row = []
    for col in range(d):
        i = col // 2
        angle = pos / base ** (2 * i / d)
        row.append(math.sin(angle) if col % 2 == 0 else math.cos(angle))
    return row


def marian_pe(n_pos: int, dim: int, base: float) -> torch.Tensor:
    """HF MarianSinusoidalPositionalEmbedding._init_weight restated (sentinel rule for odd)."""
    enc = [[pos / base ** (2 * (j // 2) / dim) for j in range(dim)] for pos in range(n_pos)]
    enc = torch.tensor(enc, dtype=torch.float64)
    sentinel = dim // 2 if dim % 2 == 0 else dim // 2 + 1
    out = torch.empty(n_pos, dim, dtype=torch.float64)
    out[:, :sentinel] = enc[:, 0::2].sin()
    out[:, sentinel:] = enc[:, 1::2].cos()
    return out


def x_transformers_pe(pos: torch.Tensor, dim: int, theta: float) -> torch.Tensor:
    """x-transformers' (Scaled)SinusoidalEmbedding restated, without its learned scale."""
    half = dim // 2
    inv_freq = theta ** -(torch.arange(half, dtype=torch.float64) / half)
    emb = pos[:, None] * inv_freq[None, :]
    return torch.cat([emb.sin(), emb.cos()], dim=-1)


def whisper_pe(length: int, channels: int, max_timescale: float) -> torch.Tensor:
    """OpenAI Whisper's ``sinusoids`` restated."""
    increment = math.log(max_timescale) / (channels // 2 - 1)
    inv_timescales = torch.exp(-increment * torch.arange(channels // 2, dtype=torch.float64))
    scaled = torch.arange(length, dtype=torch.float64)[:, None] * inv_timescales[None, :]
    return torch.cat([scaled.sin(), scaled.cos()], dim=1)


def interleaved_to_halves(d: int) -> list[int]:
    """Column order taking interleaved [s0 c0 s1 c1 ..] to halves [s0 s1 .. | c0 c1 ..]."""
    return list(range(0, d, 2)) + list(range(1, d, 2))


# ---------------------------------------------------------------- sinusoidal_encoding


def test_matches_the_spec_worked_example_to_the_printed_digits():
    # SPEC section 1, seed 002 ("The dog ran fast", d = 4, base = 100), printed to 4 digits.
    printed = torch.tensor(
        [
            [0.0, 1.0, 0.0, 1.0],
            [0.8415, 0.5403, 0.0998, 0.9950],
            [0.9093, -0.4161, 0.1987, 0.9801],
            [0.1411, -0.9900, 0.2955, 0.9553],
        ]
    )
    # atol: half a unit of the 4th printed decimal (float32 rounding, 6e-8, is far below it).
    torch.testing.assert_close(sinusoidal_encoding(4, 4, base=100), printed, atol=5e-5, rtol=0)


@pytest.mark.parametrize("d_model", [1, 2, 3, 5, 8, 13])
def test_interleaved_equals_the_spec_formula_for_even_and_odd_widths(d_model):
    # Oracle: SPEC section 1 formula evaluated with scalar math; odd d ends with a sine.
    positions = torch.tensor([0.0, 1.0, 2.5, 7.0, 100.0, -3.25], dtype=torch.float64)
    rows = [spec_pe(p, d_model, 50.0) for p in positions.tolist()]
    expected = torch.tensor(rows, dtype=torch.float64)
    got = sinusoidal_encoding(positions, d_model, base=50.0)
    # float64: angles <= 100 carry a few u (1.1e-16) relative, under 1e-13 absolute.
    torch.testing.assert_close(got, expected, atol=1e-12, rtol=0)


@pytest.mark.parametrize("d_model", [2, 3, 6, 9])
def test_halves_is_marians_layout_and_a_column_permutation_of_interleaved(d_model):
    # Oracles: HF Marian's _init_weight restated; the permutation identity (same frequencies).
    halves = sinusoidal_encoding(torch.arange(12.0).double(), d_model, layout="halves")
    # float64, angles < 12: a few u each, far under 1e-12.
    torch.testing.assert_close(halves, marian_pe(12, d_model, 10000.0), atol=1e-12, rtol=0)
    interleaved = sinusoidal_encoding(torch.arange(12.0).double(), d_model)
    assert torch.equal(halves, interleaved[:, interleaved_to_halves(d_model)])


def test_halves_matches_x_transformers_for_fractional_positions():
    # Oracle: x-transformers' inv_freq = theta^-(arange(half)/half), cat(sin, cos), restated.
    pos = torch.tensor([-2.0, 0.5, 3.0, 1234.75], dtype=torch.float64)
    got = sinusoidal_encoding(pos, 16, base=500.0, layout="halves")
    # float64: two pows (<= 1 ulp each) and the products put <= 6u = 6.7e-16 relative on
    # angles up to 1234.75, i.e. <= 8.2e-13 absolute, inside 1e-12.
    torch.testing.assert_close(got, x_transformers_pe(pos, 16, 500.0), atol=1e-12, rtol=0)


@pytest.mark.parametrize("d_model", [4, 6, 384])
def test_whisper_layout_matches_whispers_sinusoids(d_model):
    # Oracle: Whisper's `sinusoids` restated (denominator d/2 - 1).
    got = sinusoidal_encoding(torch.arange(30).double(), d_model, layout="whisper")
    # float64, angles < 30: a few u relative, under 1e-14 absolute.
    torch.testing.assert_close(got, whisper_pe(30, d_model, 10000.0), atol=1e-12, rtol=0)


def test_whisper_layout_is_not_a_permutation_of_halves():
    # Identity: Whisper's last sine column has frequency exactly 1/base (j = h-1 over h-1),
    # while the halves layout's last sine column has base^(-(d-2)/d); they differ at pos 1.
    d, base = 8, 10000.0
    pos = torch.tensor([1.0], dtype=torch.float64)
    whisper = sinusoidal_encoding(pos, d, base=base, layout="whisper")
    halves = sinusoidal_encoding(pos, d, base=base, layout="halves")
    # float64 values near 1e-4 and 1e-3: a few u relative, far under abs=1e-15 and the
    # default rel=1e-6; the sorted tables differ by ~1e-3, far beyond allclose's defaults.
    assert whisper[0, d // 2 - 1].item() == pytest.approx(math.sin(1 / base), abs=1e-15)
    assert halves[0, d // 2 - 1].item() == pytest.approx(math.sin(base ** (-(d - 2) / d)))
    assert not torch.allclose(whisper.sort(dim=-1).values, halves.sort(dim=-1).values)


@pytest.mark.parametrize("layout", ["interleaved", "halves", "whisper"])
def test_values_stay_within_minus_one_and_one(layout):
    # Invariant: every entry is a sine or a cosine (SPEC section 1, claim 1).
    table = sinusoidal_encoding(torch.linspace(-5000, 5000, 2001), 64, layout=layout)
    assert table.abs().max().item() <= 1.0  # exact: rounding |v| <= 1 cannot pass 1
    assert table.abs().max().item() > 0.99  # and the bound is reached, not trivially met


def test_count_means_arange_and_dtypes_follow_the_positions():
    # Identity: an int count P is the tensor arange(P); float64 in keeps float64.
    by_count = sinusoidal_encoding(7, 10)
    by_tensor = sinusoidal_encoding(torch.arange(7), 10)
    assert by_count.dtype == torch.float32 and torch.equal(by_count, by_tensor)
    as_f64 = sinusoidal_encoding(torch.arange(7, dtype=torch.float64), 10)
    assert as_f64.dtype == torch.float64
    # Both round the same float64 angles' sin/cos once: equal, so float32 defaults fit.
    torch.testing.assert_close(as_f64.float(), by_count)
    assert sinusoidal_encoding(7, 10, dtype=torch.float64).dtype == torch.float64


def test_offset_positions_are_rows_of_a_longer_table():
    # Identity: PE depends on the position value only (SPEC requirement 1).
    full = sinusoidal_encoding(torch.arange(40).double(), 12)
    offset = sinusoidal_encoding(torch.arange(25, 40).double(), 12)
    # float64, the same operations per position: a few u at most.
    torch.testing.assert_close(offset, full[25:], atol=1e-12, rtol=0)


# ---------------------------------------------------------------- T(k)


@examples(50)
@given(
    half=st.integers(1, 32),
    base=st.floats(1.5, 1e5),
    k=st.one_of(st.integers(-200, 200), st.floats(-200, 200)),
    positions=st.lists(st.floats(-1000, 1000), min_size=1, max_size=16),
)
def test_shift_matrix_moves_every_position_by_k(half, base, k, positions):
    # Identity (SPEC section 1): PE(p + k) = T(k) PE(p), i.e. rows: PE(p + k) = PE(p) T(k)^T.
    d = 2 * half
    pos = torch.tensor(positions, dtype=torch.float64)
    shifted = sinusoidal_encoding(pos + k, d, base=base)
    moved = sinusoidal_encoding(pos, d, base=base) @ relative_shift_matrix(
        k, d, base=base, dtype=torch.float64
    ).T
    # float64: angles up to 1200 round to a few u * 1200 ~ 4e-13, the 2-term rotation adds
    # as much; 1e-9 is that bound with a wide margin for the pows of any libm.
    torch.testing.assert_close(moved, shifted, atol=1e-9, rtol=0)


def test_shift_matrix_is_a_rotation_with_identity_at_zero_and_group_law():
    # Identities: T(0) = I, T(k) T(k)^T = I, T(a) T(b) = T(a + b).
    def t(k):
        return relative_shift_matrix(k, 16, base=100.0, dtype=torch.float64)

    eye = torch.eye(16, dtype=torch.float64)
    # float64, angles <= 3, 2-term products: a few u.
    torch.testing.assert_close(t(0), eye, **FLOAT64_EXACT)
    torch.testing.assert_close(t(2.5) @ t(2.5).T, eye, **FLOAT64_EXACT)
    torch.testing.assert_close(t(3) @ t(-1.25), t(1.75), **FLOAT64_EXACT)


def test_shift_matrix_has_the_spec_block_signs():
    # SPEC section 1: block [[cos wk, sin wk], [-sin wk, cos wk]] (seed 000's matrix with both
    # off-diagonals positive is the documented typo). w_0 = 1, so block 0 uses k itself.
    k = 0.7
    block = relative_shift_matrix(k, 4, dtype=torch.float64)[:2, :2]
    expected = torch.tensor(
        [[math.cos(k), math.sin(k)], [-math.sin(k), math.cos(k)]], dtype=torch.float64
    )
    torch.testing.assert_close(block, expected, **FLOAT64_EXACT)  # float64 sin/cos of 0.7


@examples(30)
@given(k=st.floats(-50, 50), p=st.lists(st.floats(-500, 500), min_size=2, max_size=8))
def test_dot_product_of_codes_depends_on_the_offset_only(k, p):
    # Identity: PE(p).PE(p+k) = sum_i [sin a sin b + cos a cos b] = sum_i cos(w_i k).
    d, base = 32, 10000.0
    pos = torch.tensor(p, dtype=torch.float64)
    dots = (sinusoidal_encoding(pos, d) * sinusoidal_encoding(pos + k, d)).sum(-1)
    freqs = [base ** (-2 * i / d) for i in range(d // 2)]
    expected = sum(math.cos(w * k) for w in freqs)
    # float64: 32 products of angles up to 550 (each ~ 550 * 3u = 2e-13), summed: ~1e-11.
    torch.testing.assert_close(dots, torch.full_like(dots, expected), atol=1e-9, rtol=0)


# ---------------------------------------------------------------- SinusoidalPositionalEncoding


def test_module_adds_the_table_to_its_input():
    # Oracle: x + sinusoidal_encoding(arange(L)).
    torch.manual_seed(0)
    x = torch.randn(2, 6, 10, dtype=torch.float64)
    module = SinusoidalPositionalEncoding(10, base=300.0).double()
    expected = x + sinusoidal_encoding(torch.arange(6).double(), 10, base=300.0)
    torch.testing.assert_close(module(x), expected, **FLOAT64_EXACT)  # one float64 add


def test_module_offset_equals_slicing_a_longer_sequence():
    # Identity: encoding positions offset..offset+L-1 equals the tail of a longer call.
    torch.manual_seed(0)
    x = torch.randn(3, 9, 8)
    module = SinusoidalPositionalEncoding(8)
    # The same table rows and one add: equal, so float32 defaults fit.
    torch.testing.assert_close(module(x[:, 5:], offset=5), module(x)[:, 5:])


def test_module_table_holds_max_len_formula_rows_from_construction():
    # Oracle: sinusoidal_encoding(max_len), the same float64-angle computation rounded once.
    module = SinusoidalPositionalEncoding(6, base=50.0, layout="halves", max_len=37)
    assert module.max_len == 37 and module.table.dtype == torch.float32
    assert torch.equal(module.table, sinusoidal_encoding(37, 6, base=50.0, layout="halves"))
    assert SinusoidalPositionalEncoding(6).max_len == 2048


def test_module_rows_past_max_len_equal_the_formula():
    # Oracle: direct sinusoidal_encoding for a sequence that runs past the table.
    module = SinusoidalPositionalEncoding(6, max_len=8).double()
    long = torch.zeros(1, 25, 6, dtype=torch.float64)
    out = module(long, offset=7)
    direct = sinusoidal_encoding(torch.arange(7, 32).double(), 6)
    # float64 angles < 32, one add of 0: a few u.
    torch.testing.assert_close(out[0], direct, atol=1e-12, rtol=0)
    assert module.max_len == 8


@pytest.mark.parametrize(
    "call",
    [
        lambda m, x: m(x, offset=2**40),  # far past the table
        lambda m, x: m(x, offset=7),  # runs one row past the end
        lambda m, x: m(x),  # inside the table
        lambda m, x: m(x, positions=torch.tensor([[0, 1, 8], [5, 6, 7]])),  # one past the end
        lambda m, x: m(x, positions=torch.tensor([-1, 0, 1])),  # negative
        lambda m, x: m(x, positions=torch.tensor([0.5, 1.5, 2.5])),  # fractional
        lambda m, x: m(x, positions=torch.tensor([0, 5, 7])),  # gathered from the table
    ],
)
def test_forward_never_writes_the_table(call):
    # Invariant (no hidden state written in forward): same buffer, storage and values after.
    module = SinusoidalPositionalEncoding(8, max_len=8)
    table = module.table
    pointer, values = table.data_ptr(), table.clone()
    call(module, torch.randn(2, 3, 8))
    assert module.table is table and table.data_ptr() == pointer
    assert torch.equal(table, values) and module.max_len == 8


def test_reserve_enlarges_the_table_ahead_of_time_and_forward_reads_it():
    # Oracle: sinusoidal_encoding(100); forward then reads the same buffer object.
    module = SinusoidalPositionalEncoding(4, max_len=16)
    module.reserve(100)
    table = module.table
    assert module.max_len == 100 and torch.equal(table, sinusoidal_encoding(100, 4))
    module(torch.zeros(2, 60, 4), offset=40)
    module.reserve(50)  # already held: nothing to do
    assert module.table is table


@pytest.mark.parametrize("layout", ["interleaved", "whisper"])
def test_a_module_moved_to_float64_has_the_exact_float64_table(layout):
    # Oracle: sinusoidal_encoding in float64, bit for bit (not float32 values upcast); and
    # back to float32 the float32 formula again.
    module = SinusoidalPositionalEncoding(8, base=300.0, layout=layout, max_len=50)
    kwargs = dict(base=300.0, layout=layout)
    for moved in (module.double(), module.to(torch.float64)):
        exact = sinusoidal_encoding(50, 8, dtype=torch.float64, **kwargs)
        assert moved.table.dtype == torch.float64 and torch.equal(moved.table, exact)
    assert not torch.equal(exact, exact.float().double())  # the upcast would differ
    assert torch.equal(module.float().table, sinusoidal_encoding(50, 8, **kwargs))


def test_a_module_built_on_meta_stays_meta_and_to_empty_recomputes_its_table():
    # Oracle: sinusoidal_encoding; to_empty leaves uninitialized storage, the formula refills.
    with torch.device("meta"):
        module = SinusoidalPositionalEncoding(8, max_len=20)
    assert module.table.is_meta and module.to(torch.float64).table.is_meta
    module.to_empty(device="cpu")
    assert torch.equal(module.table, sinusoidal_encoding(20, 8, dtype=torch.float64))


def test_module_table_is_not_in_the_state_dict():
    # The table is a pure function of (d_model, base): it must not be saved (persistent=False).
    module = SinusoidalPositionalEncoding(8)
    module(torch.zeros(1, 4, 8))
    assert "table" not in module.state_dict() and len(module.state_dict()) == 0


def test_module_accepts_per_row_positions_for_left_padded_batches():
    # Oracle: each row b equals x[b] + sinusoidal_encoding(positions[b]).
    torch.manual_seed(0)
    x = torch.randn(2, 4, 6, dtype=torch.float64)
    positions = torch.tensor([[0, 0, 0, 1], [3, 4, 5, 6]])  # row 0 left-padded
    module = SinusoidalPositionalEncoding(6).double()
    out = module(x, positions=positions)
    for b in range(2):
        expected = x[b] + sinusoidal_encoding(positions[b].double(), 6)
        torch.testing.assert_close(out[b], expected, **FLOAT64_EXACT)  # float64, one add
    shared = module(x, positions=torch.tensor([2.5, 3.5, 4.5, 5.5]))
    torch.testing.assert_close(
        shared, x + sinusoidal_encoding(torch.arange(4).double() + 2.5, 6), **FLOAT64_EXACT
    )


def test_module_dropout_is_torch_dropout_of_the_sum():
    # Oracle: F.dropout(x + PE) under the same RNG state; eval mode is the identity dropout.
    x = torch.randn(2, 5, 8)
    module = SinusoidalPositionalEncoding(8, dropout=0.5)
    pe = sinusoidal_encoding(5, 8)
    torch.manual_seed(3)
    out = module(x)
    torch.manual_seed(3)
    # The same float32 ops on the same values and RNG: equal, so float32 defaults fit.
    torch.testing.assert_close(out, F.dropout(x + pe, 0.5, training=True))
    torch.testing.assert_close(module.eval()(x), x + pe)


def test_module_keeps_low_precision_input_dtype():
    # Oracle: the float32 result rounded to bfloat16 once.
    x = torch.randn(1, 5, 8)
    out = SinusoidalPositionalEncoding(8)(x.bfloat16())
    assert out.dtype == torch.bfloat16
    # x, PE and their sum y each rounded once to bfloat16: <= u(|x| + |PE| + |y|), and
    # |PE| <= 1 makes that <= 2u(1 + |y|); the third u in atol covers second-order terms.
    bf16 = u(torch.bfloat16)
    torch.testing.assert_close(
        out.float(), x + sinusoidal_encoding(5, 8), atol=3 * bf16, rtol=2 * bf16
    )


@pytest.mark.parametrize("offset", [2**40, 13, 14])
def test_module_offset_is_read_from_the_table_or_computed_equally(offset):
    # Oracle: sinusoidal_encoding on the same float64 positions, bit for bit, whether the rows
    # end at the table's last row (13), run one row past it (14) or lie far beyond (2**40).
    module = SinusoidalPositionalEncoding(8, max_len=16).double()
    x = torch.randn(2, 3, 8, dtype=torch.float64)
    out = module(x, offset=offset)
    positions = torch.arange(offset, offset + 3, dtype=torch.float64)
    expected = x + sinusoidal_encoding(positions, 8, dtype=torch.float64)
    assert torch.equal(out, expected)


# Integer positions inside the table are gathered from it; these pin that the gathered rows
# are the direct float64 computation (sinusoidal_encoding at those positions) to float32
# rounding.
SHARED_POSITIONS = torch.tensor([0, 3, 40, 2, 7])  # (L,)
PER_ROW_POSITIONS = torch.tensor([[0, 0, 0, 1, 2], [5, 6, 7, 8, 99]])  # (B, L): left-padded


@pytest.mark.parametrize("positions", [SHARED_POSITIONS, PER_ROW_POSITIONS])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_module_integer_positions_are_table_rows_equal_to_direct_computation(positions, dtype):
    # Oracle: x + sinusoidal_encoding(positions) rounded once to the table dtype.
    torch.manual_seed(0)
    x = torch.randn(2, 5, 8, dtype=dtype)
    module = SinusoidalPositionalEncoding(8, max_len=100).to(dtype)
    out = module(x, positions=positions)
    pe = sinusoidal_encoding(positions.reshape(-1).double(), 8, dtype=dtype)
    expected = x + pe.reshape(*positions.shape, 8)
    # Gathered and direct rows are the same rounded values; the add costs <= u * |y|, and
    # |y| <= 5 here: 3e-7 in float32, 1e-15 in float64.
    tol = 1e-12 if dtype == torch.float64 else 1e-6
    torch.testing.assert_close(out, expected, atol=tol, rtol=0)


@pytest.mark.parametrize("int_dtype", [torch.uint8, torch.int16, torch.int32, torch.int64])
def test_module_gathers_rows_for_every_integer_dtype(int_dtype):
    # Oracle: the same positions as float64, computed directly (float32 rounding apart).
    x = torch.randn(2, 5, 8)
    module = SinusoidalPositionalEncoding(8)
    out = module(x, positions=PER_ROW_POSITIONS.to(int_dtype))
    # Same rounded rows, one float32 add each: <= u * |y| <= 6e-8 * 5.
    torch.testing.assert_close(
        out, module(x, positions=PER_ROW_POSITIONS.double()), atol=1e-6, rtol=0
    )


@pytest.mark.parametrize(
    "positions",
    [
        torch.tensor([[0, 1, 2], [5, 6, 16]]),  # one past the table
        torch.tensor([2**40, 2**40 + 1, 3]),  # far past the table
        torch.tensor([[-2, -1, 0], [0, 1, 2]]),  # negative: no row to gather
    ],
)
def test_module_integer_positions_outside_the_table_are_computed(positions):
    # Oracle: sinusoidal_encoding on the same float64 positions.
    module = SinusoidalPositionalEncoding(8, max_len=16).double()
    x = torch.randn(2, 3, 8, dtype=torch.float64)
    out = module(x, positions=positions)
    pe = sinusoidal_encoding(positions.reshape(-1).double(), 8, dtype=torch.float64)
    # The same float64 computation: equal but for a few u (2**40 is exact in float64).
    torch.testing.assert_close(out, x + pe.reshape(*positions.shape, 8), atol=1e-12, rtol=0)


def test_module_positions_in_a_reserved_table_are_gathered_from_it():
    # Oracle: sinusoidal_encoding; rows reserve added are read from the same buffer.
    module = SinusoidalPositionalEncoding(2, max_len=4)
    module.reserve(10)
    table = module.table
    positions = torch.tensor([9, 1])
    out = module(torch.zeros(1, 2, 2), positions=positions)
    assert module.table is table
    expected = sinusoidal_encoding(positions.double(), 2, dtype=torch.float32)
    # The same rounded float32 rows plus 0: values <= 1, at most one u (6e-8) apart.
    torch.testing.assert_close(out[0], expected, atol=1e-6, rtol=0)


def test_module_under_torch_compile_computes_integer_positions_without_a_host_sync(
    monkeypatch,
):
    # Documented: no host sync under torch.compile (the bounds read, torch.aminmax, is not
    # called), so the rows are computed rather than gathered.
    module = SinusoidalPositionalEncoding(8)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    monkeypatch.setattr(torch, "aminmax", lambda *a, **k: pytest.fail("host sync"))
    x = torch.randn(2, 5, 8)
    out = module(x, positions=PER_ROW_POSITIONS)
    expected = x + sinusoidal_encoding(PER_ROW_POSITIONS.reshape(-1), 8).reshape(2, 5, 8)
    # The same rounded rows, one float32 add: <= u * |y| <= 6e-8 * 5.
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=0)


@pytest.mark.parametrize("positions", [torch.arange(3), torch.tensor([[0, 1, 2], [4, 5, 6]])])
def test_module_moves_positions_to_the_device_of_x(positions):
    # Documented: positions given on another device are moved to x's ('meta' stands in for
    # an accelerator: it checks devices and shapes without computing values).
    module = SinusoidalPositionalEncoding(8).to("meta")
    out = module(torch.zeros(2, 3, 8, device="meta"), positions=positions)
    assert out.device.type == "meta" and out.shape == (2, 3, 8)
    learned = LearnedPositionalEmbedding(16, 8).to("meta")
    out = learned(torch.zeros(2, 3, 8, device="meta"), positions=positions)
    assert out.device.type == "meta" and out.shape == (2, 3, 8)


def test_angles_are_float64_except_on_mps_which_has_none():
    # Documented helper: MPS has no float64, so angles there are float32.
    assert angle_dtype(torch.device("cpu")) == torch.float64
    assert angle_dtype(torch.device("meta")) == torch.float64
    assert angle_dtype(torch.device("mps")) == torch.float32


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"d_model": 0}, ValueError, r"d_model must be >= 1, got 0"),
        ({"d_model": -1}, ValueError, r"d_model must be >= 1, got -1"),
        ({"d_model": 2.5}, TypeError, r"d_model must be an int, got float \(2.5\)"),
        ({"d_model": True}, TypeError, r"d_model must be an int, got bool"),
        ({"base": 0.0}, ValueError, r"base must be > 1.0, got 0.0"),
        ({"base": -10.0}, ValueError, r"base must be > 1.0, got -10.0"),
        ({"base": 1.0}, ValueError, r"base must be > 1.0, got 1.0"),
        ({"base": float("nan")}, ValueError, r"base must be finite, got nan"),
        ({"layout": "sideways"}, ValueError, r"layout must be one of .*; got 'sideways'"),
        ({"layout": "whisper", "d_model": 5}, ValueError, r"even d_model >= 4.*\(5\)"),
        ({"layout": "whisper", "d_model": 2}, ValueError, r"even d_model >= 4.*\(2\)"),
        ({"positions": -3}, ValueError, r"positions must be >= 0, got -3"),
        ({"positions": 2.5}, TypeError, r"positions must be an int, got float"),
        ({"positions": torch.zeros(2, 3)}, ValueError, r"positions must have 1 dims.*\(2, 3\)"),
        ({"positions": torch.tensor([True])}, TypeError, r"positions .* got dtype torch.bool"),
        ({"positions": torch.tensor([1.0, math.inf])}, ValueError, r"finite, got inf"),
        ({"dtype": torch.int64}, TypeError, r"dtype must be a floating-point dtype"),
    ],
)
def test_sinusoidal_encoding_rejects_bad_arguments(kwargs, error, match):
    args = {"positions": 4, "d_model": 8} | kwargs
    with pytest.raises(error, match=match):
        sinusoidal_encoding(args.pop("positions"), args.pop("d_model"), **args)


@pytest.mark.parametrize(
    ("k", "d_model", "error", "match"),
    [
        (1, 5, ValueError, r"even d_model, got d_model \(5\).*no cosine partner"),
        (1, 0, ValueError, r"d_model must be >= 2, got 0"),
        (math.nan, 4, ValueError, r"k must be finite, got nan"),
        ("1", 4, TypeError, r"k must be a number, got str"),
    ],
)
def test_relative_shift_matrix_rejects_bad_arguments(k, d_model, error, match):
    with pytest.raises(error, match=match):
        relative_shift_matrix(k, d_model)


@pytest.mark.parametrize("cls", [SinusoidalPositionalEncoding, LearnedPositionalEmbedding])
@pytest.mark.parametrize(
    ("x", "kwargs", "error", "match"),
    [
        (torch.zeros(2, 3, 7), {}, ValueError, r"x last dim must be 8.*\(2, 3, 7\)"),
        (torch.zeros(3, 8), {}, ValueError, r"x must have 3 dims, got shape \(3, 8\)"),
        (torch.zeros(2, 3, 8, dtype=torch.bool), {}, TypeError, r"x must be a floating.*bool"),
        (torch.zeros(2, 3, 8, dtype=torch.long), {}, TypeError, r"x must be a floating.*int64"),
        ([[0.0] * 8], {}, TypeError, r"x must be a torch.Tensor, got list"),
        (torch.zeros(2, 3, 8), {"offset": -1}, ValueError, r"offset must be >= 0, got -1"),
        (torch.zeros(2, 3, 8), {"offset": 1.0}, TypeError, r"offset must be an int, got float"),
        (
            torch.zeros(2, 3, 8),
            {"positions": torch.zeros(3, 3, dtype=torch.long)},
            ValueError,
            r"positions must have shape \(3,\) or \(2, 3\).*got \(3, 3\)",
        ),
        (
            torch.zeros(2, 3, 8),
            {"positions": torch.zeros(2, 3, 1, dtype=torch.long)},
            ValueError,
            r"positions must have 1 or 2 dims, got shape \(2, 3, 1\)",
        ),
        (
            torch.zeros(2, 3, 8),
            {"positions": torch.ones(3, dtype=torch.bool)},
            TypeError,
            r"positions must be an integer or float tensor, got dtype torch.bool",
        ),
    ],
)
def test_position_modules_reject_bad_inputs(cls, x, kwargs, error, match):
    module = cls(8) if cls is SinusoidalPositionalEncoding else cls(32, 8)
    with pytest.raises(error, match=match):
        module(x, **kwargs)


@pytest.mark.parametrize(
    ("make", "error", "match"),
    [
        (lambda: SinusoidalPositionalEncoding(0), ValueError, r"d_model must be >= 1, got 0"),
        (lambda: SinusoidalPositionalEncoding(8, base=1), ValueError, r"base must be > 1.0"),
        (lambda: SinusoidalPositionalEncoding(8, dropout=1.0), ValueError, r"dropout .*got 1.0"),
        (lambda: SinusoidalPositionalEncoding(8, layout="x"), ValueError, r"layout must be one"),
        (lambda: SinusoidalPositionalEncoding(8, max_len=0), ValueError, r"max_len must be >= 1"),
        (lambda: SinusoidalPositionalEncoding(8, max_len=2.0), TypeError, r"max_len must be an"),
        (lambda: SinusoidalPositionalEncoding(8).reserve(-1), ValueError, r"length must be >= 0"),
        (lambda: LearnedPositionalEmbedding(0, 8), ValueError, r"max_len must be >= 1, got 0"),
        (lambda: LearnedPositionalEmbedding(8, 2.5), TypeError, r"d_model must be an int"),
        (lambda: LearnedPositionalEmbedding(8, 8, dropout=-0.1), ValueError, r"dropout"),
    ],
)
def test_position_module_constructors_reject_bad_arguments(make, error, match):
    with pytest.raises(error, match=match):
        make()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_module_runs_on_cuda_and_matches_cpu():
    # Oracle: the CPU result; the table is rebuilt on the module's device.
    x = torch.randn(2, 7, 8)
    module = SinusoidalPositionalEncoding(8)
    on_gpu = module.cuda()(x.cuda(), offset=3)
    assert on_gpu.device.type == "cuda"
    # CUDA's float64 sin/cos may differ by an ulp before the float32 rounding, then one
    # add: <= 2 float32 ulps of |y| <= 5, inside the float32 defaults (rtol 1.3e-6, atol 1e-5).
    torch.testing.assert_close(on_gpu.cpu(), SinusoidalPositionalEncoding(8)(x, offset=3))
