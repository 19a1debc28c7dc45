"""Values are read back once, where they enter; parts and decode steps read none.

On an accelerator every value read back from a tensor (``.item()``, ``.tolist()``,
``bool(t)``) waits for the device: a host synchronisation. The rule of docs/design.md
("Validation"): a model's top-level call reads its inputs back once, its parts read nothing,
and a decoded token reads one value at most (the stop check, which carries the logit watch,
the rows the logit rules leave no token and the ids stop strings search), none without
a stop rule; beam search reads one per step (is every row done?).

Provenance: the reads are counted by a ``TorchFunctionMode`` that sees every call of those
methods (an exact count, by definition), on the CPU, where the code takes the same path
(the reads taken on the CPU only are counted apart); the decoded tokens by counting the
calls of the model's ``step``.
"""

from __future__ import annotations

import collections
import dataclasses
import sys

import torch
from hypothesis import given
from hypothesis import strategies as st
from properties import examples
from torch.overrides import TorchFunctionMode

from addnorm.generation.stop_strings import stop_at_strings
from addnorm.transformer.config import PRESETS
from addnorm.transformer.encoder_decoder import Transformer
from addnorm.transformer.lm import TransformerLM

READS = {"item", "tolist", "__bool__", "__int__", "__float__", "__index__", "nonzero"}
# Reads taken on the CPU only, where a read is no synchronisation: attention_mask's
# ``_known_no_dead_row`` asks whether any query row sees no key (to skip that work); on an
# accelerator it takes the general path without reading.
CPU_ONLY = {"_known_no_dead_row"}


class CountReads(TorchFunctionMode):
    """Counts the calls that read a tensor's values back to the host (an accelerator's)."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: collections.Counter[str] = collections.Counter()
        self.cpu_only = 0  # reads the CPU alone takes (CPU_ONLY)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in READS:
            if sys._getframe(1).f_code.co_name in CPU_ONLY:
                self.cpu_only += 1
            else:
                self.reads[name] += 1
        return func(*args, **(kwargs or {}))

    @property
    def total(self) -> int:
        return sum(self.reads.values())


POSITIONS = st.sampled_from(["sinusoidal", "rotary", "learned"])
STRATEGIES = ["greedy", "sample", "beam"]


def _lm(position_encoding: str) -> TransformerLM:
    cfg = dataclasses.replace(PRESETS["lm-tiny"], position_encoding=position_encoding,
                              dropout=0.0)
    return TransformerLM(cfg).eval()


def _prompts(batch: int, length: int, pads: list[int]) -> torch.Tensor:
    ids = torch.randint(3, 100, (batch, length))
    for row, n in enumerate(pads):
        ids[row, :n] = 0  # left padding (pad_id 0)
    return ids


def _reads(fn) -> int:
    with torch.no_grad(), CountReads() as counter:
        fn()
    return counter.total


@examples(12)
@given(position_encoding=POSITIONS, batch=st.integers(1, 4), length=st.integers(1, 6),
       data=st.data())
def test_a_model_call_reads_its_inputs_back_once(position_encoding, batch, length, data):
    pads = data.draw(st.lists(st.integers(0, length - 1), min_size=batch, max_size=batch))
    ids = _prompts(batch, length, pads)
    lm = _lm(position_encoding)
    assert _reads(lambda: lm(ids)) == 1  # the ids and their padding, in one read
    seq2seq = Transformer(dataclasses.replace(PRESETS["tiny"], position_encoding=position_encoding))
    seq2seq.eval()
    # the source's read and the target's: each input read once
    assert _reads(lambda: seq2seq(ids.clamp(max=40), ids.clamp(max=40))) == 2


@examples(10)
@given(position_encoding=POSITIONS, batch=st.integers(1, 3), length=st.integers(1, 5),
       stop=st.booleans(), data=st.data())
def test_a_decoded_token_reads_back_one_value_at_most(position_encoding, batch, length, stop,
                                                      data):
    pads = data.draw(st.lists(st.integers(0, length - 1), min_size=batch, max_size=batch))
    ids = _prompts(batch, length, pads)
    lm = _lm(position_encoding)
    eos = 1 if stop else None
    config = dataclasses.replace(lm.generation_config, eos_id=eos, max_new_tokens=1)
    one = _reads(lambda: lm.generate(ids, config))  # start, the first token, the final check
    n = 9
    with torch.no_grad(), CountReads() as counter:
        out = lm.generate(ids, dataclasses.replace(config, max_new_tokens=n))
    steps = out.shape[1] - 1  # decode steps after the first token
    per_step = 1 if stop else 0  # the stop check, read with the logits' health flag
    assert counter.total == one + per_step * steps


def test_a_decode_step_alone_reads_nothing():
    lm = _lm("rotary")
    cache, logits = lm.start(_prompts(2, 4, [2, 0]), max_new_tokens=3)
    tokens = logits.argmax(dim=-1, keepdim=True)  # (B, 1)
    assert _reads(lambda: lm.step(tokens, cache)) == 0


def _seq2seq(position_encoding: str) -> Transformer:
    cfg = dataclasses.replace(PRESETS["tiny"], position_encoding=position_encoding, dropout=0.0)
    return Transformer(cfg).eval()


def _count(model, generate) -> tuple[CountReads, int]:
    """The reads of ``generate()`` and the calls of ``model.step`` it makes."""
    calls = 0
    step = model.step

    def counted_step(tokens, cache):
        nonlocal calls
        calls += 1
        return step(tokens, cache)

    model.step = counted_step
    try:
        with torch.no_grad(), CountReads() as counter:
            generate()
    finally:
        del model.step
    return counter, calls


def _letters(ids: list[int]) -> str:
    return "".join(chr(ord("a") + i % 4) for i in ids)  # 4 letters: stop strings do occur


# The logit rules that ban tokens and the limits, drawn together (none reads a value back).
BANS = st.fixed_dictionaries({
    "bad_words_ids": st.sampled_from([(), ((5,),), ((5, 7), (9,)), ((4, 6, 8),)]),
    "suppress_tokens": st.sampled_from([(), (6, 8)]),
    "forced_eos_id": st.sampled_from([None, 10]),
    "max_time": st.sampled_from([None, 3600.0]),
})


@examples(40)
@given(family=st.sampled_from(["lm", "seq2seq"]), strategy=st.sampled_from(STRATEGIES),
       position_encoding=POSITIONS, repetition_penalty=st.sampled_from([1.0, 1.3]),
       no_repeat_ngram_size=st.sampled_from([0, 2]), eos=st.booleans(),
       min_new_tokens=st.sampled_from([0, 3]), batch=st.integers(1, 3),
       length=st.integers(1, 5), bans=BANS, data=st.data())
def test_a_decoded_token_reads_one_value_at_most_with_any_settings(
    family, strategy, position_encoding, repetition_penalty, no_repeat_ngram_size, eos,
    min_new_tokens, batch, length, bans, data,
):
    pads = data.draw(st.lists(st.integers(0, length - 1), min_size=batch, max_size=batch))
    ids = _prompts(batch, length, pads)  # left padding
    lm = family == "lm"
    model = _lm(position_encoding) if lm else _seq2seq(position_encoding)
    stop_strings = lm and strategy != "beam" and data.draw(st.booleans(), label="stop_strings")
    rows = 2 if strategy != "greedy" else 1
    config = dataclasses.replace(
        model.generation_config, strategy=strategy, num_beams=2, num_return_sequences=rows,
        repetition_penalty=repetition_penalty, no_repeat_ngram_size=no_repeat_ngram_size,
        eos_id=model.generation_config.eos_id if eos else None, min_new_tokens=min_new_tokens,
        min_p=data.draw(st.sampled_from([None, 0.1])) if strategy == "sample" else None, **bans,
    )
    stop_fn = stop_at_strings(_letters, ["dd", "cab"]) if stop_strings else None
    extra = {"stop_fn": stop_fn} if lm else {}

    def run(n: int):
        generator = torch.Generator().manual_seed(0)
        return _count(model, lambda: model.generate(
            ids, dataclasses.replace(config, max_new_tokens=n), generator=generator, **extra))

    one, one_steps = run(1)  # the inputs, the settings, the first token, the final checks
    many, many_steps = run(9)
    per_step = 1 if strategy == "beam" or eos or stop_strings else 0  # the stop check
    assert many.total - one.total == per_step * (many_steps - one_steps)


@examples(10)
@given(position_encoding=POSITIONS, strategy=st.sampled_from(["greedy", "beam"]),
       batch=st.integers(1, 3), length=st.integers(2, 6), data=st.data())
def test_the_cross_attention_mask_is_built_once_per_generate(position_encoding, strategy, batch,
                                                             length, data):
    # A source with padding: building its cross-attention mask reads (on the CPU) whether a
    # row sees no key, so a mask built per decoded token would read once per token.
    pads = data.draw(st.lists(st.integers(1, length - 1), min_size=batch, max_size=batch))
    src = _prompts(batch, length, pads)
    model = _seq2seq(position_encoding)
    config = dataclasses.replace(model.generation_config, strategy=strategy, num_beams=2,
                                 eos_id=None)

    def run(n: int):
        return _count(model, lambda: model.generate(src, dataclasses.replace(
            config, max_new_tokens=n)))

    (one, _), (many, steps) = run(1), run(9)
    assert steps > 1 and many.cpu_only == one.cpu_only


@examples(12)
@given(position_encoding=POSITIONS, strategy=st.sampled_from(STRATEGIES), eos=st.booleans(),
       stride=st.integers(1, 4), batch=st.integers(1, 3), length=st.integers(1, 7),
       data=st.data())
def test_a_sliding_window_reads_nothing_more(position_encoding, strategy, eos, stride, batch,
                                             length, data):
    # A window of 4: a prompt of up to 7 and 13 tokens slide several times (the model's
    # slide recomputes the window); the tokens fed by a slide read no more than steps do.
    pads = data.draw(st.lists(st.integers(0, length - 1), min_size=batch, max_size=batch))
    ids = _prompts(batch, length, pads)
    lm = _lm(position_encoding)
    config = dataclasses.replace(
        lm.generation_config, strategy=strategy, num_beams=2, window=4, window_stride=stride,
        eos_id=lm.generation_config.eos_id if eos else None,
        num_return_sequences=2 if strategy == "sample" else 1,
    )
    calls = 0
    slide = lm.slide

    def counted_slide(tokens, cache, keep):
        nonlocal calls
        calls += 1
        return slide(tokens, cache, keep)

    lm.slide = counted_slide

    def run(n: int):
        generator = torch.Generator().manual_seed(0)
        counter, steps = _count(lm, lambda: lm.generate(
            ids, dataclasses.replace(config, max_new_tokens=n), generator=generator))
        return counter, steps + calls

    one, one_fed = run(1)
    calls = 0
    many, many_fed = run(13)
    per_step = 1 if strategy == "beam" or eos else 0  # the stop check
    assert many.total - one.total == per_step * (many_fed - one_fed)
    assert calls > 0 or many_fed < 13 - 1  # it slid, unless the rows stopped early
