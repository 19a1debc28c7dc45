"""Decoding algorithms: greedy, sampling (temperature, top-k, top-p) and, in
:mod:`addnorm.transformer.beam_search`, beam search.

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
fed back.

Before a token is picked, the rules against repetition of :mod:`addnorm.transformer.repetition`
(``repetition_penalty``, ``no_repeat_ngram_size``; Hugging Face's conventions) reshape the
logits, given the real (unpadded) tokens of ``prompt_ids`` followed by the tokens generated so
far. Then come temperature, top-k and top-p (sampling); beam search, as Hugging Face's,
applies the rules to its log-probs.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from addnorm._checks import (
    assert_in_graph,
    check_bool,
    check_bool_mask,
    check_choice,
    check_float,
    check_int,
    check_tensor,
)
from addnorm.transformer.repetition import apply_repetition_rules
from addnorm.transformer.stop_strings import StopFn

__all__ = ["STRATEGIES", "GenerationConfig", "LogitWatch", "StopFn", "generate_tokens"]

STRATEGIES = ("greedy", "sample", "beam")

StepFn = Callable[[Tensor, Any], Tensor]


@dataclass(frozen=True)
class GenerationConfig:
    """How to pick the next tokens; validated on construction.

    Attributes:
        max_new_tokens: the most tokens generated per row (>= 1).
        strategy: ``"greedy"`` (argmax; ties go to the lowest token id), ``"sample"`` (draw
            from the softmax, shaped by ``temperature``, ``top_k``, ``top_p``) or ``"beam"``.
        temperature: sampling only; logits are divided by it: any float > 0, subnormal ones
            included. The division is done on the logits minus their row maximum (softmax
            does not change), so nothing overflows into NaN: a tiny temperature sends every
            non-maximal logit to -inf, which is the limit T -> 0 (uniform over the argmax set;
            :func:`_divide_by_temperature`). 0 itself is refused: use ``strategy="greedy"``.
        top_k: sampling only; keep the ``top_k`` largest logits (applied after temperature).
        top_p: sampling only; nucleus: keep the smallest set of most likely tokens whose
            probability (after temperature and top-k) sums to >= ``top_p``, never fewer than
            one token (Hugging Face's ``min_tokens_to_keep=1``, so a tiny ``top_p`` is greedy).
            In (0, 1].
        num_beams: beam search only; the beam width K (>= 1).
        length_penalty: beam search only; a hypothesis of n generated tokens (its stop token
            included) scores ``sum of token log-probs / n ** length_penalty``. 0 ranks by the
            plain log-probability; larger values favour longer outputs.
        repetition_penalty: > 0; every token already seen (prompt or generated) has its logit
            divided by it when positive and multiplied by it when negative (CTRL's rule, as
            Hugging Face applies it); 1.0 changes nothing, > 1 discourages repeats.
        no_repeat_ngram_size: n >= 0; a token that would complete an n-gram already seen is
            never picked (0 turns the rule off). If it leaves a row no token, greedy and
            sampling raise ValueError naming the row.
        eos_id: a stop token id, a tuple of them, or None (rows end only at max_new_tokens).
        pad_id: the id written after a row's stop token; None (a vocabulary without padding,
            GPT-2's) writes the first stop id instead (see :attr:`fill_id`).
        compile: run the model's cached ``step`` compiled (``torch.compile(fullgraph=True)``)
            over a cache in the static layout (see :mod:`addnorm.cache`): the first call
            pays the compile (20-30 s on a 2-core CPU; a few seconds once inductor's disk
            cache holds the kernels), later steps and calls with the same shapes reuse it.
            At batch 1 on the CPU a step is then about 3-5x faster (see
            :func:`addnorm.transformer.decoding.compiled_step`). The tokens are those of
            eager decoding (up to floating-point rounding).
    """

    max_new_tokens: int = 64
    strategy: str = "greedy"
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    num_beams: int = 4
    length_penalty: float = 1.0
    repetition_penalty: float = 1.0
    no_repeat_ngram_size: int = 0
    eos_id: int | tuple[int, ...] | None = None
    pad_id: int | None = 0
    compile: bool = False

    def __post_init__(self) -> None:
        check_int("max_new_tokens", self.max_new_tokens, min_value=1)
        check_choice("strategy", self.strategy, STRATEGIES)
        if isinstance(self.temperature, int | float) and self.temperature == 0:
            raise ValueError(
                "temperature must be > 0, got 0; for deterministic argmax decoding use "
                'strategy="greedy"'
            )
        check_float("temperature", self.temperature, min_value=0.0, min_inclusive=False)
        if self.top_k is not None:
            check_int("top_k", self.top_k, min_value=1)
        if self.top_p is not None:
            check_float("top_p", self.top_p, min_value=0.0, min_inclusive=False, max_value=1.0)
        check_int("num_beams", self.num_beams, min_value=1)
        check_float("length_penalty", self.length_penalty)
        check_float("repetition_penalty", self.repetition_penalty, min_value=0.0,
                    min_inclusive=False)
        check_int("no_repeat_ngram_size", self.no_repeat_ngram_size, min_value=0)
        if self.pad_id is not None:
            check_int("pad_id", self.pad_id, min_value=0)
        check_bool("compile", self.compile)
        if isinstance(self.eos_id, list):
            object.__setattr__(self, "eos_id", tuple(self.eos_id))
        _check_eos_id(self.eos_id)
        defaults = {"temperature": 1.0, "top_k": None, "top_p": None}
        used = [f"{n}={getattr(self, n)!r}" for n, d in defaults.items() if getattr(self, n) != d]
        if self.strategy != "sample" and used:
            raise ValueError(
                f"{', '.join(used)} only apply to strategy='sample', "
                f"got strategy={self.strategy!r}"
            )

    @property
    def stop_ids(self) -> tuple[int, ...]:
        """The stop token ids as a tuple (empty when ``eos_id`` is None)."""
        if self.eos_id is None:
            return ()
        return self.eos_id if isinstance(self.eos_id, tuple) else (self.eos_id,)

    @property
    def fill_id(self) -> int | None:
        """The id written after a row ends: ``pad_id``, else the first stop id (Hugging
        Face's rule when ``pad_token_id`` is None), else None (rows then never end early)."""
        if self.pad_id is not None:
            return self.pad_id
        return self.stop_ids[0] if self.stop_ids else None

    @property
    def reshapes_logits(self) -> bool:
        """Whether ``repetition_penalty`` or ``no_repeat_ngram_size`` is in effect."""
        return self.repetition_penalty != 1.0 or self.no_repeat_ngram_size > 0

    @classmethod
    def from_transformers(
        cls,
        *,
        do_sample: bool = False,
        num_beams: int = 1,
        max_new_tokens: int = 64,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        length_penalty: float = 1.0,
        repetition_penalty: float = 1.0,
        no_repeat_ngram_size: int = 0,
        eos_token_id: int | list[int] | tuple[int, ...] | None = None,
        pad_token_id: int | None = None,
        compile: bool = False,
    ) -> GenerationConfig:
        """A config from the argument names of Hugging Face's ``generate``.

        The mapping: ``do_sample=False, num_beams=1`` is ``strategy="greedy"``;
        ``do_sample=True, num_beams=1`` is ``"sample"``; ``do_sample=False, num_beams=K > 1``
        is ``"beam"`` with ``num_beams=K``. ``eos_token_id`` is ``eos_id``, ``pad_token_id``
        is ``pad_id``; every other name is the field of the same name, with the same meaning.
        Two differences: ``top_k`` defaults to None (Hugging Face's ``GenerationConfig``
        defaults to 50; pass ``top_k=50`` for its sampling), and settings that do not apply
        to the strategy (``temperature`` without sampling) raise instead of being ignored
        with a warning. A model's ``generate`` needs its own pad id::

            GenerationConfig.from_transformers(do_sample=True, top_p=0.9,
                eos_token_id=model.cfg.eos_id, pad_token_id=model.cfg.pad_id)
        """
        check_bool("do_sample", do_sample)
        check_int("num_beams", num_beams, min_value=1)
        if do_sample and num_beams > 1:
            raise ValueError(
                f"do_sample=True with num_beams={num_beams} (beam sampling) is not supported; "
                "use do_sample=True with num_beams=1, or do_sample=False for beam search"
            )
        strategy = "beam" if num_beams > 1 else "sample" if do_sample else "greedy"
        beams = {"num_beams": num_beams} if strategy == "beam" else {}
        if isinstance(eos_token_id, list):
            eos_token_id = tuple(eos_token_id)
        return cls(
            max_new_tokens=max_new_tokens, strategy=strategy, temperature=temperature,
            top_k=top_k, top_p=top_p, length_penalty=length_penalty,
            repetition_penalty=repetition_penalty, no_repeat_ngram_size=no_repeat_ngram_size,
            eos_id=eos_token_id, pad_id=pad_token_id, compile=compile, **beams,
        )


def _check_eos_id(eos_id: object) -> None:
    """An int >= 0, a non-empty tuple of them, or None."""
    if isinstance(eos_id, tuple):
        if not eos_id:
            raise ValueError("eos_id must be an int, a non-empty tuple of ints or None, got ()")
        for i, stop in enumerate(eos_id):
            check_int(f"eos_id[{i}]", stop, min_value=0)
    elif eos_id is not None:
        check_int("eos_id", eos_id, min_value=0)


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
    """Generate up to ``config.max_new_tokens`` tokens per row with the configured strategy.

    Runs under ``torch.no_grad()``. ``generator`` is used by sampling only; it must live on the
    logits' device. Beam search returns, per input row, the best finished hypothesis by
    length-penalised score (see ``GenerationConfig.length_penalty`` and
    :func:`addnorm.transformer.beam_search.beam_search`).

    ``prompt_ids`` (with ``prompt_padding_mask``, True = padding) are the tokens already seen
    before the first new one, for ``repetition_penalty`` and ``no_repeat_ngram_size``: a
    decoder-only model's prompt (Hugging Face's ``input_ids``); None for an encoder-decoder,
    whose decoder starts from scratch. ``stop_fn`` (greedy and sampling) is called after
    every step with the tokens generated so far and ends the rows it returns True for, like
    a stop token (stop strings: :func:`addnorm.transformer.stop_strings.stop_at_strings`).

    Shapes:
        first_logits: (B, V), the logits for the first new token.
        step_fn: tokens (B', 1), cache -> logits (B', V); B' = B, or B * num_beams for beam.
        prompt_ids, prompt_padding_mask: (B, L0)
        stop_fn: tokens (B, n) -> (B,) bool, True = the row ends with its n-th token
        returns: LongTensor (B, N) with N <= max_new_tokens, ``fill_id`` after a stop.
    """
    if not isinstance(config, GenerationConfig):
        raise TypeError(f"config must be a GenerationConfig, got {type(config).__name__}")
    if not callable(step_fn):
        raise TypeError(f"step_fn must be callable, got {type(step_fn).__name__}")
    logits = _check_logits("first_logits", first_logits)
    first = LogitWatch()
    first.note("first_logits", 0, logits)
    first.check()  # the caller's input: its values are checked before anything else
    vocab = logits.shape[1]
    specials = [("pad_id", config.pad_id)] + [("eos_id", s) for s in config.stop_ids]
    for name, token in specials:
        if token is not None and token >= vocab:
            raise ValueError(f"{name} ({token}) must be < the vocabulary size V ({vocab})")
    seen = _prompt_history(prompt_ids, prompt_padding_mask, logits)
    if stop_fn is not None:
        if not callable(stop_fn):
            raise TypeError(f"stop_fn must be callable, got {type(stop_fn).__name__}")
        if config.strategy == "beam":
            raise ValueError("stop_fn is not supported by beam search; use greedy or sample")
        if config.fill_id is None:
            raise ValueError(
                "stop_fn needs an id for the positions after a row ends: set pad_id or eos_id"
            )
    if generator is not None:
        if not isinstance(generator, torch.Generator):
            raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")
        if generator.device.type != logits.device.type:
            raise ValueError(
                f"generator is on {generator.device} but the logits are on {logits.device}"
            )
    if config.strategy == "beam":
        if not callable(getattr(cache, "reorder", None)):
            raise TypeError(
                f"beam search needs cache.reorder(index); {type(cache).__name__} has none"
            )
        from addnorm.transformer.beam_search import beam_search  # it builds on this module

        return beam_search(step_fn, logits, cache, config, seen)
    return _decode_token_by_token(step_fn, logits, cache, config, generator, seen, stop_fn)


def _prompt_history(
    prompt_ids: object, padding_mask: object, logits: Tensor
) -> tuple[Tensor, Tensor]:
    """The tokens seen before the first new one and their padding (True = padding), checked.

    Shapes:
        returns: ids (B, L0) long, padding (B, L0) bool; L0 = 0 without a prompt
    """
    batch = logits.shape[0]
    if prompt_ids is None:
        if padding_mask is not None:
            raise ValueError("prompt_padding_mask was given without prompt_ids")
        empty = torch.zeros(batch, 0, dtype=torch.long, device=logits.device)
        return empty, empty.bool()
    ids = check_tensor("prompt_ids", prompt_ids, ndim=2)
    if ids.dtype != torch.long or ids.shape[0] != batch:
        raise ValueError(
            f"prompt_ids must be a long tensor of {batch} rows (first_logits' B), got dtype "
            f"{ids.dtype} and shape {tuple(ids.shape)}"
        )
    if padding_mask is None:
        padding = torch.zeros_like(ids, dtype=torch.bool)
    else:
        padding = check_bool_mask("prompt_padding_mask", padding_mask, ids.shape)
    real = ids[~padding]
    if real.numel() and bool((real < 0).any() | (real >= logits.shape[1]).any()):
        bad = real[(real < 0) | (real >= logits.shape[1])][0].item()
        raise ValueError(f"prompt_ids holds {bad}, outside the vocabulary [0, {logits.shape[1]})")
    return ids, padding


def _check_logits(name: str, logits: object, shape: tuple[int, int] | None = None) -> Tensor:
    """Logits must be a float (B, V) tensor with V >= 1; their values are :class:`LogitWatch`'s."""
    logits = check_tensor(name, logits, ndim=2, floating=True)
    if shape is not None and tuple(logits.shape) != shape:
        raise ValueError(f"{name} must have shape {shape}, got {tuple(logits.shape)}")
    if logits.shape[1] == 0:
        raise ValueError(f"{name} must have V >= 1 columns, got shape {tuple(logits.shape)}")
    return logits


class LogitWatch:
    """Rows whose logits have no finite maximum (NaN, +inf, or only -inf), noted at every step
    without a host sync and reported at the next value the loop reads back anyway.

    A decode step reads one value back to the host, the one that decides to stop (greedy and
    sampling: "has every row ended?", only when there is a stop rule; beam search: "is every
    row done?"). :meth:`note` keeps each step's bad rows on the device; :meth:`bad_rows` is
    read in the same transfer as the stop flag, and :meth:`check` reports (the first bad step
    and row, naming NaN as such) wherever a value is read: at the stop check, before another
    error, and once after the loop. A bad row's logits are replaced where a kernel would
    fail on them (sampling), so decoding reaches that read-back.
    """

    def __init__(self) -> None:
        self._noted: list[tuple[str, int, Tensor, Tensor]] = []  # name, step, max (B,), bad (B,)

    def note(self, name: str, step: int, logits: Tensor) -> Tensor:
        """Note a step's logits; returns the (B,) bool of its bad rows (no host sync)."""
        row_max = logits.amax(dim=-1)  # (B,), NaN and +inf propagate
        bad = ~torch.isfinite(row_max)
        if torch.compiler.is_compiling():
            assert_in_graph(~bad.any(), f"{name} has a row with NaN, +inf or only -inf values")
        else:
            self._noted.append((name, step, row_max, bad))
        return bad

    def bad_rows(self, like: Tensor) -> Tensor:
        """(B,) bool on ``like``'s device: the rows bad at any step noted since the last
        check (``like``: a (B,) bool, for the shape when nothing was noted)."""
        if not self._noted:
            return torch.zeros_like(like)
        if len(self._noted) == 1:
            return self._noted[0][3]
        return torch.stack([bad for *_, bad in self._noted]).any(dim=0)  # (n, B) -> (B,)

    def check(self, bad: bool | None = None) -> None:
        """Raise ValueError for the first bad row noted (``bad``: the flag already read, if
        it was); forget the noted steps."""
        if bad is None and self._noted:
            bad = bool(self.bad_rows(self._noted[0][3]).any())  # the host sync
        noted, self._noted = self._noted, []
        if not bad:
            return
        for name, step, row_max, rows in noted:
            if bool(rows.any()):
                row = int(rows.nonzero()[0, 0])
                raise ValueError(_bad_logits_message(name, step, row, row_max[row].item()))


def _bad_logits_message(name: str, step: int, row: int, row_max: float) -> str:
    if math.isnan(row_max):
        return (
            f"the model produced NaN logits at step {step} ({name} row {row} has NaN); "
            "look for NaN or inf in its weights or inputs"
        )
    what = "+inf" if row_max > 0 else "only -inf"
    return (
        f"{name} row {row} has {what} logits at step {step}; every row needs at least one "
        "finite logit and no +inf or NaN"
    )


def _decode_token_by_token(
    step_fn: StepFn,
    logits: Tensor,
    cache: Any,
    config: GenerationConfig,
    generator: torch.Generator | None,
    seen: tuple[Tensor, Tensor],
    stop_fn: StopFn | None,
) -> Tensor:
    """Greedy or sampled decoding: one token per row per step, all rows at once.

    One host sync per step at most: the stop check, which also reads :class:`LogitWatch`'s
    flag; without a stop rule, none until the end.
    """
    batch, vocab = logits.shape
    stop_ids = torch.tensor(config.stop_ids, dtype=torch.long, device=logits.device)
    ended = torch.zeros(batch, dtype=torch.bool, device=logits.device)
    watch = LogitWatch()
    bad = torch.zeros(batch, dtype=torch.bool, device=logits.device)  # first_logits: checked
    tokens: list[Tensor] = []
    for step in range(config.max_new_tokens):
        if step > 0:
            logits = step_fn(tokens[-1][:, None], cache)  # (B, 1) -> (B, V)
            logits = _check_logits(f"step_fn output (step {step})", logits, (batch, vocab))
            bad = watch.note(f"step_fn output (step {step})", step, logits)
        if config.reshapes_logits:
            logits = _reshaped_logits(logits, _history(seen, tokens), config, ended, step, watch)
        next_token = _next_token(logits, config, generator, bad)  # (B,)
        if config.fill_id is not None:
            next_token = next_token.masked_fill(ended, config.fill_id)
        tokens.append(next_token)
        if config.stop_ids or stop_fn is not None:
            ended = ended | torch.isin(next_token, stop_ids)
            if stop_fn is not None:
                ended = ended | _check_stops(stop_fn(torch.stack(tokens, dim=1)), batch)
            flags = torch.stack([~ended, watch.bad_rows(ended)]).any(dim=1)  # (2,): live, bad
            live, faulty = flags.tolist()  # the one host sync of the step
            watch.check(faulty)
            if not live:
                break
    watch.check()
    return torch.stack(tokens, dim=1)  # (B, N)


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


def _reshaped_logits(
    logits: Tensor, history: tuple[Tensor, Tensor], config: GenerationConfig, ended: Tensor,
    step: int, watch: LogitWatch,
) -> Tensor:
    """The logits after the repetition penalty and the n-gram ban; a live row they leave
    without a single allowed token is an error (it has nothing left to emit)."""
    reshaped = _apply_rules(logits, *history, config)
    logits = torch.where(ended[:, None], logits, reshaped)  # ended rows: only filler follows
    stuck = ~torch.isfinite(logits.amax(dim=-1))  # (B,)
    if bool(stuck.any()):
        watch.check()  # a row the model gave bad logits is reported as such
        row = int(stuck.nonzero()[0, 0])
        raise ValueError(
            f"no_repeat_ngram_size={config.no_repeat_ngram_size} leaves row {row} no token to "
            f"emit at step {step} (every allowed token would repeat an n-gram); use a larger "
            "size or fewer new tokens"
        )
    return logits


def _apply_rules(
    logits: Tensor, history: Tensor, padding_mask: Tensor, config: GenerationConfig
) -> Tensor:
    return apply_repetition_rules(
        logits, history, padding_mask, repetition_penalty=config.repetition_penalty,
        no_repeat_ngram_size=config.no_repeat_ngram_size,
    )


def _next_token(
    logits: Tensor, config: GenerationConfig, generator: torch.Generator | None, bad: Tensor
) -> Tensor:
    """Argmax, or one draw from the shaped softmax. Rows in ``bad`` (B,) (no finite maximum:
    :class:`LogitWatch` reports them) draw from zeros instead, which ``torch.multinomial``
    accepts; argmax accepts any row."""
    if config.strategy == "greedy":
        return logits.argmax(dim=-1)
    probs = _sampling_probs(logits.masked_fill(bad[:, None], 0.0), config)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)  # (B,)


def _sampling_probs(logits: Tensor, config: GenerationConfig) -> Tensor:
    """softmax(logits / temperature), restricted to the top-k, then to the top-p nucleus.

    Rows need a finite maximum. Never NaN, for any temperature > 0 (see
    :func:`_divide_by_temperature`); the nucleus always keeps each row's most likely token.
    """
    logits = _divide_by_temperature(logits, config.temperature)  # (B, V), <= 0
    vocab = logits.shape[-1]
    if config.top_k is not None and config.top_k < vocab:
        top = logits.topk(config.top_k, dim=-1).indices  # (B, k)
        keep = torch.zeros_like(logits, dtype=torch.bool).scatter_(-1, top, True)
        logits = logits.masked_fill(~keep, float("-inf"))
    probs = F.softmax(logits, dim=-1)
    if config.top_p is not None and config.top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        cumulative = sorted_probs.cumsum(dim=-1)  # (B, V)
        mass_before = F.pad(cumulative[..., :-1], (1, 0))  # (B, V): mass of likelier tokens
        # a token is in the nucleus iff the more likely tokens have not yet reached top_p;
        # the likeliest always is (Hugging Face's min_tokens_to_keep=1), also for a top_p
        # that rounds to 0 in the probabilities' dtype
        in_nucleus = mass_before < config.top_p
        in_nucleus[..., 0] = True
        keep = torch.zeros_like(probs, dtype=torch.bool).scatter_(-1, order, in_nucleus)
        probs = probs.masked_fill(~keep, 0.0)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def _divide_by_temperature(logits: Tensor, temperature: float) -> Tensor:
    """``(logits - row max) / temperature`` (``logits / temperature`` for T >= 1, which
    cannot overflow): softmax's input, which the shift leaves unchanged.

    Below 1 every value lies in [-inf, 0] and each row's maxima are exactly 0, so no temperature > 0
    overflows into NaN: a tiny one sends the others to -inf, which is the limit T -> 0
    (softmax(x / T) -> uniform over the argmax set). Computed in float32 or wider; in
    float64 when T is below the smallest normal number of that dtype (it would round to 0
    or lose digits there), and on a device without float64 (``mps``) such a T is that limit.

    Shapes:
        logits: (B, V), every row with a finite maximum
        returns: (B, V), float32 or wider
    """
    dtype = torch.promote_types(logits.dtype, torch.float32)
    if temperature >= 1.0:  # |logits / T| <= |logits|: no overflow, no shift needed
        return logits.to(dtype) / temperature
    shifted = logits.to(dtype) - logits.amax(dim=-1, keepdim=True).to(dtype)  # (B, V), <= 0
    if temperature >= torch.finfo(dtype).tiny:
        return shifted / temperature
    if logits.device.type == "mps":  # no float64: the limit, every non-maximum at -inf
        return shifted.masked_fill(shifted < 0, float("-inf"))
    return shifted.double() / temperature  # exact to float64's rounding, subnormal T too
