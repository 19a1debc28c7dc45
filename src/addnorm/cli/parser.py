"""The ``addnorm`` command (also ``python -m addnorm``): parsing and dispatch only; each
subcommand's flags and handler live in its own module (``SUBCOMMANDS``).

    addnorm train translate|lm [--preset NAME] [--config FILE.json] [--out DIR] [flags]
    addnorm translate ["21 Nov 2026" ...] [--checkpoint DIR]   (no text: one per stdin line)
    addnorm generate --prompt TEXT [--max-new-tokens N] [--temperature T] [--top-k K] [--compile]
                     [--stop TEXT ...]
    addnorm info CHECKPOINT
    addnorm export CHECKPOINT --out MODEL.onnx [--part forward|encoder]
    addnorm embed ["text" ...] [--similarity] [--json]   (no text: one per stdin line)
    addnorm bench [--quick] [--json FILE] [--only GROUP ...] [--compile] [--bf16]
                  [--device cuda] [--suite cpu|gpu] [--tiny] [--profile DIR]
    addnorm demo [--out DIR] [--max-minutes M]
    addnorm explain [NAME | all] [--quick] [--list] [--out DIR]
    addnorm --version

Every flag's ``--help`` states its default (:mod:`addnorm.cli.help_format`).

Model flags (``--d-model``, ``--norm-position``, ...) are derived from the fields of
``TransformerConfig`` / ``LMConfig``, trainer flags (``--max-steps``, ``--lr``, ...) from
``TrainConfig``. Settings apply in this order: the task's defaults (or ``--preset``), then
``--config FILE.json`` (``{"model": {...}, "train": {...}}``), then flags.

``addnorm train`` refuses a ``--out`` that already holds a run unless ``--resume`` (continue
it) or ``--overwrite`` (replace it) is given; ``addnorm demo`` replaces its own run directory.
Either deletes only the files of a run addnorm started there (proven by its
``addnorm-run.json``) and refuses any other non-empty folder, or one another run is writing.
``translate`` and ``generate`` use a checkpoint's EMA weights when it has them (``--weights
raw`` for the trained ones), the weights a finished run was scored with.

Exit codes: 0 success; 1 a checkpoint is missing, incomplete or corrupt (the message names the
file), asks for sizes no memory here holds or holds broken weights (NaN, inf, or outputs that
are not finite), training failed, memory ran out past the checks made before (the checkpoints
written so far stay), a file could not be read or written (``translate`` and ``generate`` with
stdout closed among them), ``sample``'s digits came out non-finite (nothing is written), or
(``translate``) some answer is not a valid date or some input was refused (not UTF-8, a
character outside the model's vocabulary, longer than its ``max_len``; each flagged on stderr
with its line number, the other inputs translated; stdout still has one line per input, empty
for a refused one); 2 bad arguments (sizes too large for the memory here among them: the
message names the flag, the estimate and the limit; seeds outside 0 .. 2**64 - 1) or an
unusable run folder (one line on stderr), or ``translate`` with no text and a closed stdin;
130 interrupted by Ctrl-C, 143 stopped by SIGTERM (in training: a checkpoint was written; the
message says where); 141 stdout was closed early (``addnorm translate | head``): the rest of
the output is dropped quietly, the status a tool killed by SIGPIPE reports.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import NoReturn

from addnorm.cli import (
    bench,
    demo,
    embed,
    explain,
    export,
    generate,
    info,
    sample,
    train,
    translate,
)
from addnorm.cli.checks import UsageError
from addnorm.cli.exits import EXIT_BROKEN_PIPE, EXIT_FAILED, EXIT_INTERRUPTED, EXIT_USAGE
from addnorm.cli.help_format import DefaultsFormatter
from addnorm.utils.files import CheckpointError
from addnorm.utils.memory import describe_out_of_memory, is_out_of_memory

__all__ = ["SUBCOMMANDS", "build_parser", "main"]

# Each subcommand's module, by name, in the order of ``addnorm --help``: its ``add_parser``
# registers the subcommand's flags, its ``run`` handles the parsed arguments.
SUBCOMMANDS = {
    "train": train,
    "translate": translate,
    "generate": generate,
    "sample": sample,
    "export": export,
    "embed": embed,
    "bench": bench,
    "info": info,
    "demo": demo,
    "explain": explain,
}


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors: ``addnorm <cmd>: error: <msg>`` on stderr, exit 2
    (instead of the whole usage), and each flag's default in ``--help``. Subparsers inherit
    the class."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", DefaultsFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {' '.join(message.split())}\n")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    from addnorm._version import __version__

    parser = _Parser(
        prog="addnorm",
        description="The Transformer, part by part: train, translate dates, "
        "generate text, draw digits with a Diffusion Transformer, inspect checkpoints.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}",
                        help="print addnorm's version and exit")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in SUBCOMMANDS.values():
        module.add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the ``addnorm`` command with ``argv`` (default ``sys.argv[1:]``); returns the exit
    code instead of calling ``sys.exit``."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as stop:  # argparse: --help (0) or a usage error (2, one line)
        return stop.code if isinstance(stop.code, int) else EXIT_USAGE
    handler = SUBCOMMANDS[args.command].run
    prog = f"addnorm {args.command}"
    try:
        return handler(args)
    except BrokenPipeError:  # the reader of stdout went away (| head): stop quietly
        _silence_stdout()
        return EXIT_BROKEN_PIPE
    except UsageError as err:
        print(f"{prog}: error: {_one_line(err)}", file=sys.stderr)
        return EXIT_USAGE
    except CheckpointError as err:
        print(f"{prog}: error: {_one_line(err)}", file=sys.stderr)
        return EXIT_FAILED
    except FloatingPointError as err:
        print(f"{prog}: error: {_one_line(err)}", file=sys.stderr)
        return EXIT_FAILED
    except (MemoryError, RuntimeError) as err:  # an allocation past what the checks saw
        if not is_out_of_memory(err):
            raise
        print(f"{prog}: error: {_out_of_memory(err)}", file=sys.stderr)
        return EXIT_FAILED
    except OSError as err:  # a file or directory that cannot be read or written
        print(f"{prog}: error: {_one_line(err)}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:  # outside training (loading, evaluating, decoding)
        print(f"{prog}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


def _out_of_memory(err: BaseException) -> str:
    """One line for an allocator's refusal: the trainer's own (it names the step and the
    checkpoint kept), else what could not be allocated."""
    text = _one_line(err)
    return text if text.startswith("out of memory") else (
        f"out of memory: {describe_out_of_memory(err)}; free memory or ask for less"
    )


def _one_line(err: BaseException) -> str:
    """The message of ``err`` on one line: a line break inside it (a path or text a user
    gave) is written as ``\\n``, so each error stays one line on stderr."""
    return str(err).replace("\r", "\\r").replace("\n", "\\n")


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's last flush does not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # stdout is not a real file (tests)
        pass
