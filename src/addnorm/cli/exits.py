"""Exit codes of the ``addnorm`` command, and SIGTERM turned into one (143).

``train`` and ``demo`` stop on SIGTERM: inside the trainer's loop after a checkpoint of the
current step (the trainer handles it), elsewhere at once through :func:`exit_on_sigterm`,
leaving the run's lock and files in order.
"""

from __future__ import annotations

import functools
import signal
import sys
import threading
from collections.abc import Callable

__all__ = [
    "SIGNAL_STOPS",
    "StdoutClosedError",
    "EXIT_BROKEN_PIPE",
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_TERMINATED",
    "EXIT_USAGE",
    "exit_on_sigterm",
    "report_signal_stop",
    "require_stdout",
]

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED, EXIT_BROKEN_PIPE = 0, 1, 2, 130, 141
EXIT_TERMINATED = 143  # 128 + SIGTERM, as a shell reports a process SIGTERM ended
# How a run stopped by a signal ends (a checkpoint was written): by its stopped_by, a word for
# the message and the exit code.
SIGNAL_STOPS = {
    "interrupt": ("interrupted", EXIT_INTERRUPTED),
    "terminate": ("terminated", EXIT_TERMINATED),
}


class StdoutClosedError(OSError):
    """Standard output was closed before the command began (``addnorm translate ... >&-``):
    an ``OSError``, so the command ends with one line and exit 1, as for a file it cannot
    write."""


def require_stdout(what: str) -> None:
    """Raise :class:`StdoutClosedError` if there is no standard output to print ``what`` to
    (Python sets ``sys.stdout`` to None when the shell started it with descriptor 1 closed);
    called before any work by the commands whose output is their result."""
    stream = sys.stdout
    if stream is None or getattr(stream, "closed", False):
        raise StdoutClosedError(
            f"stdout is closed, so {what} would be lost; run the command with its output "
            "open (e.g. > FILE)"
        )


class _Terminated(BaseException):
    """SIGTERM outside the trainer's loop (which handles it itself); a BaseException, so that
    only ``finally`` and ``with`` blocks (the run lock's among them) see it on its way out."""


def exit_on_sigterm(handler: Callable[..., int]) -> Callable[..., int]:
    """Run ``handler`` with SIGTERM raising ``_Terminated``, reported as exit code 143."""

    @functools.wraps(handler)
    def run(args) -> int:
        if threading.current_thread() is not threading.main_thread():
            return handler(args)

        def terminate(signum, frame):
            raise _Terminated

        previous = signal.signal(signal.SIGTERM, terminate)
        try:
            return handler(args)
        except _Terminated:
            print(f"addnorm {args.command}: terminated", file=sys.stderr)
            return EXIT_TERMINATED
        finally:
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)

    return run


def report_signal_stop(summary, task_name: str) -> int:
    """Say on stderr where the checkpoint of a run stopped by a signal is and how to resume
    it; return the signal's exit code. ``summary``: the run's ``RunSummary``."""
    how, code = SIGNAL_STOPS[summary.stopped_by]
    print(
        f"{how} at step {summary.step}; checkpoint written to {summary.checkpoint} "
        f"(continue with: addnorm train {task_name} --out {summary.run_dir} --resume)",
        file=sys.stderr,
    )
    return code
