"""The GPU suite's correctness tolerances, each with where it comes from.

Two correct implementations of one model, same weights and inputs, differ only by rounding
(the order of operations). In float32 (u = 2**-24) a reduction over n terms in blocked or
pairwise order errs by about ``sqrt(n) u`` relative; the suite's models stack up to 28 layers
of a few such reductions with n up to 4608, which leaves their outputs within about 1e-5 of
each other relative to the outputs' own scale. In bf16 (u = 2**-8) no fixed bound is
meaningful for a deep model, so an addnorm result may be at most twice as far from the
float32 result as the reference's own bf16 result is, with one bf16 rounding as the floor.
A wrong weight, mask or formula moves results by orders of magnitude more than either.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["FP32_LOSS", "FP32_OUTPUT", "bf16_bound", "relative_error"]

# float32 outputs (logits, hidden states, noise predictions) of the same weights, as
# max |a - b| / max |b|: ~1e-5 (module docstring), margin 10.
FP32_OUTPUT = 1e-4

# float32 losses (a mean of log-softmaxes or squared errors of outputs within FP32_OUTPUT of
# each other, at most ~11 = ln 50257): the same relative bound, absolute.
FP32_LOSS = 1e-4 * 11

# bf16's unit roundoff: one rounding of a value x costs at most u |x|.
BF16_U = 2**-8


def bf16_bound(reference_errors: Sequence[float], scale: float) -> float:
    """How far a bf16 result may be from the float32 result: twice the largest error of the
    references' bf16 results, never less than one bf16 rounding of ``scale`` (the float32
    result's magnitude, at least 1)."""
    return max(2 * max(reference_errors, default=0.0), BF16_U * max(abs(scale), 1.0))


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """max |got - want| / max |want| (compared in float32)."""
    got, want = got.float(), want.float()
    return ((got - want).abs().max() / want.abs().max().clamp_min(1e-30)).item()
