"""What a run says when its time cap, not its plan, ended training, and what it says of a
plan its budget changed.

A run with ``max_minutes`` is planned to its budget (before it starts, from a measured
warm-up; and once more in training if the machine turns out slower, or faster for a run whose
steps fill its budget:
:mod:`addnorm.training.budget`), so it ends at its planned steps with its schedule complete.
The time cap stays as the last resort: on a machine that slows down further it can still stop
training early, and the results printed after it are then those of a model whose schedule did
not finish. :func:`warn_if_cut_short` says so, on stderr, with how many of the planned steps
ran: a warning whenever fewer than ``UNDERTRAINED_SHARE`` of them did, a note otherwise.
:func:`replan_text` words a re-plan made in training.
"""

from __future__ import annotations

import sys

__all__ = ["UNDERTRAINED_SHARE", "replan_text", "time_cap_warning", "warn_if_cut_short"]

# A run the time cap stopped before this share of max_steps is reported as undertrained.
UNDERTRAINED_SHARE = 0.5


def time_cap_warning(
    *, step: int, max_steps: int, max_minutes: float | None, stopped_by: str, flag: str
) -> str | None:
    """The warning for a run that ended at ``step`` of ``max_steps`` (planned) because of
    ``stopped_by``, or None when there is nothing to warn about: the step budget ended it,
    or the time cap did after at least ``UNDERTRAINED_SHARE`` of the steps (then
    :func:`time_cap_note` has a word for it). ``flag`` names the option that raises the cap
    (``--max-minutes``)."""
    if stopped_by != "max_minutes" or step >= UNDERTRAINED_SHARE * max_steps:
        return None
    cap = "time cap" if max_minutes is None else f"{max_minutes:g}-minute time cap"
    return (
        f"warning: the {cap} stopped training after {step} of {max_steps} steps "
        f"({100 * step / max_steps:.0f}%), so the model is undertrained and the results below "
        "are not what a full run gives (the machine may be slower or busier than the budget "
        f"assumes); give it more time with {flag}, or fewer steps with --max-steps"
    )


def time_cap_note(*, step: int, max_steps: int, stopped_by: str, flag: str) -> str | None:
    """A note for a run the time cap stopped after ``UNDERTRAINED_SHARE`` of its planned
    ``max_steps`` or more (its schedule's last steps, at the lowest learning rates, did not
    run); None for any other."""
    if stopped_by != "max_minutes" or step < UNDERTRAINED_SHARE * max_steps:
        return None
    return (f"note: the time cap stopped training at step {step} of the {max_steps} planned "
            "(the machine slowed down after the run was planned), before the end of its "
            f"learning-rate schedule; {flag} gives it more time")


def replan_text(replan, budget_flag: str = "--max-minutes") -> str:
    """One line for a run re-planned in training (a ``Replan``), down or up."""
    if replan.direction == "up":
        return (f"re-planned up after step {replan.at_step}: {replan.step_s:.3g} s a step "
                f"here, faster than planned, so {replan.steps} steps, not the "
                f"{replan.planned_steps} planned, fill the {replan.budget_s / 60:g}-minute "
                f"budget ({budget_flag}); the warm-up ends at step {replan.warmup} and the "
                "schedule with the last step")
    return (f"re-planned after step {replan.at_step}: {replan.step_s:.3g} s a step here, so "
            f"{replan.steps} of the {replan.planned_steps} planned steps fit the "
            f"{replan.budget_s / 60:g}-minute budget ({budget_flag}); the warm-up ends at "
            f"step {replan.warmup} and the schedule with the last step")


def warn_if_cut_short(summary, train_cfg, *, prefix: str, flag: str = "--max-minutes") -> None:
    """Print :func:`time_cap_warning` (or :func:`time_cap_note`) for a run's ``RunSummary``
    and ``TrainConfig`` on stderr (after flushing stdout, so that it follows what was printed
    there), as ``PREFIX: warning: ...``; the planned steps are the re-plan's when the run was
    re-planned in training, else ``train_cfg.max_steps``."""
    planned = train_cfg.max_steps if summary.replan is None else summary.replan.steps
    warning = time_cap_warning(
        step=summary.step, max_steps=planned, max_minutes=train_cfg.max_minutes,
        stopped_by=summary.stopped_by, flag=flag,
    ) or time_cap_note(step=summary.step, max_steps=planned, stopped_by=summary.stopped_by,
                       flag=flag)
    if warning is not None:
        sys.stdout.flush()
        print(f"{prefix}: {warning}", file=sys.stderr, flush=True)
