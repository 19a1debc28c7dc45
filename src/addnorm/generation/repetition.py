"""Rules against repetition, applied to next-token logits before a token is picked.

Both follow Hugging Face's logits processors, so its users' settings mean the same here:

- ``repetition_penalty`` p (CTRL, Keskar et al., 2019; ``RepetitionPenaltyLogitsProcessor``):
  the logit of every token already seen is divided by p when positive and multiplied by p
  when negative, so p > 1 makes every seen token less likely;
- ``no_repeat_ngram_size`` n (``NoRepeatNGramLogitsProcessor``): a token that would complete
  an n-gram already seen gets logit -inf.

"Seen" is a row's history: its prompt (for a decoder-only model) followed by the tokens
generated so far. Positions marked by ``padding_mask`` (True = padding) are left out, so a
padded row is treated exactly as it would be alone; transformers' n-gram ban counts a padded
prompt's pad tokens (its repetition penalty, in transformers 5, leaves left padding out too).

Shapes legend: B rows, L history length, V vocabulary.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["apply_repetition_rules"]


def apply_repetition_rules(
    logits: Tensor,
    history: Tensor,
    padding_mask: Tensor,
    *,
    repetition_penalty: float = 1.0,
    no_repeat_ngram_size: int = 0,
) -> Tensor:
    """The repetition penalty, then the n-gram ban (Hugging Face's order), on logits or
    log-probs; ``repetition_penalty=1.0`` and ``no_repeat_ngram_size=0`` leave them unchanged.

    The caller checks the arguments (``GenerationConfig`` does on construction).

    Shapes:
        logits: (B, V); history: (B, L) long ids in [0, V); padding_mask: (B, L) bool
        returns: (B, V)
    """
    vocab = logits.shape[1]
    if repetition_penalty != 1.0:
        seen = _token_set(history, padding_mask, vocab)  # (B, V)
        penalized = torch.where(
            logits < 0, logits * repetition_penalty, logits / repetition_penalty
        )
        logits = torch.where(seen, penalized, logits)
    if no_repeat_ngram_size > 0:
        banned = _repeated_ngram_ends(history, padding_mask, no_repeat_ngram_size, vocab)
        logits = logits.masked_fill(banned, float("-inf"))
    return logits


def _token_set(ids: Tensor, padding_mask: Tensor, vocab: int) -> Tensor:
    """Which of the V ids occur among the unmasked tokens of each row: (B, L) -> (B, V)."""
    index = ids.masked_fill(padding_mask, vocab)  # masked ones go to a spare column V
    present = torch.zeros(ids.shape[0], vocab + 1, dtype=torch.bool, device=ids.device)
    return present.scatter_(1, index, True)[:, :vocab]


def _repeated_ngram_ends(history: Tensor, padding_mask: Tensor, n: int, vocab: int) -> Tensor:
    """The tokens that would complete an n-gram already in the row: (B, L) -> (B, V) bool.

    Every n-gram of the history whose first n - 1 tokens equal the row's last n - 1 tokens
    bans its last token (n = 1: every token seen). N-grams touching padding do not count.
    """
    batch, length = history.shape
    if length < n:  # no complete n-gram yet
        return torch.zeros(batch, vocab, dtype=torch.bool, device=history.device)
    grams = history.unfold(1, n, 1)  # (B, W, n), W = L - n + 1
    real = ~padding_mask.unfold(1, n, 1).any(dim=-1)  # (B, W)
    prefix = history[:, length - n + 1 :]  # (B, n - 1): what the next token would complete
    prefix_real = ~padding_mask[:, length - n + 1 :].any(dim=-1)  # (B,)
    match = (grams[..., :-1] == prefix[:, None, :]).all(dim=-1) & real & prefix_real[:, None]
    return _token_set(grams[..., -1], ~match, vocab)  # (B, V)
