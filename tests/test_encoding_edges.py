"""Position tables and the timestep embedding at the edges of their input space.

Sizes: a table whose sines and cosines cannot fit in the device's memory is refused with a
ValueError naming the argument, before anything is allocated; with the memory bound lowered
(``device_memory`` patched) the boundary itself is checked: accepted sizes give finite
tables of the documented shape. Timesteps: every accepted ``scale`` / ``max_period`` /
``downscale_freq_shift`` gives finite values equal bit for bit to diffusers'
``get_timestep_embedding`` restated (the same float32 operations in the same order); the
rest raise ValueError naming the value.

Oracles: the byte count stated in :func:`addnorm.encodings.check_table_size`; the diffusers
restatement; SPEC section 2's formula for the frequencies.
"""

from __future__ import annotations

import math
from unittest import mock

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st
from properties import examples

from addnorm.encodings import (
    SinusoidalPositionalEncoding,
    relative_shift_matrix,
    sinusoidal_encoding,
)
from addnorm.rotary import RotaryEmbedding
from addnorm.timestep import TimestepEmbedder, timestep_embedding
from addnorm.utils import memory as _memory

BOUNDED = examples(25)
HUGE = st.integers(2**40, 2**62)  # x 8 bytes: >= 8 TiB, more than any machine here
F32_HALF_MAX = torch.finfo(torch.float32).max / 2


def table_bytes(rows: int, width: int) -> int:
    """What check_table_size counts: float64 sines and cosines plus the frequencies."""
    return (rows * width + (width + 1) // 2) * 8


# ------------------------------------------------------------------------- table sizes


@BOUNDED
@given(count=HUGE, d_model=st.integers(1, 64))
def test_a_sinusoid_table_no_memory_holds_is_refused_naming_the_count(count, d_model):
    with pytest.raises(ValueError, match=rf"positions \({count}\) x width \({d_model}\)"):
        sinusoidal_encoding(count, d_model)


@BOUNDED
@given(count=st.integers(0, 4), d_model=HUGE)
def test_a_sinusoid_width_no_memory_holds_is_refused_naming_it(count, d_model):
    # The frequencies alone (ceil(D/2) float64) exceed memory, even for 0 positions.
    with pytest.raises(ValueError, match=rf"x width \({d_model}\)"):
        sinusoidal_encoding(count, d_model)
    with pytest.raises(ValueError, match=rf"x width \({d_model}\)"):
        sinusoidal_encoding(torch.arange(count), d_model)


@BOUNDED
@given(size=HUGE, which=st.sampled_from(["max_len", "width", "reserve"]))
def test_module_tables_no_memory_holds_are_refused_naming_the_argument(size, which):
    if which == "max_len":
        builders = [lambda: SinusoidalPositionalEncoding(8, max_len=size),
                    lambda: RotaryEmbedding(8, max_len=size)]
        words = rf"max_len \({size}\)"
    elif which == "width":
        builders = [lambda: SinusoidalPositionalEncoding(size, max_len=1),
                    lambda: RotaryEmbedding(2 * size, max_len=1)]
        words = r"max_len \(1\) x width"
    else:
        builders = [lambda: SinusoidalPositionalEncoding(8, max_len=4).reserve(size),
                    lambda: RotaryEmbedding(8, max_len=4).reserve(size)]
        words = rf"length \({size}\)"
    for build in builders:
        with pytest.raises(ValueError, match=words):
            build()


LIMIT = 20_000  # bytes: a lowered memory bound, so the boundary is reachable in a test


@BOUNDED
@given(count=st.integers(0, 600), d_model=st.integers(1, 40),
       layout=st.sampled_from(["interleaved", "halves"]))
def test_a_table_is_computed_exactly_when_it_fits_the_memory_bound(count, d_model, layout):
    # Oracle: the stated byte count against the (patched) bound; accepted tables are finite,
    # of shape (P, D), with every value a sine or cosine (|v| <= 1, exact).
    fits = table_bytes(count, d_model) <= LIMIT
    with mock.patch.object(_memory, "device_memory", return_value=LIMIT):
        if not fits:
            with pytest.raises(ValueError, match=rf"positions \({count}\) x width \({d_model}\)"):
                sinusoidal_encoding(count, d_model, layout=layout)
            return
        table = sinusoidal_encoding(count, d_model, layout=layout)
    assert table.shape == (count, d_model) and table.dtype == torch.float32
    assert torch.isfinite(table).all() and (table.abs() <= 1).all()


@BOUNDED
@given(max_len=st.integers(1, 600), d_head=st.integers(1, 20).map(lambda h: 2 * h))
def test_rotary_tables_are_built_exactly_when_they_fit_the_memory_bound(max_len, d_head):
    fits = table_bytes(max_len, d_head) <= LIMIT
    with mock.patch.object(_memory, "device_memory", return_value=LIMIT):
        if not fits:
            with pytest.raises(ValueError, match=rf"max_len \({max_len}\)"):
                RotaryEmbedding(d_head, max_len=max_len)
            return
        rope = RotaryEmbedding(d_head, max_len=max_len)
    assert rope.cos_cached.shape == rope.sin_cached.shape == (max_len, d_head)
    # Identity: cos^2 + sin^2 = 1 for each angle; float32 values rounded once: within 4 u.
    one = rope.cos_cached.double() ** 2 + rope.sin_cached.double() ** 2
    torch.testing.assert_close(one, torch.ones_like(one), rtol=0, atol=4 * 2**-24)


# ------------------------------------------------------------------- timestep embedding


def diffusers_embedding(t, dim, shift, scale, max_period):
    """diffusers' get_timestep_embedding with flip_sin_to_cos=True, restated line by line."""
    half_dim = dim // 2
    exponent = -math.log(max_period) * torch.arange(0, half_dim, dtype=torch.float32)
    exponent = exponent / (half_dim - shift)
    emb = torch.exp(exponent)
    emb = t[:, None].float() * emb[None, :]
    emb = scale * emb
    emb = torch.cat([torch.sin(emb), torch.cos(emb)], dim=-1)
    emb = torch.cat([emb[:, half_dim:], emb[:, :half_dim]], dim=-1)
    if dim % 2 == 1:
        emb = F.pad(emb, (0, 1, 0, 0))
    return emb


POSITIVE = st.floats(min_value=5e-324, max_value=1.7e308)  # every positive finite float64


@BOUNDED
@given(
    scale=st.one_of(POSITIVE, st.sampled_from([5e-324, 1.0, 1e30, F32_HALF_MAX, 1e39])),
    max_period=st.one_of(POSITIVE, st.sampled_from([5e-324, 1e-39, 0.5, 1.0, 1e308])),
    shift=st.sampled_from([0.0, 1.0, -3.0, 0.999]),
    dim=st.integers(2, 12),
    t=st.lists(st.floats(-(2.0**100), 2.0**100, width=32), min_size=1, max_size=4),
)
def test_every_accepted_timestep_setting_is_finite_and_diffusers_bit_for_bit(
    scale, max_period, shift, dim, t
):
    if dim // 2 <= shift:
        return  # refused for the divisor, tested in test_timestep.py
    timesteps = torch.tensor(t, dtype=torch.float32)
    try:
        got = timestep_embedding(timesteps, dim, max_period, downscale_freq_shift=shift,
                                 scale=scale)
    except ValueError as error:
        assert any(name in str(error) for name in ("max_period", "scale", "timesteps"))
        return
    assert got.shape == (len(t), dim) and torch.isfinite(got).all()
    assert torch.equal(got, diffusers_embedding(timesteps, dim, shift, scale, max_period))


@pytest.mark.parametrize(
    ("dim", "t", "kwargs", "words"),
    [
        (8, 999.0, {"max_period": 5e-324}, r"max_period \(4.94066e-324\)"),  # freqs to e^558
        (256, 999.0, {"max_period": 1e-39}, r"max_period \(1e-39\)"),  # exp(89.1) > max
        (8, 1e30, {"max_period": 1e-20}, r"timesteps up to \|t\| = 1e\+30"),  # 1e30 * 1e15
        (8, 999.0, {"scale": 1e300}, r"scale \(1e\+300\)"),  # beyond float32 itself
        (8, 999.0, {"scale": 1e38}, r"scale \(1e\+38\)"),  # 999 * 1e38 overflows float32
    ],
)
def test_settings_that_used_to_give_nan_are_refused_naming_the_value(dim, t, kwargs, words):
    timesteps = torch.tensor([0.0, 1.0, t])
    with pytest.raises(ValueError, match=words):
        timestep_embedding(timesteps, dim, **kwargs)


@BOUNDED
@given(max_period=st.floats(1.0, 1.7e308), scale=st.floats(5e-324, 1.0),
       t=st.lists(st.floats(-(2.0**100), 2.0**100, width=32), min_size=1, max_size=4))
def test_max_period_at_least_one_and_scale_at_most_one_are_always_accepted(max_period, scale, t):
    # Every frequency is <= 1 (exponent <= 0) and scale <= 1, so each angle is at most |t|,
    # finite in float32: nothing here may be refused.
    got = timestep_embedding(torch.tensor(t), 8, max_period, scale=scale)
    assert got.shape == (len(t), 8) and torch.isfinite(got).all()


def test_integer_timesteps_are_checked_only_where_their_range_could_overflow():
    # int64 timesteps up to 2**63 with frequencies <= 1 cannot overflow float32 (9.2e18 <
    # 1.7e38); with max_period 1e-39 (frequencies up to 1.8e29) their values are read.
    ok = timestep_embedding(torch.tensor([0, 10**18]), 8)
    assert torch.isfinite(ok).all()
    assert torch.isfinite(timestep_embedding(torch.tensor([0, 3]), 8, 1e-39)).all()
    with pytest.raises(ValueError, match=r"timesteps up to \|t\| = 1e\+18"):
        timestep_embedding(torch.tensor([0, 10**18]), 8, 1e-39)


def test_an_embedder_refuses_a_max_period_whose_frequencies_overflow():
    with pytest.raises(ValueError, match=r"max_period \(1e-300\)"):
        TimestepEmbedder(16, d_freq=256, max_period=1e-300)


@BOUNDED
@given(d_model=st.integers(2**24, 2**40).map(lambda d: 2 * d))
def test_a_shift_matrix_no_memory_holds_is_refused_naming_d_model(d_model):
    # T(k) is a dense (D, D) matrix: 8 * (2**25)**2 bytes = 8 PiB at the least here.
    with pytest.raises(ValueError, match=rf"d_model \({d_model}\) of a shift matrix"):
        relative_shift_matrix(1.0, d_model)
