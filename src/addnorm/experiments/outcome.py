"""What every experiment returns, and how it is written: ``figure.png`` and ``result.json``.

An experiment is a module with ``NAME``, ``CLAIM`` (the SPEC claim in one sentence) and
``run(*, quick=False) -> Outcome``. ``supported`` is decided by the numbers the run produced,
never set by hand; the page and the JSON say plainly when a claim did not hold.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["Outcome", "new_figure", "write_outcome"]

DPI = 100


@dataclass
class Outcome:
    """One experiment's result.

    Attributes:
        name: the experiment's CLI name (``pe-shift``).
        claim: the claim tested, in one sentence.
        method: what was run, in a sentence or two (sizes, seeds, steps).
        headline: what came out, in one line with the key numbers.
        supported: whether the numbers bear the claim out.
        numbers: the headline numbers (JSON-serialisable).
        figure: the figure, drawn on a bare Agg canvas.
        quick: whether this was the reduced run.
    """

    name: str
    claim: str
    method: str
    headline: str
    supported: bool
    numbers: dict[str, Any]
    figure: Figure = field(repr=False)
    quick: bool = False

    def to_dict(self) -> dict[str, Any]:
        """The JSON record (everything but the figure)."""
        return {
            "name": self.name, "claim": self.claim, "method": self.method,
            "headline": self.headline, "supported": self.supported, "quick": self.quick,
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
