"""How a decoder picks its next token from the logits (:mod:`addnorm.generation.loop` calls
:func:`pick_token` once a step): greedy's argmax, or one draw from softmax(logits /
temperature) restricted to the top-k, the top-p nucleus and the tokens min-p keeps, in Hugging
Face's order; never NaN for any temperature > 0 (:func:`divide_by_temperature`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from addnorm.generation.config import GenerationConfig

__all__ = ["divide_by_temperature", "filtered_probs", "pick_token", "sampling_probs"]


def pick_token(
    logits: Tensor, config: GenerationConfig, generator: torch.Generator | None, bad: Tensor,
    want_scores: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """Argmax, or one draw from the shaped softmax; and, when ``want_scores``, the scores
    the token was picked from (Hugging Face's: the logits for greedy decoding; divided by
    the temperature, -inf where top-k, top-p or min-p removed a token, for sampling).
    Rows in ``bad`` (B,) (no finite maximum: :class:`~addnorm.generation.step.LogitWatch`
    reports them) draw from zeros instead, which ``torch.multinomial`` accepts; argmax accepts
    any row.

    Shapes:
        logits: (B, V); bad: (B,); returns: (B,) long, (B, V) or None
    """
    if config.strategy == "greedy":
        return logits.argmax(dim=-1), logits if want_scores else None
    probs, keep = filtered_probs(logits.masked_fill(bad[:, None], 0.0), config)
    token = torch.multinomial(probs, 1, generator=generator).squeeze(-1)  # (B,)
    if not want_scores:
        return token, None
    scores = logits.to(torch.float32) / config.temperature  # (B, V), transformers' order
    return token, scores if keep is None else scores.masked_fill(~keep, float("-inf"))


def sampling_probs(logits: Tensor, config: GenerationConfig) -> Tensor:
    """softmax(logits / temperature), restricted to the top-k, then to the top-p nucleus,
    then to the tokens min-p keeps (see :func:`filtered_probs`)."""
    return filtered_probs(logits, config)[0]


def filtered_probs(logits: Tensor, config: GenerationConfig) -> tuple[Tensor, Tensor | None]:
    """The sampling distribution and the tokens it keeps (None: every token).

    softmax(logits / temperature), restricted to the top-k, then to the top-p nucleus, then
    to the tokens whose probability is at least ``min_p`` times the likeliest's (Hugging
    Face's order: temperature, top-k, top-p, min-p). Rows need a finite maximum. Never NaN,
    for any temperature > 0 (see :func:`divide_by_temperature`); top-p and min-p always
    keep each row's most likely token.

    Shapes:
        logits: (B, V); returns: probs (B, V) float32 or wider, keep (B, V) bool or None
    """
    logits = divide_by_temperature(logits, config.temperature)  # (B, V), <= 0
    vocab = logits.shape[-1]
    keep = None
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
        nucleus = torch.zeros_like(probs, dtype=torch.bool).scatter_(-1, order, in_nucleus)
        probs = probs.masked_fill(~nucleus, 0.0)
        probs = probs / probs.sum(dim=-1, keepdim=True)
        keep = nucleus if keep is None else keep & nucleus
    if config.min_p is not None:
        # at least min_p times the likeliest token's probability (which min_p <= 1 keeps)
        kept = probs >= config.min_p * probs.amax(dim=-1, keepdim=True)  # (B, V)
        probs = probs.masked_fill(~kept, 0.0)
        probs = probs / probs.sum(dim=-1, keepdim=True)
        keep = kept if keep is None else keep & kept
    return probs, keep


def divide_by_temperature(logits: Tensor, temperature: float) -> Tensor:
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
