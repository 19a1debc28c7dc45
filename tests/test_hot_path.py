"""The hot path stays short: frames from a model's call to SDPA, addnorm's calls per token.

Counted with ``sys.setprofile``, which sees every Python call and every call of a builtin
(an exact count, by definition), as tests/test_host_reads.py counts reads:

- A *frame* is a Python frame whose code lives in ``src/addnorm``, on the stack when
  ``F.scaled_dot_product_attention`` is called, from the model's method down to the frame
  that calls SDPA. torch's own frames (``nn.Module.__call__``) are not counted, nor is
  ``functools.partial``, which makes none: the count is the model code a reader follows, as
  nanoGPT's ``GPT.forward -> Block.forward -> CausalSelfAttention.forward`` is 3 in 1 file.
- A *call* is a Python function call whose code lives in ``src/addnorm``; a *check* is one
  of those in ``utils/checks.py`` or named ``check_*`` / ``_check_*``. Per decoded token:
  the calls of ``generate`` for 12 tokens less those for 4, over the 8 tokens between, after
  a warm-up call (the decode loop's work per token, the model's step among it).

The limits are issue 38's targets for ``lm-small`` greedy decoding (before: 8 frames in 6
files from ``TransformerLM(ids)`` to SDPA, 218 calls per token, 67 of them checks): no more
than 6 frames, 170 calls and 50 checks. The guards that cannot act with no padding, no
packing and float32 are not called then; each is called where it can act (the control that
shows the counter sees them).
"""

from __future__ import annotations

import collections
import dataclasses
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
import torch
import torch.nn.functional as F

import addnorm
from addnorm.transformer.config import PRESETS
from addnorm.transformer.encoder_decoder import Transformer
from addnorm.transformer.lm import TransformerLM

SRC = os.path.dirname(addnorm.__file__) + os.sep
SDPA = F.scaled_dot_product_attention
# Guards that act only with padding queries and gradients, packed queries, or bfloat16.
GUARDS = {"finite_padding_queries", "held_padding_rows", "variable_length",
          "explicit_product_pays"}
MAX_FRAMES, MAX_CALLS, MAX_CHECKS = 6, 170, 50


def _where(code) -> str:
    return code.co_filename[len(SRC):].replace(os.sep, "/")


def _is_check(code) -> bool:
    return _where(code) == "utils/checks.py" or code.co_name.startswith(("check_", "_check_"))


@contextmanager
def _profiled(hook: Callable) -> Iterator[None]:
    previous = sys.getprofile()
    sys.setprofile(hook)
    try:
        yield
    finally:
        sys.setprofile(previous)


def stacks_to_sdpa(fn: Callable[[], object]) -> list[list[tuple[str, str]]]:
    """For each SDPA call ``fn`` makes, addnorm's frames on the stack: (file, function),
    innermost first."""
    stacks = []

    def hook(frame, event, arg):
        if event == "c_call" and arg is SDPA:
            ours, f = [], frame
            while f is not None:
                if f.f_code.co_filename.startswith(SRC):
                    ours.append((_where(f.f_code), f.f_code.co_name))
                f = f.f_back
            stacks.append(ours)

    with _profiled(hook):
        fn()
    return stacks


def frames_below(stack: list[tuple[str, str]], top: tuple[str, str]) -> list[tuple[str, str]]:
    """The frames from ``top`` (the model's method) down to SDPA's caller."""
    return stack[: stack.index(top) + 1]


def calls(fn: Callable[[], object]) -> collections.Counter[tuple[str, str]]:
    """addnorm's Python calls during ``fn()``, by (file, function)."""
    counter: collections.Counter[tuple[str, str]] = collections.Counter()

    def hook(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.startswith(SRC):
            counter[(_where(frame.f_code), frame.f_code.co_name)] += 1

    with _profiled(hook):
        fn()
    return counter


def per_token(model, ids: torch.Tensor, short: int = 4, long: int = 12) -> dict[tuple[str, str],
                                                                                 float]:
    """addnorm's calls per decoded token of greedy ``generate`` (no stop token: every row
    decodes ``long`` tokens)."""
    config = dataclasses.replace(model.generation_config, eos_id=None)

    def run(n: int) -> collections.Counter[tuple[str, str]]:
        return calls(lambda: model.generate(ids, dataclasses.replace(config, max_new_tokens=n)))

    run(short)  # warm-up: first calls (imports, caches) are not per-token work
    few, many = run(short), run(long)
    return {key: (many[key] - few[key]) / (long - short) for key in many}


def _lm(name: str = "lm-small", **changes) -> TransformerLM:
    torch.manual_seed(0)
    return TransformerLM(dataclasses.replace(PRESETS[name], dropout=0.0, **changes)).eval()


def _ids(batch: int = 2, length: int = 8) -> torch.Tensor:
    return torch.randint(3, 200, (batch, length), generator=torch.Generator().manual_seed(0))


def _checks(counts: dict[tuple[str, str], float]) -> float:
    return sum(n for (where, name), n in counts.items()
               if where == "utils/checks.py" or name.startswith(("check_", "_check_")))


def test_a_forward_reaches_sdpa_through_at_most_six_frames():
    lm = _lm()
    with torch.no_grad():
        stacks = stacks_to_sdpa(lambda: lm(_ids()))
    assert len(stacks) == lm.cfg.n_layers  # one SDPA call per layer
    frames = frames_below(stacks[0], ("transformer/lm.py", "forward"))
    assert len(frames) <= MAX_FRAMES, frames
    assert len({where for where, _ in frames}) <= MAX_FRAMES - 1, frames


def test_a_training_forward_with_padding_takes_the_same_frames():
    lm = _lm().train()
    ids = _ids()
    ids[0, :3] = lm.cfg.pad_id  # left padding: the padding guards act, no frame is added
    stacks = stacks_to_sdpa(lambda: lm(ids).sum().backward())
    frames = frames_below(stacks[0], ("transformer/lm.py", "forward"))
    assert len(frames) <= MAX_FRAMES, frames


def test_a_decode_step_reaches_sdpa_through_the_model_frames_and_the_step():
    lm = _lm()
    cache, logits = lm.start(_ids(), max_new_tokens=3)
    tokens = logits.argmax(dim=-1, keepdim=True)
    stacks = stacks_to_sdpa(lambda: lm.step(tokens, cache))
    frames = frames_below(stacks[0], ("transformer/lm.py", "step"))
    # step and its _run (which start shares), then the forward's frames below lm.forward
    assert len(frames) <= MAX_FRAMES + 1, frames


def test_a_decoded_token_makes_at_most_170_calls_and_50_checks():
    counts = per_token(_lm(), _ids())
    total = sum(counts.values())
    assert total <= MAX_CALLS, sorted(counts.items(), key=lambda kv: -kv[1])
    assert _checks(counts) <= MAX_CHECKS, sorted(counts.items(), key=lambda kv: -kv[1])
    called = {name for (_, name), n in counts.items() if n > 0}
    assert not called & GUARDS  # no padding, no packing, float32: nothing to guard


@pytest.mark.parametrize("family", ["lm", "seq2seq"])
def test_the_guards_are_called_where_they_can_act(family):
    # The control: the counter sees the guards when they have work (padding queries with
    # gradients; bfloat16 on the CPU), so their absence above is not the counter's blindness.
    torch.manual_seed(0)
    if family == "lm":
        model: torch.nn.Module = _lm()
    else:
        model = Transformer(dataclasses.replace(PRESETS["tiny"], dropout=0.0))
    ids = _ids().clamp(max=29)  # inside both vocabularies
    ids[0, :3] = 0  # left padding (pad_id 0 in both presets)
    inputs = (ids,) if family == "lm" else (ids, ids)
    called = {name for _, name in calls(lambda: model(*inputs).sum().backward())}
    assert {"finite_padding_queries", "held_padding_rows"} <= called
    model.to(torch.bfloat16)
    with torch.no_grad():
        called = {name for _, name in calls(lambda: model(*inputs))}
    assert "explicit_product_pays" in called
