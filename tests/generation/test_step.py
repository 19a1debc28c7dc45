"""The compiled decode step as CUDA graphs need it, checked on the CPU.

A CUDA graph replays its kernels against the addresses it was recorded with, so a compiled
decode step (``GenerationConfig(compile=True)``) must: compile with ``mode="reduce-overhead"``
on CUDA; keep every tensor it writes in place at one address for the whole generation, and
from one ``generate`` call to the next (:func:`held_buffers`); start each replay with
``cudagraph_mark_step_begin`` and hand the loop a copy of the logits (the graph's buffer is
rewritten at the next replay); and read nothing back per token. Oracles: eager decoding's
tokens (the same model, identical), and the addresses themselves.

``torch.compile`` is replaced by dynamo with its eager backend (fast to compile, the same
graph capture); the CUDA settings are given to it by replacing ``step_compile_settings``,
and it records what it was asked for.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from test_host_reads import CountReads

import addnorm.generation.step as step_module
from addnorm.generation.step import CPU_STEP_OPTIONS, step_compile_settings
from addnorm.transformer.config import LMConfig
from addnorm.transformer.lm import TransformerLM

V, PAD = 23, 0


def language_model() -> TransformerLM:
    torch.manual_seed(0)
    cfg = LMConfig(vocab_size=V, d_model=16, n_heads=2, n_layers=2, d_ff=32, dropout=0.0,
                   position_encoding="rotary", max_len=32)
    return TransformerLM(cfg).eval()


PROMPT = torch.tensor([[5, 6, 7, 8], [PAD, PAD, 9, 10], [PAD, 11, 12, 13]])


def test_cuda_steps_compile_to_cuda_graphs_and_cpu_steps_with_the_cpu_options():
    assert step_compile_settings(torch.device("cuda", 0)) == {"mode": "reduce-overhead"}
    assert step_compile_settings(torch.device("cpu")) == {"options": CPU_STEP_OPTIONS}


class GraphsOnTheCpu:
    """``torch.compile`` as dynamo's eager backend, with the CUDA settings asked for, the
    replays marked and every call's step-state addresses recorded."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.asked: list[dict] = []
        self.marks = 0
        self.addresses: list[list[int]] = []
        self.outputs: list[torch.Tensor] = []
        compile_eager = torch.compile

        def fake_compile(fn, **kwargs):
            self.asked.append(kwargs)
            compiled = compile_eager(fn, fullgraph=kwargs["fullgraph"], backend="eager")

            def call(tokens, cache):
                self.addresses.append([getattr(h, n).data_ptr() for h, n in cache.step_state()])
                out = compiled(tokens, cache)
                self.outputs.append(out)
                return out
            return call

        def mark() -> None:
            self.marks += 1

        monkeypatch.setattr(torch, "compile", fake_compile)
        monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", mark)
        monkeypatch.setattr(step_module, "step_compile_settings",
                            lambda device: {"mode": "reduce-overhead"})


@pytest.mark.parametrize("strategy", ["greedy", "beam"])
@torch.no_grad()
def test_a_graph_step_keeps_its_state_at_one_address_across_steps_and_calls(
    strategy, monkeypatch, fresh_dynamo
):
    model = language_model()
    config = dataclasses.replace(model.generation_config, max_new_tokens=7, eos_id=None,
                                 strategy=strategy)
    expected = model.generate(PROMPT, config)
    graphs = GraphsOnTheCpu(monkeypatch)
    first = model.generate(PROMPT, dataclasses.replace(config, compile=True))
    calls = len(graphs.addresses)
    second = model.generate(PROMPT, dataclasses.replace(config, compile=True))
    assert torch.equal(first, expected) and torch.equal(second, expected)
    assert graphs.asked and all(kw == {"fullgraph": True, "mode": "reduce-overhead"}
                                for kw in graphs.asked)
    assert graphs.marks == len(graphs.addresses) == 2 * calls  # one replay per step
    # every step of both calls: the same buffers (beam search expands the batch once per
    # call, then reorders its beams in place)
    per_call = [graphs.addresses[:calls], graphs.addresses[calls:]]
    for addresses in per_call:
        assert all(a == addresses[0] for a in addresses)
    if strategy == "greedy":
        assert per_call[0][0] == per_call[1][0]  # kept from one call to the next


@torch.no_grad()
def test_the_loop_gets_a_copy_of_the_graphs_logits(monkeypatch, fresh_dynamo):
    model = language_model()
    config = dataclasses.replace(model.generation_config, max_new_tokens=4, eos_id=None,
                                 compile=True)
    graphs = GraphsOnTheCpu(monkeypatch)
    seen: list[torch.Tensor] = []
    watch_note = step_module.LogitWatch.note

    def note(self, name, step, logits, cause=None):
        seen.append(logits)
        return watch_note(self, name, step, logits, cause)

    monkeypatch.setattr(step_module.LogitWatch, "note", note)
    model.generate(PROMPT, config)
    graph_storages = {out.untyped_storage().data_ptr() for out in graphs.outputs}
    assert len(seen) == 4 and graphs.outputs  # the first logits come from the prompt
    assert not graph_storages & {s.untyped_storage().data_ptr() for s in seen[1:]}


@torch.no_grad()
def test_a_compiled_generation_reads_nothing_back_per_token(monkeypatch, fresh_dynamo):
    model = language_model()
    config = dataclasses.replace(model.generation_config, eos_id=None, compile=True)
    GraphsOnTheCpu(monkeypatch)
    model.generate(PROMPT, dataclasses.replace(config, max_new_tokens=2))  # compiled here

    def reads(n: int) -> int:
        with CountReads() as counter:
            model.generate(PROMPT, dataclasses.replace(config, max_new_tokens=n))
        return counter.total

    assert reads(9) == reads(1)  # the prompt's reads only, whatever the count of tokens
