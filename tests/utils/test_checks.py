"""Tests for addnorm.utils.checks: the argument validation used at every public boundary.

Provenance of expected values: identities (a NumPy scalar is accepted as the Python number of
the same value, so results equal those for the Python number) and the error contract of
STYLE rule 12 (the offending name and value are in the message).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from addnorm.encodings import relative_shift_matrix, sinusoidal_encoding
from addnorm.feedforward import FeedForward
from addnorm.norms import LayerNorm, make_norm
from addnorm.timestep import timestep_embedding
from addnorm.utils.checks import check_bool, check_dtype, check_float, check_int


@pytest.mark.parametrize("value", [4, np.int64(4), np.int32(4), np.uint8(4)])
def test_check_int_accepts_python_and_numpy_integers_as_python_ints(value):
    # Identity: operator.index gives the same integer, as a Python int.
    out = check_int("n", value, min_value=1)
    assert out == 4 and type(out) is int


@pytest.mark.parametrize(
    "value", [True, np.True_, 4.0, np.float64(4.0), torch.tensor(4), "4", None]
)
def test_check_int_refuses_bools_floats_and_tensors_naming_them(value):
    with pytest.raises(TypeError, match=r"n must be an int, got "):
        check_int("n", value)


def test_check_int_range_error_names_the_value_of_a_numpy_integer():
    with pytest.raises(ValueError, match=r"n must be >= 1, got -2$"):
        check_int("n", np.int64(-2), min_value=1)


@pytest.mark.parametrize("value", [0.5, np.float32(0.5), np.float64(0.5)])
def test_check_float_accepts_numpy_reals_as_python_floats(value):
    # Identity: 0.5 is exact in every float width.
    out = check_float("p", value)
    assert out == 0.5 and type(out) is float


@pytest.mark.parametrize("value", [True, np.True_, "0.5", torch.tensor(0.5), None])
def test_check_float_refuses_bools_and_non_numbers(value):
    with pytest.raises(TypeError, match=r"p must be a number, got "):
        check_float("p", value)


@pytest.mark.parametrize("value", [0, 1, "no", None, np.True_])
def test_check_bool_wants_a_real_bool(value):
    with pytest.raises(TypeError, match=r"flag must be a bool, got "):
        check_bool("flag", value)


def test_check_dtype_refuses_strings_and_non_float_dtypes():
    assert check_dtype("dtype", None) is None
    assert check_dtype("dtype", torch.float16, floating=True) is torch.float16
    with pytest.raises(TypeError, match=r"dtype must be a torch.dtype, got str \('float32'\)"):
        check_dtype("dtype", "float32")
    with pytest.raises(TypeError, match=r"floating-point dtype, got torch.int64"):
        check_dtype("dtype", torch.int64, floating=True)


# ---------------------------------------------------------------- through the public API


def test_numpy_scalars_work_where_python_numbers_do():
    # Identity: the same values as Python numbers give the same tensors.
    assert torch.equal(sinusoidal_encoding(np.int64(3), np.int64(4)), sinusoidal_encoding(3, 4))
    t = torch.tensor([3.0, 500.0])
    assert torch.equal(timestep_embedding(t, 8, np.float32(1000)), timestep_embedding(t, 8, 1000))
    assert LayerNorm(np.int64(8)).weight.shape == (8,)


@pytest.mark.parametrize(
    "call",
    [
        lambda: sinusoidal_encoding(3, 4, dtype="float32"),
        lambda: relative_shift_matrix(1.0, 4, dtype="float64"),
    ],
)
def test_a_dtype_that_is_not_a_torch_dtype_is_refused_naming_it(call):
    with pytest.raises(TypeError, match=r"dtype must be a torch.dtype, got str \('float"):
        call()


@pytest.mark.parametrize(
    "build",
    [
        lambda: FeedForward(8, 16, bias="no"),
        lambda: FeedForward(8, 16, activation="swiglu", bias=0),
        lambda: LayerNorm(8, bias="no"),
        lambda: make_norm("layer", 8, bias=1),
    ],
)
def test_bias_must_be_a_bool(build):
    with pytest.raises(TypeError, match=r"bias must be a bool, got (str|int)"):
        build()
