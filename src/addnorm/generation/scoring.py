"""Scoring a text the way generation reads it: each next token's log-probability from the
decode path (``start``, then ``step`` per token, the window sliding as in ``generate``), the
tokens fed being the text's own (teacher forcing).

A model's forward scores a text at the positions of one pass; generation reaches later
positions, or, past its context, a slid window (:mod:`addnorm.generation.window`). This is the
held-out loss of what generation computes, position by position: how a long generation is
held to the model's quality within its context.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import torch
from torch import Tensor

from addnorm.generation.config import GenerationConfig
from addnorm.generation.step import StepFn
from addnorm.generation.window import sliding_step, window_of
from addnorm.utils.checks import check_tensor

if TYPE_CHECKING:
    from addnorm.family import GenerativeModel, WindowedModel

__all__ = ["decode_log_probs"]


@torch.no_grad()
def decode_log_probs(
    model: GenerativeModel, ids: Tensor, *, window: int | None = None,
    window_stride: int | None = None,
) -> Tensor:
    """The log-probability the decode path gives each token of ``ids`` after the first: the
    model's ``start`` on the first token, then its ``step`` on each token in turn, sliding
    the window as :func:`~addnorm.generation.generate.generate` would with ``window`` and
    ``window_stride`` (None: the model's context and the default stride). A decoder-only
    model's rows, without padding.

    Shapes:
        ids: (B, L), L >= 2
        returns: (B, L - 1), float32 or the logits' wider dtype; column i scores
        ``ids[:, i + 1]``
    """
    ids = check_tensor("ids", ids, ndim=2)
    if ids.dtype != torch.long or ids.shape[1] < 2:
        raise ValueError(f"ids must be a long (B, L) tensor with L >= 2, got {ids.dtype} "
                         f"{tuple(ids.shape)}")
    spec = model.generation_spec
    if spec.start_id is not None:
        raise ValueError("decode_log_probs scores a decoder-only model's text")
    frame = window_of(spec, GenerationConfig(window=window, window_stride=window_stride))
    new = ids.shape[1] - 1
    padding = torch.zeros_like(ids[:, :1], dtype=torch.bool)  # (B, 1): no padding
    step: StepFn
    if frame is None:
        cache, logits = model.start(ids[:, :1], padding, max_new_tokens=new)
        step = model.step
    else:
        windowed = cast("WindowedModel", model)
        cache, logits = windowed.start(ids[:, :1], padding, max_new_tokens=new,
                                       window=frame.size)
        step = sliding_step(model.step, windowed, frame, 1)
    scores = [logits]
    for i in range(1, new):
        scores.append(step(ids[:, i : i + 1], cache))  # (B, V)
    logits = torch.stack(scores, dim=1)  # (B, L - 1, V)
    log_probs = logits.to(torch.promote_types(logits.dtype, torch.float32)).log_softmax(dim=-1)
    return log_probs.gather(-1, ids[:, 1:, None]).squeeze(-1)
