"""addnorm.generation.scoring: ``decode_log_probs`` scores a text as the decode path reads
it.

Oracles: within one window the decode path's logits are the forward's at every position
(cached steps equal full recomputation), so the log-probabilities are the forward's
log-softmax at the next tokens (float64 models: FLOAT64_EXACT); past the window, the forward
of each window (tests/generation/test_window.py holds the schedule, here one case).
"""

from __future__ import annotations

import pytest
import torch
from tiny_transformers import POSITIONS, language_model, transformer
from tolerances import FLOAT64_EXACT

from addnorm.generation.scoring import decode_log_probs


def _forward_log_probs(model, ids: torch.Tensor) -> torch.Tensor:
    log_probs = model(ids)[:, :-1].log_softmax(dim=-1)  # (B, L - 1, V)
    return log_probs.gather(-1, ids[:, 1:, None]).squeeze(-1)


@pytest.mark.parametrize("positions", POSITIONS)
@torch.no_grad()
def test_within_the_window_the_scores_are_the_forwards(positions):
    model = language_model(positions)
    ids = torch.randint(3, 23, (3, 12), generator=torch.Generator().manual_seed(0))
    scores = decode_log_probs(model, ids)  # the context: max_len 16, no slide
    assert scores.shape == (3, 11) and scores.dtype == torch.float64
    torch.testing.assert_close(scores, _forward_log_probs(model, ids), **FLOAT64_EXACT)


@torch.no_grad()
def test_past_the_window_each_score_is_the_forward_of_its_window():
    # window 4, stride 1: every token from the 4 before it (nanoGPT's crop)
    model = language_model("sinusoidal")
    ids = torch.randint(3, 23, (2, 10), generator=torch.Generator().manual_seed(1))
    scores = decode_log_probs(model, ids, window=4, window_stride=1)
    for i in range(9):  # column i scores ids[:, i + 1] from ids[:, max(0, i - 3) : i + 1]
        window = ids[:, max(0, i - 3) : i + 2]
        expected = _forward_log_probs(model, window)[:, -1]
        torch.testing.assert_close(scores[:, i], expected, **FLOAT64_EXACT)


@pytest.mark.parametrize(("ids", "message"), [
    (torch.tensor([[5]]), "L >= 2"),
    (torch.tensor([[5.0, 6.0]]), "long"),
    (torch.tensor([5, 6]), "must have 2 dims"),
])
def test_a_text_that_cannot_be_scored_is_refused(ids, message):
    with pytest.raises((ValueError, TypeError), match=message):
        decode_log_probs(language_model(), ids)


def test_an_encoder_decoder_is_refused():
    with pytest.raises(ValueError, match="decoder-only"):
        decode_log_probs(transformer(), torch.tensor([[5, 6]]))
