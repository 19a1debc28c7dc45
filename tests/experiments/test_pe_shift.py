"""pe-shift: PE(pos + k) = T(k) PE(pos) (seeds 000, 002) and, as SPEC's own reading, the
k-only dot product."""

import torch

from addnorm.encodings import sinusoidal_encoding
from addnorm.experiments import pe_shift


def test_shift_matrix_error_is_rounding_and_dot_product_ignores_p():
    outcome = pe_shift.run(quick=True)
    assert outcome.supported
    # Identity: the error is float64 rounding of the angles alone: angles < 256 round to
    # ~256 * 2u = 6e-14 (measured 2.1e-14); a 64-term dot product at most 64x that, 3.8e-12
    # (measured 1.7e-13).
    assert outcome.numbers["max_shift_error"] < 1e-12
    assert outcome.numbers["dot_product_spread"] < 1e-11
    (dot,) = outcome.also
    assert dot.supported and "depends on the offset k only" in dot.claim


def test_errors_cover_every_pos_and_k():
    errors = pe_shift.shift_errors(8, 5, 3)
    assert errors.shape == (3, 5)
    assert errors[0].max() == 0  # T(0) is the identity


def seed_000_printed_matrix(k: int, d_model: int) -> torch.Tensor:
    """The matrix seed 000 prints: [[cos wk, sin wk], [sin wk, cos wk]] per frequency, both
    off-diagonal signs positive (a typo; the rotation has -sin below the diagonal)."""
    omega = torch.tensor(1.0, dtype=torch.float64) / 10000.0 ** (
        torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    matrix = torch.zeros(d_model, d_model, dtype=torch.float64)
    for i, w in enumerate(omega):
        c, s = torch.cos(w * k), torch.sin(w * k)
        matrix[2 * i : 2 * i + 2, 2 * i : 2 * i + 2] = torch.stack([torch.stack([c, s]),
                                                                    torch.stack([s, c])])
    return matrix


def test_seed_000s_misprinted_matrix_is_not_supported():
    # Invariant: at k = 0 both matrices are the identity; beyond, the typo's error is of
    # order 1 (sin(w k) of the wrong sign), far above the 1e-9 tolerance.
    assert torch.equal(seed_000_printed_matrix(0, 8), torch.eye(8, dtype=torch.float64))
    pe = sinusoidal_encoding(torch.arange(3, dtype=torch.float64), 8)
    assert (pe[2] - seed_000_printed_matrix(1, 8) @ pe[1]).abs().max() > 0.1
    outcome = pe_shift.run(quick=True, shift_matrix=seed_000_printed_matrix)
    assert outcome.verdict == "not supported"
    assert outcome.numbers["max_shift_error"] > 0.1
