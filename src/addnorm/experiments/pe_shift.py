"""Seed posts 000 and 002: "PE(pos + k) can be expressed as a linear function of PE(pos)"
(PE_(pos+k, 2i) 를 PE_(pos, 2i) 의 linear function으로 표현 가능), by a block-diagonal matrix of
2x2 rotations, one per frequency; seed 002 adds, after the paper, that the model can then
easily learn to attend by relative positions.

``T(k)`` comes from :func:`addnorm.relative_shift_matrix`; the check runs in float64 over
every pair (pos, k) of a grid, so the error of the right matrix is rounding alone, and
``TOLERANCE`` sits far above rounding (~1e-13) and far below the error of a wrong matrix
(seed 000 prints one with both off-diagonal signs positive: its error is of order 1). The
dot product PE(p) . PE(p + k), a consequence of the rotation that SPEC states and the seeds
do not, is reported as its own reading: it must not depend on p to the same tolerance.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from addnorm.encodings import relative_shift_matrix, sinusoidal_encoding
from addnorm.experiments.outcome import Outcome, Reading, new_figure

NAME = "pe-shift"
CLAIM = (
    "PE(pos + k) is a linear function of PE(pos): one fixed matrix T(k), a 2x2 rotation per "
    "frequency, maps PE(pos) to PE(pos + k) for every pos."
)
DOT_READING = (
    "SPEC's addition, a consequence of the rotation: the dot product PE(p) . PE(p + k) "
    "depends on the offset k only."
)
SEEDS = ("000", "002")  # the seed posts the claim comes from
TOLERANCE = 1e-9  # float64 rounding of angles up to ~2000 rad is ~1e-13
# (k, d_model) -> the (D, D) float64 matrix claimed to map PE(pos) to PE(pos + k)
ShiftMatrix = Callable[[int, int], torch.Tensor]


def _library_shift(k: int, d_model: int) -> torch.Tensor:
    return relative_shift_matrix(k, d_model, dtype=torch.float64)


def shift_errors(d_model: int, n_positions: int, n_offsets: int,
                 shift_matrix: ShiftMatrix = _library_shift) -> torch.Tensor:
    """max over columns of |PE(pos + k) - T(k) PE(pos)|, for every (k, pos).

    Shapes:
        returns: (n_offsets, n_positions)
    """
    pos = torch.arange(n_positions, dtype=torch.float64)
    pe = sinusoidal_encoding(pos, d_model)  # (P, D)
    errors = torch.empty(n_offsets, n_positions, dtype=torch.float64)
    for k in range(n_offsets):
        shifted = sinusoidal_encoding(pos + k, d_model)  # (P, D)
        rotated = pe @ shift_matrix(k, d_model).T  # (P, D)
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


def run(*, quick: bool = False, shift_matrix: ShiftMatrix = _library_shift) -> Outcome:
    """``shift_matrix``: the T(k) under test (default the library's); the tests pass seed
    000's misprinted matrix, a world where the claim is false."""
    d_model, n_positions, n_offsets = (64, 128, 128) if quick else (512, 512, 512)
    errors = shift_errors(d_model, n_positions, n_offsets, shift_matrix)
    starts = [0, 7, 100, 1000] if quick else [0, 7, 100, 1000, 10000]
    dots = dot_products(d_model, starts, n_offsets)
    worst = errors.max().item()
    spread = (dots.max(0).values - dots.min(0).values).max().item()
    supported = worst < TOLERANCE
    dot = Reading(claim=DOT_READING, supported=spread < TOLERANCE,
                  headline=f"spread of PE(p).PE(p+k) over p in {starts}: {spread:.1e} "
                           f"(tolerance {TOLERANCE:g})")

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
        figure=fig, also=(dot,),
    )
