"""What every experiment returns, and how it is written: ``figure.png`` and ``result.json``.

An experiment is a module with ``NAME``, ``CLAIM`` (the claim in one sentence), ``SEEDS``
(the seed documents it comes from: five blog posts on the Transformer, numbered 000 to 004)
and ``run(*, quick=False) -> Outcome``. The verdict is decided by the numbers the run
produced, never set by hand: ``supported`` is True (the numbers bear the claim out), False
(they contradict it) or None, *undecided*: the run's own evidence cannot decide it (a quick
run's few training steps learn nothing to compare), and ``undecided_because`` says why. The
page and the JSON say plainly when a claim did not hold and when a run could not tell.

``CLAIM`` states the claim as the seed post states it. Where the project also tests another
reading (a stronger one, as a restatement may claim more than the seed; or what would make a
claim true), that reading is an :class:`Reading` in ``Outcome.also``, with its own verdict,
shown beside the main one and never folded into it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["VERDICTS", "Outcome", "Reading", "new_figure", "write_outcome"]

DPI = 100
# ``Outcome.verdict`` by ``supported``.
VERDICTS = {True: "supported", False: "not supported", None: "undecided"}


def _check_verdict(supported: object, undecided_because: str) -> None:
    if not (supported is None or isinstance(supported, bool)):
        raise TypeError(f"supported must be True, False or None, got {supported!r}")
    if (supported is None) != bool(undecided_because):
        raise ValueError(
            "undecided_because must be given exactly when supported is None (undecided), "
            f"got supported={supported!r}, undecided_because={undecided_because!r}"
        )


@dataclass(frozen=True)
class Reading:
    """Another reading of an experiment's claim, tested by the same run, with its own verdict.

    Attributes:
        claim: the reading, in one sentence (e.g. a restatement stronger than the seed's).
        supported, undecided_because: its verdict, as in :class:`Outcome`.
        headline: what came out for it, in one line.
    """

    claim: str
    supported: bool | None
    headline: str
    undecided_because: str = ""

    def __post_init__(self) -> None:
        _check_verdict(self.supported, self.undecided_because)

    @property
    def verdict(self) -> str:
        """``"supported"``, ``"not supported"`` or ``"undecided"``."""
        return VERDICTS[self.supported]

    def to_dict(self) -> dict[str, Any]:
        return {"claim": self.claim, "verdict": self.verdict, "supported": self.supported,
                "undecided_because": self.undecided_because, "headline": self.headline}


@dataclass
class Outcome:
    """One experiment's result.

    Attributes:
        name: the experiment's CLI name (``pe-shift``).
        claim: the claim tested, in one sentence.
        method: what was run, in a sentence or two (sizes, seeds, steps).
        headline: what came out, in one line with the key numbers.
        supported: True if the numbers bear the claim out, False if they contradict it, None
            if the run cannot decide it (then ``undecided_because`` is required).
        numbers: the headline numbers (JSON-serialisable).
        figure: the figure, drawn on a bare Agg canvas.
        quick: whether this was the reduced run.
        seeds: the seed documents the claim comes from (``("001", "003")``).
        undecided_because: why the run cannot decide the claim; empty when it can.
        also: other readings of the claim the run tests, each with its own verdict.
    """

    name: str
    claim: str
    method: str
    headline: str
    supported: bool | None
    numbers: dict[str, Any]
    figure: Figure = field(repr=False)
    quick: bool = False
    seeds: tuple[str, ...] = ()
    undecided_because: str = ""
    also: tuple[Reading, ...] = ()

    def __post_init__(self) -> None:
        _check_verdict(self.supported, self.undecided_because)

    @property
    def verdict(self) -> str:
        """``"supported"``, ``"not supported"`` or ``"undecided"``."""
        return VERDICTS[self.supported]

    def to_dict(self) -> dict[str, Any]:
        """The JSON record (everything but the figure); ``supported`` is null when undecided."""
        return {
            "name": self.name, "claim": self.claim, "seeds": list(self.seeds),
            "method": self.method, "headline": self.headline, "verdict": self.verdict,
            "supported": self.supported, "undecided_because": self.undecided_because,
            "quick": self.quick, "also": [reading.to_dict() for reading in self.also],
            "numbers": self.numbers,
        }


def new_figure(width: float, height: float) -> Figure:
    """A bare figure with its own Agg canvas: no global matplotlib backend is switched."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def write_outcome(outcome: Outcome, out_dir: Path) -> Path:
    """Write ``out_dir/NAME/figure.png`` and ``result.json``; return that folder."""
    folder = out_dir / outcome.name
    folder.mkdir(parents=True, exist_ok=True)
    outcome.figure.savefig(folder / "figure.png", dpi=DPI)
    text = json.dumps(_finite(outcome.to_dict()), indent=2, allow_nan=False)
    (folder / "result.json").write_text(text + "\n")
    return folder


def _finite(value: Any) -> Any:
    """NaN and infinities (a diverged loss) become null, so the file stays strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value
