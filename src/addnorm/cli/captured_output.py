"""What a library prints while the CLI calls it (torch's exporter, onnxruntime, diffusers:
logging, deprecation warnings, progress bars), held back and shown only when it matters.

:class:`CapturedOutput` holds Python's stdout, stderr and warnings and the file descriptors 1
and 2 (which C++ code and logging handlers write to) for the block; ``addnorm export`` shows
them on stderr only when the export or its check fails, or with ``--verbose``.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
import tempfile
import warnings
from collections.abc import Iterator

__all__ = ["CapturedOutput"]


class CapturedOutput(contextlib.AbstractContextManager):
    """Hold what is printed inside the block (Python's stdout, stderr and warnings, and the
    file descriptors 1 and 2 that C++ code and logging handlers write to) in ``text``,
    instead of showing it; ``show()`` writes it to stderr. With ``enabled=False`` nothing is
    held."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.text = ""
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> CapturedOutput:
        if not self.enabled:
            return self
        python = io.StringIO()
        stack = self._stack
        stack.enter_context(contextlib.redirect_stdout(python))
        stack.enter_context(contextlib.redirect_stderr(python))
        stack.enter_context(warnings.catch_warnings())
        warnings.simplefilter("always")

        def hold(message, category, filename, lineno, file=None, line=None) -> None:
            python.write(warnings.formatwarning(message, category, filename, lineno, line))

        warnings.showwarning = hold  # restored by catch_warnings
        sink = stack.enter_context(tempfile.TemporaryFile(mode="w+b"))
        for fd in (1, 2):
            stack.enter_context(_fd_redirected(fd, sink.fileno()))
        stack.callback(self._collect, python, sink)
        return self

    def _collect(self, python: io.StringIO, sink) -> None:
        sink.flush()
        sink.seek(0)
        self.text = sink.read().decode("utf-8", "replace") + python.getvalue()

    def __exit__(self, *exc_info: object) -> None:
        self._stack.close()

    def show(self) -> None:
        if self.text.strip():
            sys.stderr.write(self.text if self.text.endswith("\n") else self.text + "\n")


@contextlib.contextmanager
def _fd_redirected(fd: int, target: int) -> Iterator[None]:
    """File descriptor ``fd`` pointed at ``target`` for the block (nothing where ``fd`` is
    closed or cannot be duplicated)."""
    try:
        saved = os.dup(fd)
    except OSError:
        yield
        return
    try:
        _flush_standard_streams()
        os.dup2(target, fd)
        yield
    finally:
        _flush_standard_streams()  # what was written inside goes to ``target``
        os.dup2(saved, fd)
        os.close(saved)


def _flush_standard_streams() -> None:
    for stream in (sys.__stdout__, sys.__stderr__):
        if stream is not None:
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
