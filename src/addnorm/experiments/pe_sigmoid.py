"""Seed post 000, on why the Transformer's position code is made of sines and cosines: "Sigmoid
function: values between 0 and 1; for a long sequence, the differences between the positional
encoding values become negligible" (Sigmoid 함수 · 0 ~ 1 사이 값 · 긴 문장의 sequence 경우,
positional encoding value의 차이가 미미해지는 문제 발생), against "Sine & Cosine: they repeat
periodically between -1 and 1, so even for a long sequence the differences are not small" (-1 ~ 1
사이를 주기적으로 반복 ⇒ 긴 문장의 sequence 경우에도, value 차이 작지 않음).

The seed gives no formula for the sigmoid code; the one here is the sinusoidal code with the
sigmoid in the place of sine and cosine, one frequency per dimension over the same range:
``c(pos)_j = sigmoid(omega_j pos)``, ``omega_j = base^(-j / d)``, ``j < d`` (d = ``D_MODEL``,
base 10000, so omega runs from 1 down to about 1/base as the sinusoids' does).

What is measured, for sequences of ``LENGTHS`` positions: the mean distance between
neighbouring positions' codes, ``mean_{p < L-1} ||c(p + 1) - c(p)||``, and how it scales with
the length: the least-squares slope of its log against log L. The sinusoids' is the same at
every position (``PE(p + 1) = T(1) PE(p)``, a rotation), slope 0. A code whose every dimension
is monotone and stays within (0, 1) has ``sum_p |c_j(p + 1) - c_j(p)| < 1`` per dimension, so
its mean step is below ``d / (L - 1)`` (``MONOTONE_BOUND``): slope -1 once the bound binds.
"Negligible for a long sequence" is decided as "shrinks with the length": a slope of at most
``SHRINKS`` = -1/2, the midpoint on a log scale between not shrinking (0) and the bound's rate
(-1), an argument from the two possibilities and not from the answer. The claim holds when
the sigmoid code's steps shrink and the sinusoids' do not.

Another reading, tested beside it: that the range 0 to 1 is what makes the differences
vanish. The sinusoids moved into it, ``(1 + PE) / 2``, have values between 0 and 1 and steps
that do not shrink (half the sinusoids', at every position), so that reading does not hold:
what makes the sigmoid's vanish is that each of its dimensions is monotone and bounded, so it
saturates.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from addnorm.encodings import sinusoidal_encoding
from addnorm.experiments.outcome import Outcome, Reading, new_figure

NAME = "pe-sigmoid"
CLAIM = (
    "A sigmoid position code (values between 0 and 1) makes the differences between the codes "
    "of a long sequence's positions negligible; sine and cosine repeat between -1 and 1, so "
    "their differences stay large however long the sequence."
)
RANGE_READING = (
    "The range 0 to 1 is what makes the differences negligible: a code with values between 0 "
    "and 1 has them shrink for long sequences."
)
SEEDS = ("000",)  # the seed post the claim comes from
D_MODEL, BASE = 64, 10000.0
LENGTHS = (16, 64, 256, 1024, 4096)
SHRINKS = -0.5  # a slope of log(mean step) over log(length) at most this: the steps shrink
Code = Callable[[int], torch.Tensor]  # sequence length -> (P, D) codes of its positions


def sigmoid_code(n: int) -> torch.Tensor:
    """``sigmoid(omega_j pos)`` for positions ``0 .. n-1``, float64 (module docstring).

    Shapes: returns (n, D_MODEL)."""
    omega = BASE ** (-torch.arange(D_MODEL, dtype=torch.float64) / D_MODEL)  # (D,)
    return torch.sigmoid(torch.arange(n, dtype=torch.float64)[:, None] * omega)


def shifted_sinusoids(n: int) -> torch.Tensor:
    """The sinusoids moved into [0, 1]: ``(1 + PE) / 2``. Shapes: returns (n, D_MODEL)."""
    return (1 + sinusoidal_encoding(n, D_MODEL, base=BASE, dtype=torch.float64)) / 2


CODES: dict[str, Code] = {
    "sigmoid": sigmoid_code,
    "sinusoidal": lambda n: sinusoidal_encoding(n, D_MODEL, base=BASE, dtype=torch.float64),
}
READING_CODE = ("sinusoids in [0, 1]", shifted_sinusoids)


def steps(code: Code, n: int) -> torch.Tensor:
    """``||c(p + 1) - c(p)||`` for ``p < n - 1``. Shapes: returns (n - 1,)."""
    c = code(n)  # (n, D)
    return (c[1:] - c[:-1]).norm(dim=-1)


def monotone_bound(n: int, d: int = D_MODEL) -> float:
    """The largest mean step over ``n`` positions of a code whose ``d`` dimensions are each
    monotone within (0, 1): every dimension moves less than 1 in all, so the steps' L1 norms
    sum to under d, and their L2 norms too."""
    return d / (n - 1)


def slope(lengths: tuple[int, ...], values: list[float]) -> float:
    """The least-squares slope of ``ln(value)`` over ``ln(length)``."""
    xs = [math.log(n) for n in lengths]
    ys = [math.log(v) for v in values]
    x_mean, y_mean = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - x_mean) * (y - y_mean) for x, y in zip(xs, ys, strict=True)) / sum(
        (x - x_mean) ** 2 for x in xs)


def measure(code: Code) -> tuple[list[float], float]:
    """The mean step at every length of ``LENGTHS``, and its slope over them."""
    means = [steps(code, n).mean().item() for n in LENGTHS]
    return means, slope(LENGTHS, means)


def run(*, quick: bool = False, codes: dict[str, Code] | None = None) -> Outcome:
    """``codes``: replaces the "sigmoid" or "sinusoidal" code (the tests pass codes that make
    the claim false). The run is the same quick or not: it computes codes, nothing trains."""
    codes = CODES | (codes or {})
    reading_name, reading_code = READING_CODE
    measured = {name: measure(code) for name, code in (*codes.items(),
                                                       (reading_name, reading_code))}
    shrinks = {name: fitted <= SHRINKS for name, (_, fitted) in measured.items()}
    supported = shrinks["sigmoid"] and not shrinks["sinusoidal"]

    def line(name: str) -> str:
        means, fitted = measured[name]
        return f"{name} {means[0]:.3g} -> {means[-1]:.3g} (slope {fitted:+.2f})"

    headline = (f"mean distance between neighbouring positions' codes, {LENGTHS[0]} -> "
                f"{LENGTHS[-1]} positions: {line('sigmoid')}, {line('sinusoidal')}; shrinking "
                f"= slope <= {SHRINKS:g}; at {LENGTHS[-1]} positions the sigmoid's steps are "
                f"{measured['sigmoid'][0][-1] / measured['sinusoidal'][0][-1]:.2g} of the "
                "sinusoids'")
    numbers = {name: {"mean_step": dict(zip(map(str, LENGTHS), means, strict=True)),
                      "slope": fitted} for name, (means, fitted) in measured.items()}
    reading = Reading(
        claim=RANGE_READING, supported=shrinks[reading_name],
        headline=(f"{line(reading_name)}: values in [0, 1] whose steps do not shrink; the "
                  "sigmoid's vanish because each of its dimensions is monotone and saturates"),
    )
    return Outcome(
        name=NAME, claim=CLAIM, seeds=SEEDS, headline=headline, supported=supported,
        quick=quick,
        method=(f"Codes of d = {D_MODEL} dimensions, base {BASE:g}, in float64: sigmoid(omega_j "
                f"pos) with omega_j = base^(-j/d) (the seed names no formula; this is the "
                "sinusoidal code with the sigmoid in place of sine and cosine), the sinusoidal "
                "code, and (1 + PE) / 2 for the other reading. For L = "
                f"{', '.join(map(str, LENGTHS))}: the mean of ||c(p + 1) - c(p)|| over p < L - "
                "1 and the least-squares slope of its log over log L; shrinking = slope <= "
                f"{SHRINKS:g}, the midpoint between not shrinking (0) and the rate of the bound "
                "d / (L - 1) that every monotone code within (0, 1) obeys (-1)."),
        numbers={"codes": numbers, "lengths": list(LENGTHS), "shrinks_at_slope": SHRINKS,
                 "monotone_bound": {str(n): monotone_bound(n) for n in LENGTHS}},
        figure=_figure(codes, reading_name, reading_code, measured),
        also=(reading,),
    )


def _figure(codes: dict[str, Code], reading_name: str, reading_code: Code,
            measured: dict[str, tuple[list[float], float]]):
    fig = new_figure(14, 5.5)
    left, right = fig.subplots(1, 2)
    longest = LENGTHS[-1]
    everything = (*codes.items(), (reading_name, reading_code))
    for name, code in everything:
        positions = torch.arange(1, longest)
        left.plot(positions.numpy(), steps(code, longest).numpy(), label=name, linewidth=1.5)
        means, fitted = measured[name]
        right.plot(LENGTHS, means, "o-", label=f"{name} (slope {fitted:+.2f})")
    right.plot(LENGTHS, [monotone_bound(n) for n in LENGTHS], "k--", linewidth=1,
               label="bound of any monotone code within (0, 1): d / (L - 1)")
    left.set(title="||c(p + 1) - c(p)||: one step apart, at each position",
             xlabel="position p + 1", ylabel="distance (code units)", xscale="log",
             yscale="log")
    right.set(title="mean step over a sequence of L positions", xlabel="sequence length L",
              ylabel="mean ||c(p + 1) - c(p)||", xscale="log", yscale="log")
    for ax in (left, right):
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3, which="both")
    fig.suptitle(f"Sigmoid against sinusoidal position codes (d = {D_MODEL}, base {BASE:g})")
    return fig
