"""Decoding algorithms: greedy, sampling (temperature, top-k, top-p) and, in
:mod:`addnorm.generation.beam_search`, beam search, as a ``GenerationConfig``
(:mod:`addnorm.generation.config`) asks.

Every algorithm drives a model through one small interface, so it works for any model that
exposes it (``addnorm.Transformer`` and ``addnorm.TransformerLM`` do):

- ``first_logits`` (B, V): the next-token logits after the prompt (the model's ``start``);
- ``step_fn(tokens (B', 1), cache) -> logits (B', V)``: feed one token per row; the cache grows
  by one position;
- ``cache.reorder(index (B',))``: replace the cache's batch dimension by
  ``tensor.index_select(0, index)``. Only beam search needs it: once to expand the B input rows
  to B * K beams (row ``b`` holds beams ``b * K .. b * K + K - 1``), then after every step to
  follow each surviving beam's parent.

Stop tokens: a row ends when it emits one of ``eos_id`` (or when ``stop_fn`` says so); the
stop token itself is part of the output and every later position holds ``fill_id`` (``pad_id``,
or the first stop id when ``pad_id`` is None, Hugging Face's convention). Decoding ends when
every row has ended, or after ``max_new_tokens`` tokens; the result has N <= ``max_new_tokens``
columns (the longest row). N tokens take N - 1 calls of ``step_fn``: the last token is never
fed back. The stop ids are never picked before ``min_new_tokens`` tokens (their logits -inf).

``num_return_sequences`` r > 1 with sampling draws r rows per input row: the cache is
reordered once to B * r rows (``cache.reorder``, as for beam search; row ``b`` becomes rows
``b * r .. b * r + r - 1``), then every row samples on its own, as Hugging Face's
``generate`` does.

Before a token is picked, the rules of :mod:`addnorm.generation.logit_rules` reshape the
logits (``repetition_penalty``, ``no_repeat_ngram_size``, ``bad_words_ids``,
``min_new_tokens``, ``forced_eos_id``, ``suppress_tokens``; Hugging Face's conventions and
order), given the real (unpadded) tokens of ``prompt_ids`` followed by the tokens generated
so far. Then come temperature, top-k, top-p and min-p (sampling,
:mod:`addnorm.generation.sampling`); beam search, as Hugging Face's, applies the rules to its
log-probs.

``max_time`` ends every row once that many seconds have passed (:mod:`addnorm.generation.
deadline`: the host's clock, read after the step's stop check, so no read is added).
``B * num_beams`` or ``B * num_return_sequences`` rows that no memory holds are refused
before the rows are expanded (:func:`~addnorm.generation.decode_checks.check_rows_fit`).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
from torch import Tensor

from addnorm.generation.beam_search import beam_search
from addnorm.generation.config import GenerationConfig
from addnorm.generation.deadline import Deadline
from addnorm.generation.decode_checks import (
    check_decoding_options,
    check_rows_fit,
    check_token_ids,
)
from addnorm.generation.logit_rules import LogitRules
from addnorm.generation.output import Recorder
from addnorm.generation.sampling import pick_token
from addnorm.generation.step import LogitWatch, StepFn, check_logits
from addnorm.generation.stop_strings import StopFn, StopStrings
from addnorm.utils.checks import check_bool_mask, check_tensor

__all__ = ["decode", "generate_tokens", "prompt_history"]


@torch.no_grad()
def generate_tokens(
    step_fn: StepFn,
    first_logits: Tensor,
    cache: Any,
    config: GenerationConfig,
    *,
    generator: torch.Generator | None = None,
    prompt_ids: Tensor | None = None,
    prompt_padding_mask: Tensor | None = None,
    stop_fn: StopFn | None = None,
) -> Tensor:
    """Generate up to ``config.max_new_tokens`` tokens per row with the configured strategy,
    driving any ``step_fn`` (the models' ``generate`` methods run the same loop on their own
    ``step``: :func:`decode`).

    Runs under ``torch.no_grad()``. ``generator`` is used by sampling only; it must live on the
    logits' device. Beam search returns, per input row, the ``num_return_sequences`` best
    finished hypotheses by length-penalised score (see ``GenerationConfig.length_penalty``
    and :func:`addnorm.generation.beam_search.beam_search`); sampling with
    ``num_return_sequences`` r > 1 needs ``cache.reorder`` too (r rows per input row).

    ``prompt_ids`` (with ``prompt_padding_mask``, True = padding) are the tokens already seen
    before the first new one, for ``repetition_penalty`` and ``no_repeat_ngram_size``: a
    decoder-only model's prompt (Hugging Face's ``input_ids``); None for an encoder-decoder,
    whose decoder starts from scratch. ``stop_fn`` (greedy and sampling) is called after
    every step with the tokens generated so far and ends the rows it returns True for, like
    a stop token (stop strings: :func:`addnorm.generation.stop_strings.stop_at_strings`,
    whose rule is given the ids that the step's one host read brings back, as lists).

    Everything is checked here, once, and every output of ``step_fn`` is checked as it
    comes (a float (B', V) tensor; its values are watched without a host sync, see
    :class:`LogitWatch`).

    Shapes:
        first_logits: (B, V), the logits for the first new token.
        step_fn: tokens (B', 1), cache -> logits (B', V); B' = B, or B * num_beams for beam.
        prompt_ids, prompt_padding_mask: (B, L0)
        stop_fn: tokens (B', n) -> (B',) bool, True = the row ends with its n-th token;
            B' = B * num_return_sequences
        returns: LongTensor (B * num_return_sequences, N) with N <= max_new_tokens,
            ``fill_id`` after a stop.
    """
    if not isinstance(config, GenerationConfig):
        raise TypeError(f"config must be a GenerationConfig, got {type(config).__name__}")
    if not callable(step_fn):
        raise TypeError(f"step_fn must be callable, got {type(step_fn).__name__}")
    deadline = Deadline(config.max_time)
    logits = check_logits("first_logits", first_logits)
    first = LogitWatch()
    first.note("first_logits", 0, logits)
    first.check()  # the caller's input: its values are checked before anything else
    vocab = logits.shape[1]
    check_token_ids(config, vocab)
    seen = _prompt_history(prompt_ids, prompt_padding_mask, logits)
    check_decoding_options(config, generator, stop_fn, logits.device)
    copies = config.num_beams if config.strategy == "beam" else config.num_return_sequences
    if copies > 1 and not callable(getattr(cache, "reorder", None)):
        what = "beam search" if config.strategy == "beam" else "num_return_sequences > 1"
        raise TypeError(f"{what} needs cache.reorder(index); {type(cache).__name__} has none")
    check_rows_fit(config, logits.shape[0], vocab, 0, logits.device)  # the cache: unknown
    rows = logits.shape[0] * copies
    checked_step = _checked_outputs(step_fn, (rows, vocab))
    return decode(checked_step, logits, cache, config, generator=generator, seen=seen,
                  stop_fn=stop_fn, deadline=deadline)


def _checked_outputs(step_fn: StepFn, shape: tuple[int, int]) -> StepFn:
    """``step_fn`` whose every output is checked to be a float tensor of ``shape``."""
    calls = 0

    def checked(tokens: Tensor, cache: Any) -> Tensor:
        nonlocal calls
        calls += 1
        return check_logits(f"step_fn output (step {calls})", step_fn(tokens, cache), shape)

    return checked


def decode(
    step_fn: StepFn,
    first_logits: Tensor,
    cache: Any,
    config: GenerationConfig,
    *,
    generator: torch.Generator | None,
    seen: tuple[Tensor, Tensor],
    stop_fn: StopFn | None,
    banned: Tensor | None = None,
    deadline: Deadline | None = None,
    record: Recorder | None = None,
) -> Tensor:
    """The decode loop of every generation, on arguments already checked (by
    :func:`generate_tokens`, or by a model's ``generate`` for its own ``step``).

    ``banned`` (n,) long: ids whose logits are set to -inf at every step (a model's pad and
    bos ids: see :func:`addnorm.generation.generate.banned_ids`). ``deadline``: the end of
    ``config.max_time``, from when the call began (None: none). ``record``: collects each
    step's scores and logits (:mod:`addnorm.generation.output`).

    Shapes:
        first_logits: (B, V); seen: the prompt's ids and padding (B, L0)
        returns: (B * num_return_sequences, N) long
    """
    if config.strategy == "beam":
        return beam_search(step_fn, first_logits, cache, config, seen, banned,
                           deadline=deadline, record=record)
    if config.num_return_sequences > 1:  # r samples per row: rows b * r .. b * r + r - 1
        index = torch.arange(first_logits.shape[0], device=first_logits.device)
        index = index.repeat_interleave(config.num_return_sequences)  # (B * r,)
        cache.reorder(index)
        first_logits = first_logits.index_select(0, index)  # (B * r, V)
        seen = (seen[0].index_select(0, index), seen[1].index_select(0, index))
    return _decode_token_by_token(step_fn, first_logits, cache, config, generator, seen,
                                  stop_fn, banned, deadline, record)


def prompt_history(
    prompt_ids: Tensor | None, padding_mask: Tensor | None, logits: Tensor
) -> tuple[Tensor, Tensor]:
    """A checked prompt and its padding (True = padding) as the history of the repetition
    rules; an empty one (L0 = 0) when there is no prompt.

    Shapes:
        prompt_ids, padding_mask: (B, L0); logits: (B, V)
        returns: ids (B, L0) long, padding (B, L0) bool
    """
    if prompt_ids is None:
        empty = torch.zeros(logits.shape[0], 0, dtype=torch.long, device=logits.device)
        return empty, empty.bool()
    if padding_mask is None:
        return prompt_ids, torch.zeros_like(prompt_ids, dtype=torch.bool)
    return prompt_ids, padding_mask


def _prompt_history(
    prompt_ids: object, padding_mask: object, logits: Tensor
) -> tuple[Tensor, Tensor]:
    """:func:`prompt_history` of a caller's prompt, checked (values: one host sync).

    Shapes:
        returns: ids (B, L0) long, padding (B, L0) bool; L0 = 0 without a prompt
    """
    batch = logits.shape[0]
    if prompt_ids is None:
        if padding_mask is not None:
            raise ValueError("prompt_padding_mask was given without prompt_ids")
        return prompt_history(None, None, logits)
    ids = check_tensor("prompt_ids", prompt_ids, ndim=2)
    if ids.dtype != torch.long or ids.shape[0] != batch:
        raise ValueError(
            f"prompt_ids must be a long tensor of {batch} rows (first_logits' B), got dtype "
            f"{ids.dtype} and shape {tuple(ids.shape)}"
        )
    if padding_mask is not None:
        padding_mask = check_bool_mask("prompt_padding_mask", padding_mask, ids.shape)
    ids, padding = prompt_history(ids, padding_mask, logits)
    real = ids[~padding]
    if real.numel() and bool((real < 0).any() | (real >= logits.shape[1]).any()):
        bad = real[(real < 0) | (real >= logits.shape[1])][0].item()
        raise ValueError(f"prompt_ids holds {bad}, outside the vocabulary [0, {logits.shape[1]})")
    return ids, padding


def _decode_token_by_token(
    step_fn: StepFn,
    logits: Tensor,
    cache: Any,
    config: GenerationConfig,
    generator: torch.Generator | None,
    seen: tuple[Tensor, Tensor],
    stop_fn: StopFn | None,
    banned: Tensor | None,
    deadline: Deadline | None,
    record: Recorder | None,
) -> Tensor:
    """Greedy or sampled decoding: one token per row per step, all rows at once.

    One host read per step at most: the stop check (:class:`_Stops`), which also reads
    :class:`LogitWatch`'s flag, under which the rows the logit rules leave no token are
    noted too; without a stop rule, none until the end. The deadline is checked on the host
    after the stop check.
    """
    batch, _ = logits.shape
    stop_ids = torch.tensor(config.stop_ids, dtype=torch.long, device=logits.device)
    stops = _Stops(stop_ids, stop_fn, batch) if config.stop_ids or stop_fn is not None else None
    rules = LogitRules(config, logits.device) if config.has_logit_rules else None
    ended = torch.zeros(batch, dtype=torch.bool, device=logits.device)
    watch = LogitWatch()
    want_scores = record is not None and record.scores is not None
    tokens: list[Tensor] = []
    for step in range(config.max_new_tokens):
        if step > 0:
            logits = step_fn(tokens[-1][:, None], cache)  # (B, 1) -> (B, V)
        if record is not None:
            record.add_logits(logits)
        if banned is not None:
            logits = logits.index_fill(-1, banned, float("-inf"))  # (B, V)
        bad = watch.note(_logits_name(step), step, logits)  # (B,), no host sync
        if rules is not None:
            history = _history(seen, tokens) if rules.needs_history else None
            reshaped = rules(logits, step, history)
            logits = torch.where(ended[:, None], logits, reshaped)  # ended rows: filler follows
            bad = watch.note(_logits_name(step), step, logits, partial(_no_token_left, config,
                                                                       step))
        next_token, scores = pick_token(logits, config, generator, bad, want_scores)  # (B,)
        if record is not None and scores is not None:
            record.add_scores(scores)
        if config.fill_id is not None:
            next_token = next_token.masked_fill(ended, config.fill_id)
        tokens.append(next_token)
        if stops is not None:
            ended, live = stops.check(ended, tokens, watch)  # the one host read of the step
            if not live:
                break
        if deadline is not None and deadline.passed():  # max_time: every row ends here
            break
    watch.check()
    return torch.stack(tokens, dim=1)  # (B, N)


class _Stops:
    """Which rows have ended (at a stop id, or by ``stop_fn``), and whether any is live: the
    one value a step reads back, together with :class:`LogitWatch`'s flag.

    A :class:`~addnorm.generation.stop_strings.StopStrings` rule needs the new tokens on the
    host: they come back in the same read, and the rule runs on Python ids. Any other
    ``stop_fn`` is called on the device's tokens so far (what it reads is its own).
    """

    def __init__(self, stop_ids: Tensor, stop_fn: StopFn | None, batch: int) -> None:
        self.stop_ids = stop_ids
        self.stop_fn = stop_fn
        self.batch = batch
        self.rows: list[list[int]] = [[] for _ in range(batch)]  # host copies, StopStrings's

    def check(self, ended: Tensor, tokens: list[Tensor], watch: LogitWatch) -> tuple[Tensor, bool]:
        """The rows ended after this step's tokens (B,), and whether any row is live; reports
        the bad rows :class:`LogitWatch` noted."""
        ended = ended | torch.isin(tokens[-1], self.stop_ids)
        if isinstance(self.stop_fn, StopStrings):
            return self._check_on_host(self.stop_fn, ended, tokens[-1], watch)
        if self.stop_fn is not None:
            ended = ended | _check_stops(self.stop_fn(torch.stack(tokens, dim=1)), self.batch)
        flags = torch.stack([~ended, watch.bad_rows(ended)]).any(dim=1)  # (2,): live, bad
        live, faulty = flags.tolist()  # the one host read of the step
        watch.check(faulty)
        return ended, live

    def _check_on_host(
        self, rule: StopStrings, ended: Tensor, new: Tensor, watch: LogitWatch
    ) -> tuple[Tensor, bool]:
        """:meth:`check` for stop strings: the new tokens read with the flags, the text
        searched on the host."""
        bad = watch.bad_rows(ended).any()[None]  # (1,)
        values = torch.cat([new, ended.long(), bad.long()]).tolist()  # the one host read
        watch.check(bool(values[-1]))
        for row, token in zip(self.rows, values[: self.batch], strict=True):
            row.append(token)
        ended_before = values[self.batch : 2 * self.batch]
        by_text = rule.ends(self.rows)
        newly = [text and not end for text, end in zip(by_text, ended_before, strict=True)]
        if any(newly):  # at most once per row: the only copy to the device
            ended = ended | torch.tensor(newly, dtype=torch.bool, device=ended.device)
        live = not all(end or text for end, text in zip(ended_before, by_text, strict=True))
        return ended, live


def _logits_name(step: int) -> str:
    """How the errors name a step's logits (``first_logits``: from the prompt)."""
    return "first_logits" if step == 0 else f"step_fn output (step {step})"


def _history(seen: tuple[Tensor, Tensor], tokens: list[Tensor]) -> tuple[Tensor, Tensor]:
    """The prompt followed by the tokens generated so far, with their padding (B, L0 + n)."""
    ids, padding = seen
    if not tokens:
        return ids, padding
    new = torch.stack(tokens, dim=1)  # (B, n)
    return torch.cat([ids, new], dim=1), torch.cat([padding, torch.zeros_like(new).bool()], 1)


def _check_stops(stops: object, batch: int) -> Tensor:
    if not isinstance(stops, Tensor) or stops.dtype != torch.bool or stops.shape != (batch,):
        what = f"{stops.dtype} {tuple(stops.shape)}" if isinstance(stops, Tensor) else stops
        raise TypeError(f"stop_fn must return a bool tensor of shape ({batch},), got {what}")
    return stops


def _no_token_left(config: GenerationConfig, step: int, row: int) -> str:
    """Why a live row has no finite logit after the logit rules (it has nothing left to
    emit): the rules in effect took every token."""
    rules = [f"{name}={getattr(config, name)!r}" for name, off in (
        ("no_repeat_ngram_size", 0), ("min_new_tokens", 0), ("bad_words_ids", ()),
        ("suppress_tokens", ()), ("forced_eos_id", None)) if getattr(config, name) != off]
    return (
        f"the logit rules ({', '.join(rules)}) leave row {row} no token to emit at step "
        f"{step} (every token the model allows is banned); ban fewer tokens, use a larger "
        "no_repeat_ngram_size or fewer new tokens"
    )
