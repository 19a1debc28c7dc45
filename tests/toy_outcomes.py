"""A toy experiment's outcome (a figure, a claim with markup to escape, a NaN and an infinity
among its numbers) and its conditions, shared by the tests of writing an outcome, the page and
verdicts.json."""

import math

from addnorm.experiments import Outcome
from addnorm.experiments.outcome import Condition, new_figure

PNG = b"\x89PNG\r\n\x1a\n"


def toy_outcome(supported: bool | None, because: str = "") -> Outcome:
    fig = new_figure(2, 2)
    fig.subplots().plot([0, 1], [1, 0])
    return Outcome(name="toy", claim="c <b>", method="m", headline="h", supported=supported,
                   numbers={"loss": [1.0, math.nan], "inf": math.inf}, figure=fig,
                   seeds=("001", "003"), undecided_because=because)


def toy_conditions(*supported: bool | None) -> tuple[Condition, ...]:
    return tuple(Condition(name=f"lr {i}", supported=s, headline=f"h{i} <x>",
                           undecided_because="" if s is not None else f"why {i}")
                 for i, s in enumerate(supported))
