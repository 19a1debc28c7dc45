"""The ``addnorm`` command (also ``python -m addnorm``): parsing and dispatch only.

    addnorm train translate|lm [--preset NAME] [--config FILE.json] [--out DIR] [flags]
    addnorm translate ["21 Nov 2026" ...] [--checkpoint DIR]   (no text: one per stdin line)
    addnorm generate --prompt TEXT [--max-new-tokens N] [--temperature T] [--top-k K] [--compile]
                     [--stop TEXT ...]
    addnorm info CHECKPOINT
    addnorm export CHECKPOINT --out MODEL.onnx [--part forward|encoder]
    addnorm embed ["text" ...] [--similarity] [--json]   (no text: one per stdin line)
    addnorm bench [--quick] [--json FILE] [--only GROUP ...] [--compile] [--bf16]
    addnorm demo [--out DIR] [--max-minutes M]
    addnorm explain [NAME | all] [--quick] [--list] [--out DIR]

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

Exit codes: 0 success; 1 a checkpoint is missing, incomplete or corrupt (the message names
the file) or asks for sizes no memory here holds, training failed, a file could not be read
or written, ``sample``'s digits came out non-finite (nothing is written), or (``translate``)
some answer is not a valid date or some input was refused (not UTF-8, a character outside
the model's vocabulary, longer than its ``max_len``; each flagged on stderr with its line
number, the other inputs translated; stdout still has one line per
input, empty for a refused one); 2 bad arguments (sizes too large for the memory here among
them: the message names the flag, the estimate and the limit; seeds outside 0 .. 2**64 - 1)
or an unusable run folder (one line on stderr), or ``translate`` with no text and a closed
stdin; 130 interrupted by Ctrl-C,
143 stopped by SIGTERM (in training: a checkpoint was written; the message says where);
141 stdout was closed early (``addnorm translate | head``): the rest of the output is
dropped quietly, the status a tool killed by SIGPIPE reports.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sys
from pathlib import Path
from typing import NoReturn

from addnorm.cli.bench import add_bench_parser
from addnorm.cli.checks import TASK_OWNED, UsageError, out_dir, seed
from addnorm.cli.commands import COMMANDS
from addnorm.cli.embed import add_embed_parser
from addnorm.cli.exits import EXIT_BROKEN_PIPE, EXIT_FAILED, EXIT_INTERRUPTED, EXIT_USAGE
from addnorm.cli.export import add_export_parser
from addnorm.safe_files import CheckpointError
from addnorm.training.flags import add_dataclass_flags

__all__ = ["build_parser", "main"]


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors: ``addnorm <cmd>: error: <msg>`` on stderr, exit 2
    (instead of the whole usage). Subparsers inherit the class."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {' '.join(message.split())}\n")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    parser = _Parser(
        prog="addnorm",
        description="The Transformer, part by part: train, translate dates, "
        "generate text, draw digits with a Diffusion Transformer, inspect checkpoints.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    _add_train_parser(commands)
    translate = commands.add_parser(
        "translate",
        help="normalize dates with a trained model",
        description="Write each date as ISO 8601 (YYYY-MM-DD): one output line per input "
        "(a blank input line gets a blank output line).",
        epilog=_translate_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    translate.add_argument("text", nargs="*", help="dates to normalize (default: stdin lines)")
    translate.add_argument("--checkpoint", type=Path, default=Path("runs/translate"))
    _add_inference_flags(translate)

    generate = commands.add_parser("generate", help="continue a prompt with a trained lm")
    generate.add_argument("--prompt", required=True)
    generate.add_argument("--max-new-tokens", type=int, default=200)
    generate.add_argument("--temperature", type=float, default=0.8, help="0 = greedy")
    generate.add_argument("--top-k", type=int, default=None)
    generate.add_argument("--top-p", type=float, default=None)
    generate.add_argument(
        "--stop", action="append", default=[], metavar="TEXT",
        help="stop once the continuation holds TEXT and cut the output before it (repeatable)",
    )
    generate.add_argument("--seed", type=seed, default=0)
    generate.add_argument(
        "--compile", action="store_true",
        help="run the decode step compiled (torch.compile): the first call compiles for "
        "seconds (time printed to stderr), each token after is faster; pays off for long "
        "outputs at batch 1",
    )
    generate.add_argument("--checkpoint", type=Path, default=Path("runs/lm"))
    _add_inference_flags(generate)

    sample = commands.add_parser(
        "sample",
        help="draw digits from a trained DiT",
        description="Generate digits with a trained dit run: a PNG grid for people and, with "
        "--save-array, an (N, 8, 8) array on the digits' own 0..16 scale for programs.",
    )
    sample.add_argument("--checkpoint", type=Path, default=Path("runs/dit"))
    sample.add_argument(
        "--class", dest="digit", type=int, default=None,
        help="the digit to draw, 0-9 (default: every class in turn)",
    )
    sample.add_argument("--n", type=int, default=20, help="how many samples (default 20)")
    sample.add_argument(
        "--steps", type=int, default=50,
        help="sampling steps, 1 to the run's diffusion steps (default 50)",
    )
    sample.add_argument("--method", choices=("ddim", "ddpm"), default="ddim")
    sample.add_argument(
        "--guidance", type=float, default=3.0,
        help="classifier-free guidance scale, finite and >= 0; 1 = none (default 3.0)",
    )
    sample.add_argument("--seed", type=seed, default=0)
    sample.add_argument("--out", type=Path, required=True, metavar="GRID.png")
    sample.add_argument("--save-array", type=Path, default=None, metavar="SAMPLES.npy")
    sample.add_argument("--quiet", action="store_true", help="no progress bar")
    _add_inference_flags(sample)

    add_export_parser(commands)
    add_embed_parser(commands)
    add_bench_parser(commands)

    info = commands.add_parser("info", help="print a checkpoint's configs, step and metrics")
    info.add_argument("checkpoint", type=Path, help="a checkpoint or run directory")

    demo = commands.add_parser(
        "demo", help="train the date translator and the digits DiT, and show them at work"
    )
    demo.add_argument(
        "--out", type=out_dir, default=Path("runs/translate"),
        help="the translator's run folder (default runs/translate); the demo replaces its own "
        "previous run there and refuses a folder holding anything else",
    )
    demo.add_argument(
        "--max-minutes",
        type=float,
        default=None,
        help="the translator's training time budget (default: the task's, 4 minutes)",
    )
    demo.add_argument("--dit-out", type=out_dir, default=Path("runs/dit"))
    demo.add_argument(
        "--dit-max-minutes",
        type=float,
        default=None,
        help="the DiT's training time budget (default: the task's, 5 minutes)",
    )
    demo.add_argument("--no-dit", action="store_true", help="only the date translator")
    _add_runtime_flags(demo)

    from addnorm.experiments import EXPERIMENTS

    explain = commands.add_parser(
        "explain", help="run the SPEC claims as experiments: figures, numbers, an HTML page",
        description="Run one experiment (NAME), or all, writing OUT/NAME/figure.png, "
        "OUT/NAME/result.json and OUT/index.html. With no NAME: all --quick.",
    )
    explain.add_argument("name", nargs="?", choices=[*EXPERIMENTS, "all"], metavar="NAME",
                         help="an experiment (see --list) or 'all'; default: all --quick")
    explain.add_argument("--list", action="store_true", help="list the experiments and exit")
    explain.add_argument("--quick", action="store_true",
                         help="a reduced run (seconds each; what the tests run)")
    explain.add_argument("--out", type=out_dir, default=Path("runs/explain"),
                         help="output folder (default: runs/explain)")
    return parser


def _add_train_parser(commands) -> None:
    """``addnorm train TASK``: one subparser per task, with its model and trainer flags."""
    from addnorm.tasks.run import TASKS, presets_for

    train = commands.add_parser("train", help="train a model on a task")
    tasks = train.add_subparsers(dest="task", required=True, metavar="TASK")
    for name, task_cls in TASKS.items():
        sub = tasks.add_parser(
            name,
            help=task_cls.description,
            description=f"Train the {name} task: {task_cls.description}. Defaults shown are "
            "the task's; --preset and --config change them, flags override both. --lr is the "
            "peak learning rate of every --schedule; noam keeps the paper's shape, "
            "lr * sqrt(warmup) * min(step^-0.5, step * warmup^-1.5), peaking at lr at step "
            "warmup (the paper's values: lr = d_model^-0.5 * warmup^-0.5).",
        )
        defaults = task_cls.default_model_config()
        presets = list(presets_for(task_cls))
        sub.add_argument("--preset", choices=presets, help="start from a named model config")
        sub.add_argument(
            "--config",
            type=Path,
            metavar="FILE.json",
            help='JSON {"model": {...}, "train": {...}} applied over the preset',
        )
        sub.add_argument(
            "--out",
            type=out_dir,
            default=Path("runs") / name,
            help=f"run directory (default runs/{name}): new, empty, or an addnorm run",
        )
        sub.add_argument(
            "--resume", action="store_true", help="continue the newest checkpoint in --out exactly"
        )
        sub.add_argument(
            "--overwrite",
            action="store_true",
            help="replace a previous run in --out (without it, or --resume, a run there is "
            "refused); deletes only that run's own files (checkpoints/, metrics.jsonl, "
            "metrics.json, loss.png, samples.png, addnorm-run.json), never other files, and "
            "still refuses a folder addnorm did not start (no addnorm-run.json)",
        )
        _add_runtime_flags(sub)
        sub.set_defaults(
            model_fields=add_dataclass_flags(sub, defaults, skip=TASK_OWNED),
            train_fields=add_dataclass_flags(sub, task_cls.default_train_config()),
        )


def _add_device_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--device",
        default="auto",
        help="auto (cuda if available, else cpu), cpu, cuda, cuda:N, mps",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=0,
        help="torch CPU threads, 1 to the number of CPUs (default 0: torch's choice)",
    )


def _add_runtime_flags(parser: argparse.ArgumentParser) -> None:
    _add_device_flags(parser)
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def _add_inference_flags(parser: argparse.ArgumentParser) -> None:
    _add_device_flags(parser)
    parser.add_argument(
        "--weights",
        choices=("ema", "raw"),
        default="ema",
        help="ema (default): the checkpoint's moving average of the weights if it has one, "
        "else the trained weights; raw: the trained weights",
    )


def _translate_epilog() -> str:
    """The supported inputs, one example per format (the date of 21 Nov 2026)."""
    from addnorm.data.dates import FIRST_YEAR, FORMATS, LAST_YEAR, format_date

    day = dt.date(2026, 11, 21)
    examples = "\n".join(f"  {format_date(day, fmt)}" for fmt in FORMATS)
    return (
        f"Supported: dates from {FIRST_YEAR}-01-01 to {LAST_YEAR}-12-31 with a four-digit "
        "year and the month written as a word, or in year-month-day order, in these formats "
        "(English, German, French and Spanish ones also in lower or upper case):\n"
        f"{examples}\n"
        "The model always answers; an answer that is not a real date in that range is "
        "printed anyway, flagged on stderr, and the exit status is 1. An input it cannot "
        "read (not UTF-8, a character outside its vocabulary, longer than its max_len) gets "
        "an empty line, an error naming its line on stderr, and exit status 1; the other "
        "lines are translated."
    )


def main(argv: list[str] | None = None) -> int:
    """Run the ``addnorm`` command with ``argv`` (default ``sys.argv[1:]``); returns the exit
    code instead of calling ``sys.exit``."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as stop:  # argparse: --help (0) or a usage error (2, one line)
        return stop.code if isinstance(stop.code, int) else EXIT_USAGE
    handler = COMMANDS[args.command]
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
    except OSError as err:  # a file or directory that cannot be read or written
        print(f"{prog}: error: {_one_line(err)}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:  # outside training (loading, evaluating, decoding)
        print(f"{prog}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


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
