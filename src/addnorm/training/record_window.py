"""What a metrics record covers: the steps since the record before.

A record (a line of ``metrics.jsonl``, a callback's ``on_log``) holds ``step``, ``loss`` (the
mean of the steps' losses since the record before), ``lr`` (the step's), ``grad_norm`` (the
global norm of the step's gradients before clipping), ``tokens_per_s`` (the targets since the
record before, over the training seconds since then), ``elapsed_s`` (the training time of every
invocation so far) and a probe's ``probe_*`` scores.

The losses' running sum and count go into every checkpoint (``loss_window``, read back by
:func:`~addnorm.training.metrics.loss_window_from_state`), so that a resumed run's records
equal the uninterrupted run's; the tokens and seconds start again with each ``fit``.
"""

from __future__ import annotations

__all__ = ["RecordWindow"]


class RecordWindow:
    """The steps since the last record: their losses (``losses``: sum and count, which
    checkpoints keep), targets and training seconds."""

    def __init__(self) -> None:
        self.losses: tuple[float, int] = (0.0, 0)
        self._tokens, self._since = 0, 0.0

    def start(self) -> None:
        """``fit`` begins: targets and seconds count from here (the losses go on)."""
        self._tokens, self._since = 0, 0.0

    def add(self, loss: float, tokens: int, *, closes: bool) -> float:
        """A step ended with ``loss`` over ``tokens`` targets; returns the mean loss of the
        window with it. With ``closes`` (a record is due at this step) the losses start
        again: a record closes them at its step whether it is written or not, so a resumed
        run's windows match the uninterrupted run's."""
        self._tokens += tokens
        total, steps = self.losses[0] + loss, self.losses[1] + 1
        self.losses = (0.0, 0) if closes else (total, steps)
        return total / steps

    def record(
        self,
        *,
        step: int,
        loss: float,
        lr: float,
        grad_norm: float,
        now: float,
        elapsed_before: float,
        scores: dict[str, float],
    ) -> dict[str, float]:
        """The record of ``step`` (see the module docstring), ``now`` seconds into this
        ``fit``'s training time, after ``elapsed_before`` seconds of earlier invocations."""
        return {
            "step": step,
            "loss": loss,
            "lr": lr,
            "grad_norm": grad_norm,
            "tokens_per_s": self._tokens / max(now - self._since, 1e-9),
            "elapsed_s": elapsed_before + now,
            **scores,
        }

    def restart(self, now: float) -> None:
        """A record was handed on at ``now``: the targets and seconds count from here."""
        self._tokens, self._since = 0, now
