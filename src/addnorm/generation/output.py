"""What ``generate`` returns with Hugging Face's ``return_dict_in_generate=True``: the tokens
and, as asked, the scores of every step (``output_scores``), the model's logits
(``output_logits``) and, for beam search, the hypotheses' scores and beams.

:class:`GenerateOutput` holds the fields of transformers' ``GenerateDecoderOnlyOutput`` and
``GenerateBeamDecoderOnlyOutput`` (and their encoder-decoder kinds) that addnorm fills, under
the same names, read as attributes or by name (``out.sequences``, ``out["scores"]``).
:class:`Recorder` collects them during decoding; it keeps device tensors and reads nothing
back, so asking for them adds no host read to a step.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import torch
from torch import Tensor

__all__ = ["GenerateOutput", "Recorder"]


@dataclass(frozen=True)
class GenerateOutput:
    """The tokens of a ``generate`` call and what it was asked to return beside them.

    Attributes:
        sequences: the tokens, as the call returns them without ``return_dict_in_generate``
            (the prompt first, unless ``return_prompt=False``).
        scores: with ``output_scores=True``, one float32 tensor per new token: the logits
            after every rule of :mod:`addnorm.generation.logit_rules` and, when sampling,
            after temperature, top-k, top-p and min-p (-inf where they remove a token);
            beam search: every beam's log-probs after the rules, the beams in the order that
            ``beam_indices`` names. Rows that have ended hold their filler's scores (their
            rules skipped). Else None.
        logits: with ``output_logits=True``, the model's logits for every new token, float32,
            before any rule; else None.
        sequences_scores: beam search with ``output_scores=True``: each returned hypothesis's
            score (summed log-probs over its length to the ``length_penalty``); else None.
        beam_indices: beam search: for each returned hypothesis and new token, the row of
            the beam it extended at that step (``b * num_beams + k``: the row of ``scores``),
            -1 after the hypothesis ended; else None.

    Shapes:
        sequences: (B * r, L0 + N) with the prompt, (B * r, N) without
        scores, logits: N tensors of (B * r, V); (B * num_beams, V) for beam search
        sequences_scores: (B * r,); beam_indices: (B * r, N) long
    """

    sequences: Tensor
    scores: tuple[Tensor, ...] | None = None
    logits: tuple[Tensor, ...] | None = None
    sequences_scores: Tensor | None = None
    beam_indices: Tensor | None = None

    def keys(self) -> list[str]:
        """The names of the fields that are set (not None), as transformers' outputs list."""
        return [f.name for f in fields(self) if getattr(self, f.name) is not None]

    def __getitem__(self, name: str) -> Any:
        if not isinstance(name, str) or name not in self.keys():
            raise KeyError(f"{name!r}: this output holds {', '.join(self.keys())}")
        return getattr(self, name)


class Recorder:
    """Collects a :class:`GenerateOutput`'s parts while decoding, without a host read.

    ``scores``, ``logits``: keep each step's scores and the model's logits (float32
    copies); ``beams``: beam search also fills ``beam_indices`` and, with ``scores``,
    ``sequences_scores``.
    """

    def __init__(self, *, scores: bool, logits: bool) -> None:
        self.scores: list[Tensor] | None = [] if scores else None
        self.logits: list[Tensor] | None = [] if logits else None
        self.sequences_scores: Tensor | None = None
        self.beam_indices: Tensor | None = None

    def add_logits(self, logits: Tensor) -> None:
        """The model's logits of a step, before any rule: (B', V)."""
        if self.logits is not None:
            self.logits.append(logits.to(torch.float32, copy=True))

    def add_scores(self, scores: Tensor) -> None:
        """A step's scores after the rules (and the sampling filters): (B', V)."""
        if self.scores is not None:
            self.scores.append(scores.to(torch.float32, copy=True))

    def output(self, sequences: Tensor) -> GenerateOutput:
        """The output of a call that returns ``sequences``."""
        return GenerateOutput(
            sequences=sequences,
            scores=None if self.scores is None else tuple(self.scores),
            logits=None if self.logits is None else tuple(self.logits),
            sequences_scores=self.sequences_scores if self.scores is not None else None,
            beam_indices=self.beam_indices,
        )
