"""Classifier-free guidance (Ho & Salimans, 2022): its formula, once, and the two ways to use it.

    guided = uncond + s * (cond - uncond)        s = guidance scale; 1 gives cond, 0 uncond

- :func:`guided_prediction`: the formula alone (eq. 6 in noise form).
- :func:`classifier_free_guidance`: DiT's calling convention, a model output of 2B rows (the
  first B conditioned on their classes, the last B on the null class) guided on its first
  channels and returned for both halves (``DiT.forward_with_cfg``).
- :func:`guided_eps_fn`: any conditional model ``model(x, t, y)`` as an ``eps_fn(x, t)`` for
  :meth:`.Diffusion.sample`; a model that checks its labels once (:class:`ChecksLabels`, the
  DiT) is handed them checked, so a sampling step reads nothing back.

Shapes legend: B batch (of each half), C channels, ``...`` further data dims (H, W).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor

from addnorm.diffusion.sampling import EpsFn
from addnorm.utils.checks import check_float, check_int, check_tensor

__all__ = ["ChecksLabels", "classifier_free_guidance", "guided_eps_fn", "guided_prediction"]


def guided_prediction(cond: Tensor, uncond: Tensor, guidance_scale: float) -> Tensor:
    """``uncond + guidance_scale * (cond - uncond)``: the formula alone, on arguments its
    callers checked (a finite scale; two halves of one model output).

    Shapes:
        cond, uncond: (B, ...), the same shape
        returns: (B, ...)
    """
    return uncond + guidance_scale * (cond - uncond)


def classifier_free_guidance(out: Tensor, guidance_scale: float, *, n_guided: int) -> Tensor:
    """Guide the first ``n_guided`` channels of a [conditional; unconditional] batch; pass the
    others through from each half. The guided channels are returned in both halves, so a
    sampler can treat the doubled batch as one (DiT's calling convention; its reference code
    guides ``n_guided=3`` channels, addnorm's ``DiT.forward_with_cfg`` all C noise channels).

    ``guidance_scale`` may be any finite number (NaN and infinities are refused); whether the
    samples a sampler builds on it stay finite depends on the model, see
    :func:`guided_eps_fn`.

    Shapes:
        out: (2B, C_out, H, W), rows [conditional; unconditional]
        returns: (2B, C_out, H, W), guided channels equal in both halves
    """
    guidance_scale = check_float("guidance_scale", guidance_scale)
    guided, rest = out[:, :n_guided], out[:, n_guided:]  # (2B, n, H, W), (2B, C_out - n, H, W)
    cond, uncond = guided.chunk(2, dim=0)  # (B, n, H, W) each
    half = guided_prediction(cond, uncond, guidance_scale)  # (B, n, H, W)
    return torch.cat([torch.cat([half, half], dim=0), rest], dim=1)  # (2B, C_out, H, W)


@runtime_checkable
class ChecksLabels(Protocol):
    """A conditional model that checks its labels' values once for many calls: after
    ``labels = model.checked_labels(y)`` (one read back), ``model(x, t, labels)`` reads
    nothing back for them. :func:`guided_eps_fn` uses it, so that a sampling step does not
    wait for the device (the DiT: :meth:`addnorm.dit.DiT.checked_labels`)."""

    def checked_labels(self, y: Tensor) -> Any: ...


def guided_eps_fn(
    model: Callable[[Tensor, Tensor, Any], Tensor],
    y: Tensor,
    *,
    guidance_scale: float,
    null_class: int,
) -> EpsFn:
    """``model(x, t, y)`` guided towards labels ``y``, as an ``eps_fn(x, t)`` for sampling.

    Each call runs the model once on the batch doubled: rows ``0 .. B-1`` with labels ``y``
    (conditional), rows ``B .. 2B-1`` with ``null_class`` (unconditional), and returns
    ``uncond + guidance_scale * (cond - uncond)`` on every prediction channel (1: the
    conditional model; 0: the unconditional one). With learned variance (2C output channels)
    the variance channels are the conditional half's, unguided. DiT's ``forward_with_cfg``
    guides only the first 3 channels "for exact reproducibility"; this guides all C.

    The doubled labels are made here, once; a model with ``checked_labels``
    (:class:`ChecksLabels`) checks them here too (its one read back, raising for a label it
    has no row for), and each call passes them on checked.

    Args:
        model: called as ``model(x (2B, C, ...), t (2B,), y (2B,))``.
        y: (B,) integer class labels.
        guidance_scale: DiT's ``cfg_scale`` (4.0 in its sample.py, 1.5 for its FID runs);
            any finite number (NaN and infinities are refused).
        null_class: the label of "no class" (for DiT, ``n_classes``: its extra embedding row).

    Which scales keep a sample finite is the model's property, not the scale's: the guided
    output grows as ``s * |cond - uncond|``, the sampler feeds it back as x_t, and a network
    overflows once its inputs do (a DiT's LayerNorm squares them, and float32 squares
    overflow past about 1.8e19). Measured on float32 tiny DiTs, 5 to 50 DDIM or DDPM steps,
    by the largest ``|cond - uncond|``: 60 went non-finite from s = 1e17 to 4e17, 0.05 between
    1e20 and 1e22, 1e-12 (a barely trained model) at 1e31: about where ``s * |cond - uncond|``
    passes 1e19. A scale that is fine for one model overflows another, so no bound on ``s``
    alone is both safe and honest; :meth:`.Diffusion.sample` checks its result instead and
    raises FloatingPointError rather than return NaN.

    Shapes: the returned function maps x (B, C, ...), t (B,) to (B, C or 2C, ...).
    """
    if not callable(model):
        raise TypeError(f"model must be callable, got {type(model).__name__}")
    check_tensor("y", y, ndim=1)
    if y.is_floating_point() or y.is_complex() or y.dtype == torch.bool:
        raise TypeError(f"y must be an integer tensor of labels, got dtype {y.dtype}")
    guidance_scale = check_float("guidance_scale", guidance_scale)
    null_class = check_int("null_class", null_class, min_value=0)
    labels = torch.cat([y, torch.full_like(y, null_class)])  # (2B,)
    checked = model.checked_labels(labels) if isinstance(model, ChecksLabels) else None

    def guided(x: Tensor, t: Tensor) -> Tensor:
        if x.shape[0] != y.shape[0] or t.shape != (x.shape[0],):
            raise ValueError(
                f"x {tuple(x.shape)} and t {tuple(t.shape)} must have the batch of y ({y.shape[0]})"
            )
        both_labels = labels.to(x.device) if checked is None else checked
        both = model(torch.cat([x, x]), torch.cat([t, t]), both_labels)  # (2B, C', ...)
        if not isinstance(both, Tensor) or both.shape[0] != 2 * x.shape[0]:
            got = tuple(both.shape) if isinstance(both, Tensor) else type(both).__name__
            raise ValueError(f"model must return a batch of {2 * x.shape[0]} rows, got {got}")
        cond, uncond = both.chunk(2)  # 2 x (B, C', ...), C' = C or 2C
        n_channels = x.shape[1]
        pred_cond, pred_uncond = cond[:, :n_channels], uncond[:, :n_channels]
        guided_pred = guided_prediction(pred_cond, pred_uncond, guidance_scale)  # (B, C, ...)
        if cond.shape[1] == n_channels:
            return guided_pred
        return torch.cat([guided_pred, cond[:, n_channels:]], dim=1)  # (B, 2C, ...)

    return guided
