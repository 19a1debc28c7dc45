"""``addnorm export MODEL --out MODEL.onnx``: a model as an ONNX file, any family.

    addnorm export runs/lm --out lm.onnx                       # ids, padding_mask -> logits
    addnorm export runs/translate --out enc.onnx --part encoder  # src_ids, mask -> memory
    addnorm export runs/dit --out dit.onnx                     # x, t, y -> noise (| variance)
    addnorm export my-encoder --out enc.onnx                   # ids, padding_mask -> hidden

``MODEL`` is whatever :func:`addnorm.load` opens: an ``addnorm train`` run or checkpoint, a
``save_pretrained`` folder (the BERT-family ``EncoderModel`` included), or a transformers
BERT or GPT-2 folder. ``--part`` takes the parts the model's family exports.

The file is written by :func:`addnorm.export.to_onnx` (batch and lengths dynamic; input names
in :mod:`addnorm.export`), then run with onnxruntime on fresh left- and right-padded batches
of other sizes and compared with PyTorch; a difference above ``TOLERANCE`` is a failure
(exit 1). Without onnxruntime the check is skipped, and said so.

``--out`` is checked before anything is loaded or exported (exit 2, one line): its folder must
exist and be writable, and it must not be a folder or a special file (a device, a FIFO). An
existing regular file there is replaced.

What torch's exporter and onnxruntime print while they work (its logging, deprecation
warnings, notes about optional packages: some twenty lines) is captured, and shown on stderr
only when the export or the check fails, or with ``--verbose``; a success prints its two
lines.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path

__all__ = ["TOLERANCE", "CapturedOutput", "add_parser", "run"]

TOLERANCE = 1e-3  # largest |onnxruntime - PyTorch| accepted (float32 kernels differ slightly)


def add_parser(subparsers) -> None:
    """Register ``addnorm export`` on the subcommand parsers ``subparsers``."""
    from addnorm.cli.shared_flags import add_weights_flag
    from addnorm.export import PARTS

    export = subparsers.add_parser(
        "export",
        help="write a model as ONNX, checked against PyTorch",
        description="Write a model (an addnorm train run or checkpoint, a save_pretrained "
        "folder of any family, or a transformers BERT or GPT-2 folder) as an ONNX file with a "
        "dynamic batch and sequence lengths, then check it with onnxruntime against PyTorch "
        "on padded batches of other sizes.",
    )
    export.add_argument(
        "checkpoint", type=Path,
        help="a run or checkpoint directory, or a pretrained folder (what addnorm.load opens)",
    )
    export.add_argument(
        "--out", type=Path, required=True, metavar="MODEL.onnx",
        help="the ONNX file to write (its folder must exist; an existing file is replaced)",
    )
    export.add_argument(
        "--part", choices=PARTS, default="forward",
        help="forward: the whole forward; encoder: the translator's encoder only",
    )
    add_weights_flag(export)
    export.add_argument(
        "--no-check", action="store_true", help="skip the onnxruntime comparison"
    )
    export.add_argument(
        "--verbose", action="store_true",
        help="show what torch's exporter and onnxruntime print (else only if they fail)",
    )


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


def run(args: argparse.Namespace) -> int:
    """Handle ``addnorm export``; returns the exit code."""
    from addnorm.cli.checks import UsageError, check_out_file
    from addnorm.cli.exits import EXIT_FAILED, EXIT_OK
    from addnorm.export import onnx_max_error, to_onnx
    from addnorm.tasks.loading import load

    check_out_file(args.out)
    model = load(args.checkpoint, weights=args.weights, device="cpu")
    name = type(model).__name__
    if args.part not in model.export_parts:
        parts = ", ".join(model.export_parts)
        raise UsageError(f"--part {args.part}: a {name} exports {parts}; {args.checkpoint}")
    quiet = not args.verbose
    try:
        with CapturedOutput(quiet) as exporting:
            path = to_onnx(model, args.out, part=args.part)
    except ImportError as err:
        exporting.show()
        print(
            f"addnorm export: error: {err}; writing ONNX needs the onnx and onnxscript "
            "packages (pip install 'addnorm[export]')",
            file=sys.stderr,
        )
        return EXIT_FAILED
    except Exception as err:  # what the exporter said before it failed, then one line
        exporting.show()
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        print(f"addnorm export: error: exporting the {name}'s {args.part} failed "
              f"({type(err).__name__}: {first})", file=sys.stderr)
        return EXIT_FAILED
    print(f"wrote {path}: the {name}'s {args.part}")
    if args.no_check:
        return EXIT_OK
    try:
        with CapturedOutput(quiet) as checking:
            error = onnx_max_error(model, path, part=args.part)
    except ImportError:
        print("not checked: onnxruntime is not installed (pip install 'addnorm[export]')")
        return EXIT_OK
    except Exception as err:
        checking.show()
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        print(f"addnorm export: error: checking {path} with onnxruntime failed "
              f"({type(err).__name__}: {first})", file=sys.stderr)
        return EXIT_FAILED
    print(f"onnxruntime vs PyTorch on padded batches: max |difference| {error:.1e}")
    if not error <= TOLERANCE:
        exporting.show()
        checking.show()
        print(
            f"addnorm export: error: the ONNX model differs from PyTorch by {error:.1e} "
            f"(more than {TOLERANCE:.0e})",
            file=sys.stderr,
        )
        return EXIT_FAILED
    return EXIT_OK
