"""pe-shift: PE(pos + k) = T(k) PE(pos) and the k-only dot product (SPEC claim 2)."""

from addnorm.experiments import pe_shift


def test_shift_matrix_error_is_rounding_and_dot_product_ignores_p():
    outcome = pe_shift.run(quick=True)
    assert outcome.supported
    # Identity: the error is float64 rounding of the angles alone: angles < 256 round to
    # ~256 * 2u = 6e-14 (measured 2.1e-14); a 64-term dot product at most 64x that, 3.8e-12
    # (measured 1.7e-13).
    assert outcome.numbers["max_shift_error"] < 1e-12
    assert outcome.numbers["dot_product_spread"] < 1e-11


def test_errors_cover_every_pos_and_k():
    errors = pe_shift.shift_errors(8, 5, 3)
    assert errors.shape == (3, 5)
    assert errors[0].max() == 0  # T(0) is the identity
