"""What every experiment returns, and how it is written: ``figure.png`` and ``result.json``.

An experiment is a module with ``NAME``, ``CLAIM`` (the claim in one sentence), ``SEEDS``
(the seed documents it comes from: five blog posts on the Transformer, numbered 000 to 004)
and ``run(*, quick=False) -> Outcome``. The verdict is decided by the numbers the run
produced, never set by hand: ``supported`` is True (the numbers bear the claim out), False
(they contradict it) or None, *undecided*: the run's own evidence cannot decide it (a quick
run's few training steps learn nothing to compare), and ``undecided_because`` says why. The
page and the JSON say plainly when a claim did not hold and when a run could not tell.

Where a run tests a claim under several conditions (learning rates) and decides each on its
own, each is a :class:`Condition` in ``Outcome.conditions`` and the verdict is their
combination (:func:`combine`): *supported* where every decided condition bears the claim out,
*not supported* where none does, and *mixed* where some do and some do not. A mixed outcome
has ``supported`` False (the claim does not hold across the conditions tested), so a reader of
``supported`` alone reads it as not supported; ``verdict`` says ``"mixed"`` and the conditions
say where it held. Where a verdict rests on a setting of the decision rule (a threshold), a
:class:`Sensitivity` gives the verdicts the same runs yield at other values of it.

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

__all__ = [
    "MIXED", "VERDICTS", "VERDICT_NAMES", "Condition", "Outcome", "Reading", "Sensitivity",
    "combine", "new_figure", "verdict_of", "write_outcome",
]

DPI = 100
# ``Outcome.verdict`` by ``supported``, for an outcome without conditions that disagree.
VERDICTS = {True: "supported", False: "not supported", None: "undecided"}
# The verdict of conditions that disagree: some bear the claim out, some contradict it.
MIXED = "mixed"
# Every verdict, in the order the summaries count them.
VERDICT_NAMES = ("supported", "not supported", MIXED, "undecided")


def _check_verdict(supported: object, undecided_because: str,
                   conditions: tuple[Condition, ...] = ()) -> None:
    if not (supported is None or isinstance(supported, bool)):
        raise TypeError(f"supported must be True, False or None, got {supported!r}")
    if (supported is None) != bool(undecided_because):
        raise ValueError(
            "undecided_because must be given exactly when supported is None (undecided), "
            f"got supported={supported!r}, undecided_because={undecided_because!r}"
        )
    if conditions and supported is not combine(conditions)[0]:
        raise ValueError(
            f"supported={supported!r} is not what the conditions decide "
            f"({', '.join(f'{c.name}: {c.verdict}' for c in conditions)}: "
            f"{combine(conditions)[0]!r}); use combine(conditions)"
        )


def _verdict(supported: bool | None, conditions: tuple[Condition, ...]) -> str:
    if supported is False and any(c.supported for c in conditions):
        return MIXED
    return VERDICTS[supported]


@dataclass(frozen=True)
class Condition:
    """The claim under one condition of the run (a learning rate), decided on its own.

    Attributes:
        name: the condition, in a few words (``"lr 0.1"``).
        supported, undecided_because: its verdict, as in :class:`Outcome`.
        headline: what came out under it, in one line.
    """

    name: str
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
        return {"name": self.name, "verdict": self.verdict, "supported": self.supported,
                "undecided_because": self.undecided_because, "headline": self.headline}


def combine(conditions: tuple[Condition, ...]) -> tuple[bool | None, str]:
    """``(supported, undecided_because)`` over ``conditions``: None (undecided, with their
    reasons) when none is decided; else True when every decided one bears the claim out, and
    False when one does not (the verdict is *mixed* when another one does)."""
    if not conditions:
        raise ValueError("combine needs at least one condition")
    decided = [c.supported for c in conditions if c.supported is not None]
    if not decided:
        return None, "; ".join(f"{c.name}: {c.undecided_because}" for c in conditions)
    return all(decided), ""


def verdict_of(conditions: tuple[Condition, ...]) -> str:
    """The verdict :func:`combine` gives ``conditions``: ``"mixed"`` where they disagree."""
    return _verdict(combine(conditions)[0], conditions)


@dataclass(frozen=True)
class Sensitivity:
    """The verdicts the same runs give as one setting of the decision rule varies.

    Attributes:
        setting: what varies, in words (e.g. a threshold and what it stands for).
        values: the values tried, the rule's own among them.
        used: the value the outcome's verdicts use.
        rows: ``(label, verdicts)``, one verdict per value: the seed's claim first, then each
            reading in ``Outcome.also``, in order.
        notes: what each value changes (e.g. which conditions it lets be compared), one per
            value, or none.
    """

    setting: str
    values: tuple[float, ...]
    used: float
    rows: tuple[tuple[str, tuple[str, ...]], ...]
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.used not in self.values:
            raise ValueError(f"used ({self.used!r}) must be one of values {self.values!r}")
        for label, verdicts in self.rows:
            if len(verdicts) != len(self.values) or not set(verdicts) <= set(VERDICT_NAMES):
                raise ValueError(f"row {label!r} needs one verdict of {VERDICT_NAMES} per "
                                 f"value ({len(self.values)}), got {verdicts!r}")
        if self.notes and len(self.notes) != len(self.values):
            raise ValueError(f"notes needs one entry per value ({len(self.values)}), got "
                             f"{len(self.notes)}")

    def verdicts_used(self) -> list[str]:
        """Each row's verdict at ``used``."""
        i = self.values.index(self.used)
        return [verdicts[i] for _, verdicts in self.rows]

    def to_dict(self) -> dict[str, Any]:
        return {"setting": self.setting, "values": list(self.values), "used": self.used,
                "rows": [{"label": label, "verdicts": list(verdicts)}
                         for label, verdicts in self.rows],
                "notes": list(self.notes)}


@dataclass(frozen=True)
class Reading:
    """Another reading of an experiment's claim, tested by the same run, with its own verdict.

    Attributes:
        claim: the reading, in one sentence (e.g. a restatement stronger than the seed's).
        supported, undecided_because: its verdict, as in :class:`Outcome`.
        headline: what came out for it, in one line.
        conditions: its verdict under each condition, as in :class:`Outcome`.
    """

    claim: str
    supported: bool | None
    headline: str
    undecided_because: str = ""
    conditions: tuple[Condition, ...] = ()

    def __post_init__(self) -> None:
        _check_verdict(self.supported, self.undecided_because, self.conditions)

    @property
    def verdict(self) -> str:
        """``"supported"``, ``"not supported"``, ``"mixed"`` or ``"undecided"``."""
        return _verdict(self.supported, self.conditions)

    def to_dict(self) -> dict[str, Any]:
        return {"claim": self.claim, "verdict": self.verdict, "supported": self.supported,
                "undecided_because": self.undecided_because, "headline": self.headline,
                "conditions": [c.to_dict() for c in self.conditions]}


@dataclass
class Outcome:
    """One experiment's result.

    Attributes:
        name: the experiment's CLI name (``pe-shift``).
        claim: the claim tested, in one sentence.
        method: what was run, in a sentence or two (sizes, seeds, steps).
        headline: what came out, in one line with the key numbers.
        supported: True if the numbers bear the claim out, False if they contradict it, None
            if the run cannot decide it (then ``undecided_because`` is required). With
            ``conditions``, what :func:`combine` makes of them.
        numbers: the headline numbers (JSON-serialisable).
        figure: the figure, drawn on a bare Agg canvas.
        quick: whether this was the reduced run.
        seeds: the seed documents the claim comes from (``("001", "003")``).
        undecided_because: why the run cannot decide the claim; empty when it can.
        also: other readings of the claim the run tests, each with its own verdict.
        conditions: the claim decided under each condition the run tests it in (learning
            rates), where they are decided apart; empty otherwise.
        sensitivity: the verdicts (the claim's, then each reading's) the same runs give at
            other values of a setting of the decision rule; None where there is none to vary.
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
    conditions: tuple[Condition, ...] = ()
    sensitivity: Sensitivity | None = None

    def __post_init__(self) -> None:
        _check_verdict(self.supported, self.undecided_because, self.conditions)
        if self.sensitivity is not None:
            decided = [self.verdict, *(reading.verdict for reading in self.also)]
            if self.sensitivity.verdicts_used() != decided:
                raise ValueError(
                    f"the sensitivity's verdicts at the value used "
                    f"({self.sensitivity.verdicts_used()}) must be the outcome's and its "
                    f"readings' ({decided})"
                )

    @property
    def verdict(self) -> str:
        """``"supported"``, ``"not supported"``, ``"mixed"`` or ``"undecided"``."""
        return _verdict(self.supported, self.conditions)

    def to_dict(self) -> dict[str, Any]:
        """The JSON record (everything but the figure); ``supported`` is null when undecided
        and false when mixed; ``conditions`` and ``sensitivity`` are ``[]`` and null where
        the run has none."""
        return {
            "name": self.name, "claim": self.claim, "seeds": list(self.seeds),
            "method": self.method, "headline": self.headline, "verdict": self.verdict,
            "supported": self.supported, "undecided_because": self.undecided_because,
            "quick": self.quick, "also": [reading.to_dict() for reading in self.also],
            "conditions": [c.to_dict() for c in self.conditions],
            "sensitivity": None if self.sensitivity is None else self.sensitivity.to_dict(),
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
