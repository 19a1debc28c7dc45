"""Beam search over the decoding interface of :mod:`addnorm.generation.loop` (which
calls it for ``strategy="beam"``).

B input rows become B * K beams (row ``b`` holds beams ``b * K .. b * K + K - 1``; the cache
follows through ``cache.reorder``). Each step extends every live beam by every token, keeps
the K best by summed log-probability, and moves those that emit a stop token to the row's
finished hypotheses, scored with the length penalty. A row is done when no live beam can beat
its K-th finished one (``beam_stop="exact"``), or by one of Hugging Face's two other rules.
The logit rules (:mod:`addnorm.generation.logit_rules`) apply to the log-probs, as in Hugging
Face's beam search, whose tokens these are for the same log-probs (its ``early_stopping``
"never", False and True are ``beam_stop`` "exact", "heuristic" and "k_finished"). The live
beams of a row are kept best first, as Hugging Face keeps them, so each step's log-probs come
in its order too (``output_scores``), and the row of the beam each token extended is kept
with the tokens (``beam_indices``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from addnorm.generation.config import GenerationConfig
from addnorm.generation.deadline import Deadline
from addnorm.generation.logit_rules import LogitRules
from addnorm.generation.output import Recorder
from addnorm.generation.step import LogitWatch, StepFn
from addnorm.utils.memory import check_fits

__all__ = ["beam_search"]


@dataclass
class _Beams:
    """Beam-search state for B rows of K beams; ``fin_*`` keep each row's K best endings."""

    alive_tokens: Tensor  # (B, K, n) tokens of the beams still growing
    alive_scores: Tensor  # (B, K) sum of log-probs; -inf marks an empty beam
    fin_tokens: Tensor  # (B, K, max_new_tokens) finished hypotheses, fill_id after the end
    fin_scores: Tensor  # (B, K) length-penalised scores, best first; -inf marks an empty slot
    fin_lengths: Tensor  # (B, K)
    done: Tensor  # (B,) the row's finished hypotheses can no longer be beaten
    fill_id: int
    # beam_indices (kept when recorded): per token, the row b * K + k of the beam it extended
    alive_rows: Tensor | None = None  # (B, K, n)
    fin_rows: Tensor | None = None  # (B, K, max_new_tokens), -1 after the end


def beam_search(
    step_fn: StepFn, logits: Tensor, cache: Any, config: GenerationConfig,
    seen: tuple[Tensor, Tensor], banned: Tensor | None = None, *,
    deadline: Deadline | None = None, record: Recorder | None = None,
) -> Tensor:
    """Beam search with K = ``num_beams`` beams per row, vectorised over rows and beams.

    At each step every beam is extended by every token. Of the K best extensions of a row,
    those ending in a stop token leave the beam as finished hypotheses; the K best extensions
    that do not end in a stop token form the next beams. At ``max_new_tokens`` the remaining
    beams finish too. Score: ``sum log p / n ** length_penalty`` (n generated tokens).

    Stopping rule, ``config.beam_stop`` (a done row takes no more finished hypotheses):

    - ``"exact"``: a row is done once its K-th best finished hypothesis scores >= the best
      score any live beam could still reach. Log-probs are <= 0, so a beam's sum s can only
      fall; its best reachable score is s / n ** length_penalty at the most favourable final
      length n in [current + 1, max_new_tokens], which is one of the two ends. Hugging Face's
      ``early_stopping="never"`` bounds it at the current length instead of current + 1 when
      ``length_penalty`` < 0, also a bound no live beam can beat: the same hypotheses.
    - ``"heuristic"`` (Hugging Face's default, ``early_stopping=False``): done once the K-th
      best finished hypothesis scores >= s / n ** length_penalty, the best live beam scored
      at its current length n; with ``length_penalty`` > 0 a longer beam might still win.
    - ``"k_finished"`` (``early_stopping=True``): done once K hypotheses have finished.

    A row with fewer than K finished hypotheses goes on while it has a live beam. Decoding
    stops when every row is done or at ``max_new_tokens``; each row returns its
    ``config.num_return_sequences`` best finished hypotheses, best first (row ``b * r + j``
    is row ``b``'s j-th best).

    The logit rules act on each beam's log-probs, its history being the prompt followed by
    the beam's own tokens (Hugging Face's order). ``banned`` (n,) long: ids never emitted
    (their logits set to -inf), or None.

    ``deadline`` (``max_time``): once it has passed, read after a step's stop check, the live
    beams of the rows not done before that step finish at their length, as when
    ``max_new_tokens`` is reached (transformers' stopping criteria end every candidate of the
    step). ``record``: collects each step's log-probs after the rules (B * K, V) and the
    model's logits, and the returned hypotheses' scores and beam rows.

    Shapes:
        logits: (B, V); seen: the prompt's ids and padding (B, L0)
        returns: (B * num_return_sequences, N) long
    """
    batch, vocab = logits.shape
    k, max_new, penalty = config.num_beams, config.max_new_tokens, config.length_penalty
    device = logits.device
    # the finished hypotheses: B * K rows of max_new_tokens long ids, allocated up front
    check_fits(f"max_new_tokens ({max_new}) with num_beams ({k}) and {batch} rows",
               batch * k * max_new * 8, device)
    dtype = torch.promote_types(logits.dtype, torch.float32)
    is_stop = torch.zeros(vocab, dtype=torch.bool, device=device)
    is_stop[list(config.stop_ids)] = True
    cache.reorder(torch.arange(batch, device=device).repeat_interleave(k))  # B -> B * K rows
    logits = logits.repeat_interleave(k, dim=0)  # (B * K, V): beam copies of each row
    fill = config.fill_id if config.fill_id is not None else 0  # None: nothing ends early
    beams = _start_beams(batch, k, max_new, fill, device, dtype, rows=record is not None)
    prompt = tuple(t.repeat_interleave(k, dim=0) for t in seen)  # (B * K, L0) each
    rules = LogitRules(config, device) if config.has_logit_rules else None
    watch = LogitWatch()  # bad logits: read with the stop check (see LogitWatch)
    no_rows = torch.zeros(batch * k, dtype=torch.bool, device=device)  # (B * K,)
    for step in range(max_new):
        if step > 0:
            last = beams.alive_tokens[:, :, -1].reshape(batch * k, 1)  # (B * K, 1)
            logits = step_fn(last, cache)  # (B * K, V)
        if record is not None:
            record.add_logits(logits)
        if banned is not None:
            logits = logits.index_fill(-1, banned, float("-inf"))  # (B * K, V)
        name = "first_logits" if step == 0 else f"step_fn output (step {step})"
        bad = watch.note(name, step, logits)  # (B * K,), no host sync
        logits = logits.masked_fill(bad[:, None], 0.0)  # kept finite until reported
        log_probs = F.log_softmax(logits.to(dtype), dim=-1)  # (B * K, V)
        if rules is not None:
            history = _history(prompt, beams.alive_tokens) if rules.needs_history else None
            log_probs = rules(log_probs, step, history)
        if record is not None:
            record.add_scores(log_probs)
        log_probs = log_probs.view(batch, k, vocab)  # (B, K, V)
        done_before = beams.done.clone() if deadline is not None else beams.done  # (B,)
        parent = _advance(beams, log_probs, is_stop, penalty)  # (B, K)
        length = step + 1
        if length == max_new:
            _finish_alive(beams, length, penalty, done_before)
            break
        _update_done(beams, length, max_new, penalty, config.beam_stop)
        flags = torch.stack([(~beams.done).any(), watch.bad_rows(no_rows).any()])  # live, bad
        live, faulty = flags.tolist()  # the one host sync of the step
        watch.check(faulty)
        if deadline is not None and deadline.passed():  # max_time: every candidate ends here
            _finish_alive(beams, length, penalty, done_before)
            break
        if not live:
            break
        rows = torch.arange(batch, device=device)[:, None] * k  # (B, 1)
        cache.reorder((rows + parent).reshape(-1))  # (B * K,) follow each beam's parent
    watch.check()
    r = config.num_return_sequences
    n = int(beams.fin_lengths[:, :r].max())
    if record is not None:
        record.sequences_scores = beams.fin_scores[:, :r].reshape(batch * r)  # (B * r,)
        if beams.fin_rows is not None:
            record.beam_indices = beams.fin_rows[:, :r, :n].reshape(batch * r, n)
    return beams.fin_tokens[:, :r, :n].reshape(batch * r, n)  # (B * r, N), best first


def _history(prompt: tuple[Tensor, ...], alive: Tensor) -> tuple[Tensor, Tensor]:
    """Each beam's history: the prompt (its padding marked) and the beam's own tokens.

    Shapes:
        prompt: ids and padding (B * K, L0); alive: (B, K, n); returns: (B * K, L0 + n) each
    """
    ids, padding = prompt
    own = alive.reshape(ids.shape[0], -1)  # (B * K, n)
    return (torch.cat([ids, own], dim=1),
            torch.cat([padding, torch.zeros_like(own, dtype=torch.bool)], dim=1))


def _finish_alive(beams: _Beams, length: int, penalty: float, done_before: Tensor) -> None:
    """The live beams of the rows not done before this step finish at ``length``."""
    ending = torch.isfinite(beams.alive_scores) & ~done_before[:, None]  # (B, K)
    scores = beams.alive_scores / float(length) ** penalty
    _add_finished(beams, beams.alive_tokens, scores.masked_fill(~ending, float("-inf")),
                  beams.alive_rows)


def _start_beams(batch: int, k: int, max_new: int, fill_id: int, device, dtype, *,
                 rows: bool) -> _Beams:
    """K copies of the empty prefix per row; all but the first are empty so none repeats.
    ``rows``: keep the beam row of every token (``beam_indices``)."""
    alive_scores = torch.full((batch, k), float("-inf"), dtype=dtype, device=device)
    alive_scores[:, 0] = 0.0
    return _Beams(
        alive_tokens=torch.empty(batch, k, 0, dtype=torch.long, device=device),
        alive_scores=alive_scores,
        fin_tokens=torch.full((batch, k, max_new), fill_id, dtype=torch.long, device=device),
        fin_scores=torch.full((batch, k), float("-inf"), dtype=dtype, device=device),
        fin_lengths=torch.zeros(batch, k, dtype=torch.long, device=device),
        done=torch.zeros(batch, dtype=torch.bool, device=device),
        fill_id=fill_id,
        alive_rows=torch.empty(batch, k, 0, dtype=torch.long, device=device) if rows else None,
        fin_rows=torch.full((batch, k, max_new), -1, dtype=torch.long, device=device)
        if rows else None,
    )


def _advance(beams: _Beams, log_probs: Tensor, is_stop: Tensor, penalty: float) -> Tensor:
    """Extend every beam by every token; move stop endings out, keep the K best others."""
    batch, k, vocab = log_probs.shape
    length = beams.alive_tokens.shape[-1] + 1
    candidates = (beams.alive_scores[..., None] + log_probs).view(batch, k * vocab)  # (B, K*V)
    top_scores, top_index = candidates.topk(k, dim=-1)  # (B, K)
    ending = is_stop[top_index % vocab] & torch.isfinite(top_scores) & ~beams.done[:, None]
    scores = (top_scores / float(length) ** penalty).masked_fill(~ending, float("-inf"))
    _add_finished(beams, _extend(beams.alive_tokens, top_index, vocab), scores,
                  _extend_rows(beams.alive_rows, top_index, vocab))
    growing = candidates.masked_fill(is_stop.repeat(k), float("-inf"))  # (B, K*V)
    alive_scores, alive_index = growing.topk(k, dim=-1)  # (B, K)
    beams.alive_tokens = _extend(beams.alive_tokens, alive_index, vocab)  # (B, K, n + 1)
    beams.alive_rows = _extend_rows(beams.alive_rows, alive_index, vocab)
    beams.alive_scores = alive_scores
    return alive_index // vocab


def _extend(tokens: Tensor, index: Tensor, vocab: int) -> Tensor:
    """Sequences for flat candidate ``index`` (beam * V + token) of shape (B, K')."""
    parent, token = index // vocab, index % vocab  # (B, K')
    prefix = tokens.gather(1, parent[..., None].expand(-1, -1, tokens.shape[-1]))  # (B, K', n)
    return torch.cat([prefix, token[..., None]], dim=-1)  # (B, K', n + 1)


def _extend_rows(rows: Tensor | None, index: Tensor, vocab: int) -> Tensor | None:
    """The beam rows of the sequences :func:`_extend` makes: each parent's, then the row
    ``b * K + parent`` of the beam the new token extended (None when not kept)."""
    if rows is None:
        return None
    batch, k = rows.shape[:2]
    parent = index // vocab  # (B, K')
    prefix = rows.gather(1, parent[..., None].expand(-1, -1, rows.shape[-1]))  # (B, K', n)
    own = torch.arange(batch, device=rows.device)[:, None] * k + parent  # (B, K')
    return torch.cat([prefix, own[..., None]], dim=-1)  # (B, K', n + 1)


def _add_finished(beams: _Beams, sequences: Tensor, scores: Tensor,
                  rows: Tensor | None = None) -> None:
    """Merge hypotheses (B, K', n) scored (B, K') (-inf = not a hypothesis) into the K best;
    ``rows``: their beam rows (B, K', n), when kept."""
    batch, k, max_new = beams.fin_tokens.shape
    all_scores = torch.cat([beams.fin_scores, scores], dim=1)  # (B, K + K')
    n = sequences.shape[-1]
    all_lengths = torch.cat([beams.fin_lengths, torch.full_like(scores, n, dtype=torch.long)], 1)
    # best first; on a tie the hypothesis already kept wins (a stable sort), so a non-hypothesis
    # (-inf) never takes an empty slot (-inf too), which returns the filler
    ranked, order = all_scores.sort(dim=-1, descending=True, stable=True)  # (B, K + K')
    beams.fin_scores, best = ranked[:, :k], order[:, :k]  # (B, K)
    beams.fin_tokens = _merged(beams.fin_tokens, sequences, beams.fill_id, best)
    beams.fin_lengths = all_lengths.gather(1, best)
    if beams.fin_rows is not None and rows is not None:
        beams.fin_rows = _merged(beams.fin_rows, rows, -1, best)


def _merged(finished: Tensor, new: Tensor, fill: int, best: Tensor) -> Tensor:
    """The K ``best`` of the finished (B, K, max_new) and the new (B, K', n) sequences, the
    new ones filled with ``fill`` to max_new."""
    batch, _, max_new = finished.shape
    padded = finished.new_full((batch, new.shape[1], max_new), fill)
    padded[..., : new.shape[-1]] = new
    every = torch.cat([finished, padded], dim=1)  # (B, K + K', max_new)
    return every.gather(1, best[..., None].expand(-1, -1, max_new))


def _update_done(beams: _Beams, length: int, max_new: int, penalty: float, rule: str) -> None:
    """Mark the rows that ``rule`` (``beam_stop``) ends, ``length`` tokens into the search
    (see :func:`beam_search`); a row without a live beam is done whatever the rule."""
    best_sum = beams.alive_scores.amax(dim=-1)  # (B,), <= 0 or -inf
    if rule == "k_finished":
        beams.done |= torch.isfinite(beams.fin_scores[:, -1]) | torch.isneginf(best_sum)
        return
    if rule == "heuristic":
        reachable = best_sum / float(length) ** penalty
    else:
        reachable = torch.maximum(
            best_sum / float(length + 1) ** penalty, best_sum / float(max_new) ** penalty
        )
    beams.done |= beams.fin_scores[:, -1] >= reachable
