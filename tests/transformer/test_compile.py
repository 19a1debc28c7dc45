"""Compiled models and compiled decoding: ``torch.compile(fullgraph=True)`` of the whole
forwards, the static cache layout, ``GenerationConfig(compile=True)``, and traces refused.

Oracles: the eager model on the same weights (the compiled graph must give its outputs on
unpadded, left- and right-padded rows), the growing eager cache (the static layout must give
its logits), and dynamo's own counters (how many graphs were compiled). Most compiles use
the ``eager`` backend (dynamo's capture, no code generation), so they take a second; one test
runs inductor, the default, end to end.
"""

from __future__ import annotations

import functools
from dataclasses import replace

import pytest
import torch
from tolerances import FLOAT64_EXACT
from torch._dynamo.utils import counters

from addnorm.transformer import Transformer, TransformerLM
from addnorm.transformer.config import LMConfig, TransformerConfig
from addnorm.transformer.embedding import positions_from_padding

V, PAD = 23, 0
F64 = torch.float64


def transformer(positions: str = "sinusoidal") -> Transformer:
    torch.manual_seed(0)
    cfg = TransformerConfig(
        src_vocab_size=V, tgt_vocab_size=V, d_model=16, n_heads=2, n_encoder_layers=1,
        n_decoder_layers=1, d_ff=32, dropout=0.0, position_encoding=positions, max_len=16,
    )
    return Transformer(cfg).to(F64).eval()


def language_model(positions: str = "sinusoidal") -> TransformerLM:
    torch.manual_seed(0)
    cfg = LMConfig(
        vocab_size=V, d_model=16, n_heads=2, n_layers=1, d_ff=32, dropout=0.0,
        position_encoding=positions, max_len=16,
    )
    return TransformerLM(cfg).to(F64).eval()


def padded(batch: int, length: int, seed: int = 1) -> torch.Tensor:
    """Row 0 unpadded, row 1 right-padded, row 2 left-padded (then unpadded rows)."""
    ids = torch.randint(3, V, (batch, length), generator=torch.Generator().manual_seed(seed))
    ids[1, length - 2 :] = PAD
    ids[2, :2] = PAD
    return ids


def run(model, ids: torch.Tensor, seq2seq: bool) -> torch.Tensor:
    if seq2seq:
        return model(ids, ids[:, 1:])  # the target: a shifted view, padding included
    return model(ids)


def test_positions_count_real_tokens_and_continue_after_the_last_one():
    # Definition: a real token's position counts the real tokens before it; padding before
    # a real token repeats the last one (0 at the left edge); padding after the last keeps
    # counting, so rows without padding before a real token get exactly arange(L).
    padding = torch.tensor([
        [False, False, True, True],  # right padding: arange
        [True, True, False, False],  # left padding
        [False, True, False, True],  # padding inside the row
        [True, True, True, True],  # nothing real: arange
    ])
    expected = torch.tensor([[0, 1, 2, 3], [0, 0, 0, 1], [0, 0, 1, 2], [0, 1, 2, 3]])
    assert torch.equal(positions_from_padding(padding), expected)


MODELS = {
    "lm-sinusoidal": functools.partial(language_model, "sinusoidal"),
    "lm-learned": functools.partial(language_model, "learned"),
    "lm-rotary": functools.partial(language_model, "rotary"),
    "transformer-rotary": functools.partial(transformer, "rotary"),
}


@pytest.mark.parametrize("name", MODELS)
@torch.no_grad()
def test_one_fullgraph_compile_equals_eager_on_every_batch_length_and_padding(
    name, fresh_dynamo
):
    # Oracle: eager, which takes its shortcuts (no mask, table slices) where it can; the
    # graph always takes the general path and must agree on every token, padding included.
    model = MODELS[name]()
    seq2seq = isinstance(model, Transformer)
    compiled = torch.compile(model, fullgraph=True, dynamic=True, backend="eager")
    for batch, length in [(3, 7), (4, 10), (5, 4)]:
        for ids in (padded(batch, length), torch.randint(3, V, (batch, length))):
            got, expected = run(compiled, ids, seq2seq), run(model, ids, seq2seq)
            torch.testing.assert_close(got, expected, **FLOAT64_EXACT)  # float64 models
    assert counters["stats"]["unique_graphs"] == 1  # no data-dependent guard, no recompile


@torch.no_grad()
def test_an_id_outside_the_vocabulary_fails_inside_the_compiled_graph(fresh_dynamo):
    # Eager reads the ids back and names the culprit; a graph cannot, so it asserts in-graph.
    model = language_model()
    compiled = torch.compile(model, fullgraph=True, backend="eager")
    compiled(padded(3, 5))
    with pytest.raises(RuntimeError, match=r"outside the vocabulary \[0, 23\)"):
        compiled(padded(3, 5).index_fill(1, torch.tensor([1]), V))


@torch.no_grad()
def test_tracing_is_refused_rather_than_freezing_one_batchs_padding():
    class Positional(torch.nn.Module):  # what the legacy ONNX exporter can call
        def __init__(self, model: Transformer) -> None:
            super().__init__()
            self.model = model

        def forward(self, src, tgt, src_padding, tgt_padding):
            return self.model(src, tgt, src_padding_mask=src_padding, tgt_padding_mask=tgt_padding)

    ids = padded(3, 6)
    with pytest.raises(ValueError, match=r"torch\.export\.export"):
        torch.jit.trace(language_model(), (ids,))
    with pytest.raises(ValueError, match=r"dynamo=True"):
        torch.onnx.export(
            Positional(transformer()), (ids, ids, ids == PAD, ids == PAD), None, dynamo=False
        )


# ------------------------------------------------------------------ static cache layout


@pytest.mark.parametrize("positions", ["learned", "rotary"])
@torch.no_grad()
def test_static_cache_steps_give_the_logits_of_the_growing_cache(positions, fresh_dynamo):
    # Oracle: the eager growing cache. Eager, the static layout writes and reads as it does
    # (the same logits to the bit); compiled, it writes each token in place and attends over
    # every slot, the ones not yet written marked as padding.
    for model in (language_model(positions), transformer(positions)):
        prompt = padded(3, 5)[:, :4] if isinstance(model, TransformerLM) else padded(3, 6)
        prompt[1] = prompt[0]  # an LM prompt must not be right-padded
        tokens = torch.randint(3, V, (3, 4), generator=torch.Generator().manual_seed(2))
        growing, first = model.start(prompt, max_new_tokens=5)
        static, first_static = model.start(prompt, max_new_tokens=5, static=True)
        in_graph, _ = model.start(prompt, max_new_tokens=5, static=True)
        compiled_step = torch.compile(model.step, fullgraph=True, backend="eager")
        torch.testing.assert_close(first_static, first, rtol=0, atol=0)
        for i in range(4):
            step = tokens[:, i : i + 1]
            expected = model.step(step, growing)
            torch.testing.assert_close(model.step(step, static), expected, rtol=0, atol=0)
            torch.testing.assert_close(  # float64 models; more slots summed, the same function
                compiled_step(step, in_graph), expected, **FLOAT64_EXACT
            )
        assert static.length == in_graph.length == growing.length


@torch.no_grad()
def test_a_static_cache_refuses_a_step_past_max_len():
    model = language_model()
    cache, _ = model.start(padded(3, 5)[:, :3], max_new_tokens=2, static=True)  # 5 slots
    token = torch.full((3, 1), 4)
    model.step(token, cache)
    model.step(token, cache)
    with pytest.raises(ValueError, match=r"cache overflow: length \(5\)"):
        model.step(token, cache)
    assert cache.length == 5


# ------------------------------------------------------------------ compiled generation


@pytest.fixture
def eager_backend(monkeypatch, fresh_dynamo):
    """``torch.compile`` with dynamo's capture but no code generation (fast to compile)."""
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="eager"))


@pytest.mark.parametrize("strategy", ["greedy", "beam"])
@torch.no_grad()
def test_compiled_lm_generation_gives_the_eager_tokens_with_one_graph(strategy, eager_backend):
    model = language_model("rotary")
    prompt = torch.tensor([[5, 6, 7, 8], [PAD, PAD, 9, 10], [PAD, 11, 12, 13]])
    config = replace(model.generation_config, max_new_tokens=8, strategy=strategy)
    expected = model.generate(prompt, config)
    assert torch.equal(model.generate(prompt, replace(config, compile=True)), expected)
    assert torch.equal(model.generate(prompt, replace(config, compile=True)), expected)
    assert counters["stats"]["unique_graphs"] == 1  # every step of both calls: one graph


@torch.no_grad()
def test_compiled_encoder_decoder_generation_gives_the_eager_tokens(eager_backend):
    model = transformer("sinusoidal")
    source = padded(3, 6)
    config = replace(model.generation_config, max_new_tokens=8)
    compiled = model.generate(source, replace(config, compile=True))
    assert torch.equal(compiled, model.generate(source, config))
    assert counters["stats"]["unique_graphs"] == 1


@torch.no_grad()
def test_inductor_compiled_generation_gives_the_eager_tokens(fresh_dynamo):
    # The default path end to end: inductor generates and builds the step's kernels once.
    model = language_model("rotary").float()
    prompt = torch.tensor([[5, 6, 7, 8], [PAD, PAD, 9, 10]])
    config = replace(model.generation_config, max_new_tokens=6)
    compiled = model.generate(prompt, replace(config, compile=True))
    assert torch.equal(compiled, model.generate(prompt, config))
    assert counters["stats"]["unique_graphs"] == 1


@torch.no_grad()
def test_inductor_compiled_batch_one_generation_gives_the_eager_tokens(fresh_dynamo):
    # Batch 1 is where the CPU options act: each one-row projection becomes a multiply-and-sum
    # kernel (decompose_mm_pass). Its rounding differs from the eager matmul's, the tokens
    # may not; a second call reuses the graph, skipping the shared guards after its first step.
    model = language_model("rotary").float()
    prompt = torch.tensor([[5, 6, 7, 8, 9]])
    config = replace(model.generation_config, max_new_tokens=12)
    expected = model.generate(prompt, config)
    for _ in range(2):
        assert torch.equal(model.generate(prompt, replace(config, compile=True)), expected)
    assert counters["stats"]["unique_graphs"] == 1
