"""Exported and compiled models do not specialise on how the batch size and lengths compare.

A shape check that compares a tuple of traced sizes with a tuple of other sizes (``(B, L)``
against ``(L,)``) asks whether B == L, and ``torch.export`` keeps the answer as a guard: a
program captured at B == L then refuses every other batch, and one captured at B != L
refuses B == L (``Guard failed: ids.size()[1] != ids.size()[0]``). Under ``torch.compile``
any such guard costs a recompile when the relation flips.

Each model is exported once per module at example shapes where batch and lengths are equal
(the LM also through :func:`addnorm.export.export_program`, whose example has them unequal:
a guard is caught from either side, since it fails where the relation flips); then
hypothesis draws the shapes it runs at: batch equal to a length, source equal to target,
length 1, batch 1. Oracle: the eager model on the same weights and inputs. The models run in
float64, where the captured graph (the general path: per-row positions, the mask always) and
eager's shortcuts compute the same function and differ by rounding alone: ``FLOAT64_EXACT``.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st
from properties import examples
from tolerances import FLOAT64_EXACT
from torch._dynamo.source import ConstantSource
from torch._dynamo.utils import counters
from torch.export import Dim
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv

from addnorm.export import export_program
from addnorm.transformer import Transformer, TransformerLM
from addnorm.transformer.config import LMConfig, TransformerConfig
from addnorm.transformer.encoder_model import EncoderConfig, EncoderModel
from addnorm.utils.checks import same_shape

V, PAD, MAX_LEN = 19, 0, 16
F64 = torch.float64
MAX_BATCH = 6

# tests/properties.py: bounded and derandomized by default, no database.
SHAPES = examples(6)


def language_model() -> TransformerLM:
    torch.manual_seed(0)
    cfg = LMConfig(
        vocab_size=V, d_model=16, n_heads=2, n_layers=1, d_ff=32, dropout=0.0,
        position_encoding="rotary", max_len=MAX_LEN,
    )
    return TransformerLM(cfg).to(F64).eval()


def transformer() -> Transformer:
    torch.manual_seed(0)
    cfg = TransformerConfig(
        src_vocab_size=V, tgt_vocab_size=V, d_model=16, n_heads=2, n_encoder_layers=1,
        n_decoder_layers=1, d_ff=32, dropout=0.0, position_encoding="learned", max_len=MAX_LEN,
    )
    return Transformer(cfg).to(F64).eval()


def encoder_model() -> EncoderModel:
    torch.manual_seed(0)
    cfg = EncoderConfig(
        vocab_size=V, d_model=16, n_heads=2, n_layers=1, d_ff=32, dropout=0.0,
        max_len=MAX_LEN, n_token_types=2, pooler=True,
    )
    return EncoderModel(cfg).to(F64).eval()


def tokens(batch: int, length: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random real ids and padding: row 0 unpadded, the others left- and right-padded by
    random amounts (a row may be all padding), pad ids exactly where the mask says.

    Shapes:
        returns: ids (B, L) int64, padding_mask (B, L) bool
    """
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(PAD + 1, V, (batch, length), generator=gen)  # (B, L)
    padding = torch.zeros(batch, length, dtype=torch.bool)  # (B, L)
    for row in range(1, batch):
        left, right = torch.randint(0, length + 1, (2,), generator=gen).tolist()
        padding[row, :left] = True
        padding[row, length - right :] = True
    return ids.masked_fill(padding, PAD), padding


def lm_inputs(batch: int, length: int, seed: int = 0) -> dict[str, torch.Tensor]:
    ids, padding = tokens(batch, length, seed)
    return {"ids": ids, "padding_mask": padding}


def transformer_inputs(
    batch: int, src_length: int, tgt_length: int, seed: int = 0
) -> dict[str, torch.Tensor]:
    src, src_padding = tokens(batch, src_length, seed)
    tgt, tgt_padding = tokens(batch, tgt_length, seed + 1)
    return {"src_ids": src, "tgt_ids": tgt, "src_padding_mask": src_padding,
            "tgt_padding_mask": tgt_padding}


def encoder_inputs(batch: int, length: int, seed: int = 0) -> dict[str, torch.Tensor]:
    ids, padding = tokens(batch, length, seed)
    types = torch.randint(0, 2, (batch, length), generator=torch.Generator().manual_seed(seed))
    return {"ids": ids, "padding_mask": padding, "token_type_ids": types}


def dims(names: dict[str, str], maximum: int | None) -> dict[str, dict[int, Dim]]:
    """One Dim for the batch and one per named length; ``names``: input -> its length's Dim."""
    batch = Dim("batch", min=1)
    lengths = {n: Dim(n, min=1, max=maximum) for n in set(names.values())}
    return {name: {0: batch, 1: lengths[length]} for name, length in names.items()}


def export_at(model: torch.nn.Module, inputs: dict[str, torch.Tensor], names: dict[str, str],
              maximum: int | None) -> Callable[..., torch.Tensor]:
    program = torch.export.export(model, (), inputs, dynamic_shapes=dims(names, maximum))
    return program.module()


def assert_runs_as_eager(program: Callable[..., torch.Tensor], model: torch.nn.Module,
                         inputs: dict[str, torch.Tensor]) -> None:
    with torch.no_grad():
        got = program(**inputs)
        expected = model(**inputs)
    # Same weights, same function; the graph's general path and eager's shortcuts differ by
    # float64 rounding only (tests/tolerances.py).
    torch.testing.assert_close(got, expected, **FLOAT64_EXACT)


# ------------------------------------------------------------------ the shape comparison


def test_same_shape_compares_ranks_before_sizes_and_records_no_guard():
    # Two traced sizes that happen to be equal (B == L == 3), as while export captures.
    env = ShapeEnv()

    def size(name: str, hint: int) -> torch.SymInt:
        symbol = env.create_symbol(hint, ConstantSource(name), dynamic_dim=DimDynamic.DYNAMIC)
        return env.create_symintnode(symbol, hint=hint)

    batch, length = size("B", 3), size("L", 3)
    assert not same_shape((batch, length), (length,))  # ranks differ: no size is compared
    assert same_shape((batch, length), (batch, length))  # each dim with itself
    assert env.guards == []
    # The comparison it replaces asks B == L and records the answer: the check above can fail.
    assert (batch, length) != (length,)
    assert len(env.guards) == 1


# ------------------------------------------------------------------ the exported programs

LM_DIMS = {"ids": "length", "padding_mask": "length"}
TRANSFORMER_DIMS = {"src_ids": "src_length", "src_padding_mask": "src_length",
                    "tgt_ids": "tgt_length", "tgt_padding_mask": "tgt_length"}
ENCODER_DIMS = {"ids": "length", "padding_mask": "length", "token_type_ids": "length"}


@pytest.fixture(scope="module")
def lm_programs():
    """The LM, exported at B == L == 4 and by ``export_program`` (B = 3, L = 7)."""
    model = language_model()
    at_equal = export_at(model, lm_inputs(4, 4), LM_DIMS, None)
    return model, {"equal example": at_equal, "export_program": export_program(model).module()}


@pytest.fixture(scope="module")
def transformer_program():
    """The Transformer, exported at B == S == L == 4."""
    model = transformer()
    return model, export_at(model, transformer_inputs(4, 4, 4), TRANSFORMER_DIMS, MAX_LEN)


@pytest.fixture(scope="module")
def encoder_program():
    """The EncoderModel (a learned position table: L <= max_len), exported at B == L == 4."""
    model = encoder_model()
    return model, export_at(model, encoder_inputs(4, 4), ENCODER_DIMS, MAX_LEN)


@st.composite
def batch_and_length(draw: st.DrawFn) -> tuple[int, int]:
    """A batch size and a length, often equal, often 1."""
    batch = draw(st.integers(1, MAX_BATCH))
    length = draw(st.one_of(st.just(batch), st.just(1), st.integers(1, MAX_LEN)))
    return batch, length


@st.composite
def batch_and_lengths(draw: st.DrawFn) -> tuple[int, int, int]:
    """A batch size, a source and a target length, often equal to one another, often 1."""
    batch, src_length = draw(batch_and_length())
    tgt_length = draw(st.one_of(
        st.just(src_length), st.just(batch), st.just(1), st.integers(1, MAX_LEN)
    ))
    return batch, src_length, tgt_length


@SHAPES
@given(shape=batch_and_length(), seed=st.integers(0, 2**16))
@example(shape=(4, 4), seed=0)  # the example's own shapes
@example(shape=(3, 3), seed=1)  # B == L, not the example's
@example(shape=(3, 7), seed=2)  # export_program's example: B != L
@example(shape=(1, 1), seed=3)
@example(shape=(5, 1), seed=4)
def test_an_exported_lm_runs_at_any_batch_and_length(lm_programs, shape, seed):
    model, programs = lm_programs
    for program in programs.values():
        assert_runs_as_eager(program, model, lm_inputs(*shape, seed=seed))


@SHAPES
@given(shape=batch_and_lengths(), seed=st.integers(0, 2**16))
@example(shape=(4, 4, 4), seed=0)  # the example's own shapes
@example(shape=(2, 2, 2), seed=1)  # B == S == L, not the example's
@example(shape=(3, 5, 5), seed=2)  # S == L
@example(shape=(3, 3, 6), seed=3)  # B == S
@example(shape=(3, 6, 3), seed=4)  # B == L
@example(shape=(3, 7, 6), seed=5)  # all three differ
@example(shape=(1, 1, 1), seed=6)
def test_an_exported_transformer_runs_at_any_batch_and_lengths(transformer_program, shape, seed):
    model, program = transformer_program
    assert_runs_as_eager(program, model, transformer_inputs(*shape, seed=seed))


@SHAPES
@given(shape=batch_and_length(), seed=st.integers(0, 2**16))
@example(shape=(4, 4), seed=0)  # the example's own shapes
@example(shape=(2, 5), seed=1)  # B != L
@example(shape=(1, 1), seed=2)
def test_an_exported_encoder_model_runs_at_any_batch_and_length(encoder_program, shape, seed):
    model, program = encoder_program
    assert_runs_as_eager(program, model, encoder_inputs(*shape, seed=seed))


# ------------------------------------------------------------------ dynamic compiles

COMPILED = {
    "lm": (language_model, lambda b, n: lm_inputs(b, n)),
    "transformer": (transformer, lambda b, n: transformer_inputs(b, n, n)),
    "encoder_model": (encoder_model, lambda b, n: encoder_inputs(b, n)),
}


@pytest.mark.parametrize("name", COMPILED)
@torch.no_grad()
def test_a_dynamic_compile_serves_batch_equal_to_length_without_recompiling(name, fresh_dynamo):
    # (B, L) then (L, L) (for the Transformer B != S == L, then B == S == L): one graph. Any
    # comparison of B with L would have been recorded as the guard B != L at the first call
    # and fail at the second. (The reverse order recompiles whatever the model does: dynamo's
    # duck sizing gives the equal sizes of an (L, L) first call one symbol.)
    build, inputs = COMPILED[name]
    model = build()
    compiled = torch.compile(model, dynamic=True, fullgraph=True, backend="eager")
    with torch._dynamo.config.patch(error_on_recompile=True):
        for batch, length in [(2, 5), (5, 5)]:
            assert_runs_as_eager(compiled, model, inputs(batch, length))
    assert counters["stats"]["unique_graphs"] == 1
