"""The rules that reshape next-token logits before a token is picked, in Hugging Face's order.

A :class:`GenerationConfig`'s rules, built once per generation on the logits' device and
applied at every step by greedy decoding and sampling (to the logits) and by beam search (to
the log-probs), as transformers' logits processors are:

1. ``repetition_penalty``, 2. ``no_repeat_ngram_size`` (:mod:`addnorm.generation.repetition`);
3. ``bad_words_ids`` (``NoBadWordsLogitsProcessor``); 4. ``min_new_tokens``
(``MinNewTokensLengthLogitsProcessor``: the stop ids banned); 5. ``forced_eos_id``
(``ForcedEOSTokenLogitsProcessor``: the step of the ``max_new_tokens``-th token keeps only
those ids, at 0); 6. ``suppress_tokens`` (``SuppressTokensLogitsProcessor``).

Every rule but the penalty sets logits to -inf, and the penalty keeps -inf where it is, so
1-4 commute; 5 overwrites what 1-4 did, so its step skips them; 6 comes last, as in
transformers (a forced id that is also suppressed leaves no token: the config refuses that).

A banned token is found without reading anything back: a bad word's prefix is compared with
the end of each row's history on the device. The history is the one of the repetition rules
(the prompt, its padding excluded, then the new tokens), so a prefix never matches padding,
where transformers compares it with the pad tokens' ids.

Shapes legend: B rows (beams), L history length, V vocabulary.
"""

from __future__ import annotations

import torch
from torch import Tensor

from addnorm.generation.config import GenerationConfig
from addnorm.generation.repetition import apply_repetition_rules

__all__ = ["LogitRules"]


class LogitRules:
    """The logit rules of ``config`` on ``device`` (see the module docstring).

    Called as ``rules(logits, step, history)``: ``step`` counts the new tokens before this
    one (0 for the first); ``history`` is the rows' tokens so far and their padding (True =
    padding), needed only when :attr:`needs_history` (else None).

    Shapes:
        logits: (B, V); history: ids (B, L) and padding (B, L); returns: (B, V)
    """

    def __init__(self, config: GenerationConfig, device: torch.device) -> None:
        self.config = config
        self.stop_ids = _ids(config.stop_ids, device)
        self.suppressed = _ids(config.suppress_tokens, device)
        self.forced = _ids(config.forced_ids, device)
        # transformers never bans a stop id as a one-token bad word: a row must be able to stop
        singles = {words[0] for words in config.bad_words_ids if len(words) == 1}
        self.bad_tokens = _ids(tuple(sorted(singles - set(config.stop_ids))), device)
        self.bad_sequences = _by_prefix_length(config.bad_words_ids, device)

    @property
    def needs_history(self) -> bool:
        """Whether a rule reads the rows' tokens so far (``config.reshapes_logits``)."""
        return self.config.reshapes_logits

    def __call__(
        self, logits: Tensor, step: int, history: tuple[Tensor, Tensor] | None
    ) -> Tensor:
        config = self.config
        if self.forced is not None and step == config.max_new_tokens - 1:
            logits = torch.full_like(logits, float("-inf")).index_fill(-1, self.forced, 0.0)
        else:
            if config.repetition_penalty != 1.0 or config.no_repeat_ngram_size > 0:
                logits = apply_repetition_rules(
                    logits, *_given(history), repetition_penalty=config.repetition_penalty,
                    no_repeat_ngram_size=config.no_repeat_ngram_size,
                )
            if self.bad_tokens is not None:
                logits = logits.index_fill(-1, self.bad_tokens, float("-inf"))
            if self.bad_sequences:
                ends = self._bad_word_ends(*_given(history), logits.shape[-1])  # (B, V)
                logits = logits.masked_fill(ends, float("-inf"))
            if self.stop_ids is not None and step < config.min_new_tokens:
                logits = logits.index_fill(-1, self.stop_ids, float("-inf"))  # no stop yet
        if self.suppressed is not None:
            logits = logits.index_fill(-1, self.suppressed, float("-inf"))
        return logits

    def _bad_word_ends(self, history: Tensor, padding_mask: Tensor, vocab: int) -> Tensor:
        """(B, V) bool: the last tokens of the bad words of several tokens whose other tokens
        end a row's history (its real tokens only)."""
        batch, length = history.shape
        banned = torch.zeros(batch, vocab, dtype=torch.int32, device=history.device)
        for prefixes, last in self.bad_sequences:  # one group per prefix length p
            p = prefixes.shape[1]
            if p > length:
                continue  # the history is shorter than the prefix: nothing matches
            tail = history[:, length - p :]  # (B, p)
            real = ~padding_mask[:, length - p :].any(dim=-1)  # (B,)
            match = (tail[:, None, :] == prefixes[None]).all(dim=-1) & real[:, None]  # (B, G)
            banned.index_add_(1, last, match.to(torch.int32))  # (B, V), G words at most
        return banned > 0


def _given(history: tuple[Tensor, Tensor] | None) -> tuple[Tensor, Tensor]:
    if history is None:
        raise ValueError("these logit rules read the rows' history: pass it (needs_history)")
    return history


def _ids(ids: tuple[int, ...], device: torch.device) -> Tensor | None:
    """The ids as a long (n,) tensor, or None when there are none."""
    return torch.tensor(ids, dtype=torch.long, device=device) if ids else None


def _by_prefix_length(
    words: tuple[tuple[int, ...], ...], device: torch.device
) -> list[tuple[Tensor, Tensor]]:
    """The bad words of several tokens, grouped by their length: per group, the prefixes
    (G, p) and the last tokens (G,) long."""
    groups: dict[int, list[tuple[int, ...]]] = {}
    for sequence in dict.fromkeys(words):  # each once, in order
        if len(sequence) > 1:
            groups.setdefault(len(sequence) - 1, []).append(sequence)
    return [
        (torch.tensor([s[:-1] for s in group], dtype=torch.long, device=device),
         torch.tensor([s[-1] for s in group], dtype=torch.long, device=device))
        for group in groups.values()
    ]
