"""The warning a run gets when its time cap, not its step budget, ended training early.

``max_minutes`` keeps the demo and ``train`` within a wall-clock budget; on a loaded or slow
machine it can stop training after a small share of ``max_steps``, and the results printed
after it are then those of an undertrained model. :func:`warn_if_cut_short` says so, on
stderr, with how many steps ran, whenever fewer than ``UNDERTRAINED_SHARE`` of them did.
"""

from __future__ import annotations

import sys

__all__ = ["UNDERTRAINED_SHARE", "time_cap_warning", "warn_if_cut_short"]

# A run the time cap stopped before this share of max_steps is reported as undertrained.
UNDERTRAINED_SHARE = 0.5


def time_cap_warning(
    *, step: int, max_steps: int, max_minutes: float | None, stopped_by: str, flag: str
) -> str | None:
    """The warning for a run that ended at ``step`` of ``max_steps`` because of
    ``stopped_by``, or None when there is nothing to warn about: the step budget ended it,
    or the time cap did after at least ``UNDERTRAINED_SHARE`` of the steps. ``flag`` names the
    option that raises the cap (``--max-minutes``)."""
    if stopped_by != "max_minutes" or step >= UNDERTRAINED_SHARE * max_steps:
        return None
    cap = "time cap" if max_minutes is None else f"{max_minutes:g}-minute time cap"
    return (
        f"warning: the {cap} stopped training after {step} of {max_steps} steps "
        f"({100 * step / max_steps:.0f}%), so the model is undertrained and the results below "
        "are not what a full run gives (the machine may be slower or busier than the budget "
        f"assumes); give it more time with {flag}, or fewer steps with --max-steps"
    )


def warn_if_cut_short(summary, train_cfg, *, prefix: str, flag: str = "--max-minutes") -> None:
    """Print :func:`time_cap_warning` for a run's ``RunSummary`` and ``TrainConfig`` on stderr
    (after flushing stdout, so that it follows what was printed there), as
    ``PREFIX: warning: ...``."""
    warning = time_cap_warning(
        step=summary.step, max_steps=train_cfg.max_steps, max_minutes=train_cfg.max_minutes,
        stopped_by=summary.stopped_by, flag=flag,
    )
    if warning is not None:
        sys.stdout.flush()
        print(f"{prefix}: {warning}", file=sys.stderr, flush=True)
