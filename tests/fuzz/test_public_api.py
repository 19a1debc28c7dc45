"""Fuzzing the public API: random shapes (zero-sized batches and lengths included), dtypes
(float16, bfloat16, float32, float64, and integer or bool tensors where floats belong),
non-contiguous views, random masks and fully padded rows.

The property, for every call: it returns finite values of the documented shape, or raises
ValueError/TypeError with a message (the offending value named); never another exception,
a NaN or a wrong shape. ``tests/properties.py`` sets how many examples run (25 per property by
default, 1000 with ``-m fuzz``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
from hypothesis import event, given
from hypothesis import strategies as st

from addnorm.attention import MultiHeadAttention
from addnorm.diffusion import Diffusion
from addnorm.dit import DIT_PRESETS, DiT
from addnorm.encodings import sinusoidal_encoding
from addnorm.norms import NORM_KINDS, NoNorm, make_norm
from addnorm.timestep import timestep_embedding
from addnorm.transformer import Transformer, TransformerLM
from addnorm.transformer.config import PRESETS

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int64, torch.bool]
ID_DTYPES = [torch.int16, torch.int32, torch.int64, torch.uint8, torch.float32, torch.bool]
V, D = 20, 16


def outcome(
    call: Callable[[], torch.Tensor], shape: tuple[int, ...] | None
) -> torch.Tensor | None:
    """``call()``'s result after checking its shape (unless None: the caller checks it) and
    finiteness, or None if it refused the input with ValueError/TypeError (with a message);
    anything else fails the test."""
    try:
        out = call()
    except (ValueError, TypeError) as err:
        assert str(err).strip(), f"{type(err).__name__} without a message"
        event(f"refused: {type(err).__name__}")  # (--hypothesis-show-statistics counts them)
        return None
    event("returned")
    got = tuple(out.shape)
    assert shape is None or got == shape, f"shape {got}, documented {shape}"
    if out.is_floating_point():
        assert torch.isfinite(out.float()).all(), "non-finite values"
    return out


def tensor(draw, shape: tuple[int, ...], dtype: torch.dtype, *, contiguous: bool) -> torch.Tensor:
    """A random tensor of ``shape`` and ``dtype``; a transposed (non-contiguous) view of one
    when not ``contiguous``."""
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
    if not contiguous and len(shape) >= 2:
        base = torch.randn(shape[::-1], generator=gen).permute(*reversed(range(len(shape))))
    else:
        base = torch.randn(shape, generator=gen)
    if dtype == torch.bool:
        return base > 0
    if not dtype.is_floating_point:
        return (base * 3).round().to(dtype)
    return base.to(dtype)


def magnitude(t: torch.Tensor) -> torch.Tensor:
    """Timestep-like values: |t| * 100 for numbers, bool tensors as they are (to be refused)."""
    return t if t.dtype == torch.bool else (t.abs() * 100).to(t.dtype)


def mask(draw, shape: tuple[int, ...]) -> torch.Tensor:
    """A random bool mask; sometimes all True (every position padded) or all False."""
    kind = draw(st.sampled_from(["random", "all", "none"]))
    if kind != "random":
        return torch.full(shape, kind == "all")
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
    return torch.rand(shape, generator=gen) < 0.5


@given(st.data())
def test_sinusoidal_encoding(data):
    draw = data.draw
    d_model = draw(st.integers(0, 17))
    layout = draw(st.sampled_from(["interleaved", "halves", "whisper"]))
    dtype = draw(st.sampled_from([None, torch.float16, torch.bfloat16, torch.float64]))
    if draw(st.booleans()):
        positions: int | torch.Tensor = draw(st.integers(-2, 40))
        n = positions
    else:
        n = draw(st.integers(0, 6))
        positions = tensor(draw, (n,), draw(st.sampled_from(DTYPES)), contiguous=True)
    outcome(lambda: sinusoidal_encoding(positions, d_model, layout=layout, dtype=dtype),
            (n, d_model))


@given(st.data())
def test_timestep_embedding(data):
    draw = data.draw
    n, dim = draw(st.integers(0, 5)), draw(st.integers(0, 17))
    t = magnitude(tensor(draw, (n,), draw(st.sampled_from(DTYPES)), contiguous=True))
    outcome(lambda: timestep_embedding(t, dim), (n, dim))


NORMS = {**{kind: make_norm(kind, 32) for kind in NORM_KINDS}, "none": NoNorm()}


@given(st.data())
def test_every_norm(data):
    draw = data.draw
    kind = draw(st.sampled_from(sorted(NORMS)))
    norm = NORMS[kind].train(draw(st.booleans()))
    shape = (draw(st.integers(0, 3)), draw(st.integers(0, 4)), 32)
    shape = shape if draw(st.booleans()) else (shape[0], 32)
    x = tensor(draw, shape, draw(st.sampled_from(DTYPES)), contiguous=draw(st.booleans()))
    padding = mask(draw, shape[:2]) if len(shape) == 3 and draw(st.booleans()) else None
    with torch.no_grad():
        outcome(lambda: norm(x, padding_mask=padding), shape)


ATTENTION = MultiHeadAttention(D, 4).eval()


@given(st.data())
def test_multi_head_attention_with_random_masks(data):
    draw = data.draw
    batch, length, keys = draw(st.integers(0, 3)), draw(st.integers(0, 4)), draw(st.integers(0, 4))
    dtype = draw(st.sampled_from(DTYPES))
    x = tensor(draw, (batch, length, D), dtype, contiguous=draw(st.booleans()))
    cross = draw(st.booleans())
    memory = tensor(draw, (batch, keys, D), dtype, contiguous=True) if cross else None
    s = keys if cross else length
    padding = mask(draw, (batch, s)) if draw(st.booleans()) else None
    attend_shape = draw(st.sampled_from([None, (length, s), (batch, length, s)]))
    attend = None if attend_shape is None else mask(draw, attend_shape)
    causal = draw(st.booleans())
    with torch.no_grad():
        outcome(
            lambda: ATTENTION(x, memory, padding_mask=padding, attend_mask=attend, causal=causal),
            (batch, length, D),
        )


CFG = dataclasses.replace(
    PRESETS["tiny"], d_model=D, n_heads=2, d_ff=32, n_encoder_layers=1, n_decoder_layers=1,
    src_vocab_size=V, tgt_vocab_size=V, dropout=0.0, max_len=16,
)
TRANSFORMER = Transformer(CFG).eval()
LM = TransformerLM(dataclasses.replace(
    PRESETS["lm-tiny"], d_model=D, n_heads=2, d_ff=32, n_layers=1, vocab_size=V, dropout=0.0,
)).eval()


def token_ids(draw, shape: tuple[int, ...]) -> torch.Tensor:
    """Random ids of a random integer (or, to be refused, float or bool) dtype; some rows
    padded at the end, some entirely."""
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
    ids = torch.randint(3, V, shape, generator=gen)
    if len(shape) == 2 and shape[1]:
        for row in range(shape[0]):
            ids[row, draw(st.integers(0, shape[1])):] = 0  # pad_id
    return ids.to(draw(st.sampled_from(ID_DTYPES)))


@given(st.data())
def test_transformer(data):
    draw = data.draw
    batch = draw(st.integers(0, 3))
    src = token_ids(draw, (batch, draw(st.integers(0, 6))))
    tgt = token_ids(draw, (batch, draw(st.integers(0, 5))))
    if draw(st.booleans()):
        src = src.t().contiguous().t()  # a non-contiguous view of the same ids
    with torch.no_grad():
        outcome(lambda: TRANSFORMER(src, tgt), (*tgt.shape, V))


@given(st.data())
def test_transformer_lm_generate(data):
    draw = data.draw
    batch, length = draw(st.integers(0, 3)), draw(st.integers(0, 5))
    prompt = token_ids(draw, (batch, length)).flip(1)  # left padding
    padding = (prompt == 0) if draw(st.booleans()) else None
    new = draw(st.integers(1, 4))
    config = dataclasses.replace(LM.generation_config, max_new_tokens=new)
    out = outcome(lambda: LM.generate(prompt, config, padding_mask=padding), None)
    if out is not None:  # (B, N) new tokens, N <= new: it stops once every row ended (eos)
        assert out.shape[0] == batch and out.shape[1] <= new
        assert out.dtype == torch.long and bool(((out >= 0) & (out < V)).all())


DIT_CFG = dataclasses.replace(DIT_PRESETS["DiT-digits"], n_layers=1, d_model=32, n_heads=2)
DIT = DiT(DIT_CFG).eval()


@given(st.data())
def test_dit(data):
    draw = data.draw
    c, size = DIT_CFG.in_channels, DIT_CFG.input_size
    batch = draw(st.integers(0, 3))
    x = tensor(draw, (batch, c, size, size), draw(st.sampled_from(DTYPES)),
               contiguous=draw(st.booleans()))
    t = magnitude(tensor(draw, (batch,), draw(st.sampled_from(DTYPES)), contiguous=True))
    y = torch.randint(0, DIT_CFG.n_classes + 1, (batch,)).to(draw(st.sampled_from(ID_DTYPES)))
    c_out = c * (2 if DIT_CFG.learn_sigma else 1)
    with torch.no_grad():
        outcome(lambda: DIT(x, t, y), (batch, c_out, size, size))


DIFFUSION = Diffusion(n_steps=20, schedule="cosine")


@given(st.data())
def test_diffusion_sample(data):
    draw = data.draw
    shape = (draw(st.integers(0, 3)), draw(st.integers(1, 2)), draw(st.integers(0, 4)), 3)
    noise = tensor(draw, shape, draw(st.sampled_from(DTYPES)), contiguous=draw(st.booleans()))
    method = draw(st.sampled_from(["ddpm", "ddim"]))
    steps = draw(st.integers(0, 21))

    def eps_fn(x_t, t):  # a finite stand-in for a trained model
        return 0.5 * x_t

    outcome(lambda: DIFFUSION.sample(eps_fn, noise, steps=steps, method=method), shape)
