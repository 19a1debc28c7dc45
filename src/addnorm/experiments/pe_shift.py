"""Claim 2 (seed posts 000 and 002): PE(pos + k) = T(k) PE(pos) for all pos and k, and
PE(p) . PE(p + k) depends on k only.

``T(k)`` comes from :func:`addnorm.relative_shift_matrix`; the check runs in float64 over
every pair (pos, k) of a grid, so the error is rounding alone.
"""

from __future__ import annotations

import torch

from addnorm.encodings import relative_shift_matrix, sinusoidal_encoding
from addnorm.experiments.outcome import Outcome, new_figure

NAME = "pe-shift"
CLAIM = (
    "A fixed matrix T(k) maps PE(pos) to PE(pos + k) for every pos, to float precision, and "
    "PE(p) . PE(p + k) depends on the offset k only."
)
SEEDS = ("000", "002")  # the seed posts the claim comes from
TOLERANCE = 1e-9  # float64 rounding of angles up to ~2000 rad is ~1e-13


def shift_errors(d_model: int, n_positions: int, n_offsets: int) -> torch.Tensor:
    """max over columns of |PE(pos + k) - T(k) PE(pos)|, for every (k, pos).

    Shapes:
        returns: (n_offsets, n_positions)
    """
    pos = torch.arange(n_positions, dtype=torch.float64)
    pe = sinusoidal_encoding(pos, d_model)  # (P, D)
    errors = torch.empty(n_offsets, n_positions, dtype=torch.float64)
    for k in range(n_offsets):
        shifted = sinusoidal_encoding(pos + k, d_model)  # (P, D)
        rotated = pe @ relative_shift_matrix(k, d_model, dtype=torch.float64).T  # (P, D)
        errors[k] = (shifted - rotated).abs().amax(dim=-1)
    return errors


def dot_products(d_model: int, starts: list[int], n_offsets: int) -> torch.Tensor:
    """PE(p) . PE(p + k) for each start p and offset k.

    Shapes:
        returns: (len(starts), n_offsets)
    """
    k = torch.arange(n_offsets, dtype=torch.float64)
    rows = []
    for p in starts:
        pe = sinusoidal_encoding(torch.full_like(k, float(p)), d_model)  # (K, D)
        rows.append((pe * sinusoidal_encoding(p + k, d_model)).sum(-1))  # (K,)
    return torch.stack(rows)


def run(*, quick: bool = False) -> Outcome:
    d_model, n_positions, n_offsets = (64, 128, 128) if quick else (512, 512, 512)
    errors = shift_errors(d_model, n_positions, n_offsets)
    starts = [0, 7, 100, 1000] if quick else [0, 7, 100, 1000, 10000]
    dots = dot_products(d_model, starts, n_offsets)
    worst = errors.max().item()
    spread = (dots.max(0).values - dots.min(0).values).max().item()
    supported = worst < TOLERANCE and spread < TOLERANCE

    fig = new_figure(13, 5)
    left, right = fig.subplots(1, 2)
    image = left.imshow(torch.log10(errors + 1e-18).numpy(), aspect="auto", origin="lower",
                        cmap="viridis", interpolation="nearest")
    fig.colorbar(image, ax=left, label="log10 max |PE(pos+k) - T(k) PE(pos)|")
    left.set(title=f"Shift identity error, d_model = {d_model}, float64",
             xlabel="position pos (token index)", ylabel="offset k (tokens)")
    for row, p in zip(dots, starts, strict=True):
        right.plot(row.numpy(), label=f"p = {p}", linewidth=3 if p == 0 else 1.5,
                   linestyle="-" if p == 0 else "--")
    right.set(title="PE(p) . PE(p + k): the curves for every p coincide",
              xlabel="offset k (tokens)", ylabel="dot product (unitless)")
    right.legend(title="start position")
    right.grid(alpha=0.3)
    headline = (
        f"max |PE(pos+k) - T(k)PE(pos)| = {worst:.1e} over {n_positions} positions x "
        f"{n_offsets} offsets (d_model={d_model}); spread of PE(p).PE(p+k) over p = {spread:.1e}"
    )
    return Outcome(
        name=NAME, claim=CLAIM, seeds=SEEDS, headline=headline, supported=supported, quick=quick,
        method=(f"float64 sinusoidal_encoding (base 10000, d_model {d_model}) for every pos < "
                f"{n_positions} and k < {n_offsets}, against relative_shift_matrix(k); dot "
                f"products from starts p in {starts}. Tolerance {TOLERANCE:g}."),
        numbers={"d_model": d_model, "max_shift_error": worst, "dot_product_spread": spread,
                 "tolerance": TOLERANCE},
        figure=fig,
    )
