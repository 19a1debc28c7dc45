"""``addnorm translate ["21 Nov 2026" ...]``: inputs translated by a trained translate run (dates
normalized, or what a run trained on your pairs with ``--data`` learned), one output line per
input (no text: one input per stdin line, read as it comes).

An input the model cannot take is refused on its own (:mod:`addnorm.cli.translate_input`,
then the task's own limits: a BPE's tokens against the model's max_len); a date run's answer
that is not a real date in the supported years is printed and flagged; either makes the exit
status 1.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import sys
from collections.abc import Iterator
from pathlib import Path

from addnorm.cli.exits import EXIT_FAILED, EXIT_OK, require_stdout
from addnorm.cli.help_format import RawDescriptionDefaultsFormatter
from addnorm.cli.shared_flags import add_inference_flags, load_task_model
from addnorm.cli.translate_input import Input, batched, open_stdin, refusal, stdin_inputs
from addnorm.utils.files import CheckpointError

__all__ = ["add_parser", "run"]


def add_parser(subparsers) -> None:
    """Register ``addnorm translate``."""
    translate = subparsers.add_parser(
        "translate",
        help="normalize dates (or translate as a run on your pairs learned) with a trained model",
        description="Write each date as ISO 8601 (YYYY-MM-DD), or translate each input with a "
        "run trained on your pairs (addnorm train translate --data): one output line per "
        "input (a blank input line gets a blank output line).",
        epilog=_epilog(),
        formatter_class=RawDescriptionDefaultsFormatter,
    )
    translate.add_argument("text", nargs="*", help="dates to normalize (default: stdin lines)")
    translate.add_argument(
        "--checkpoint", type=Path, default=Path("runs/translate"),
        help="a translate run folder (its best checkpoint, else its newest: --which), one "
        "checkpoint folder, or a folder addnorm.load opens (save_pretrained's, transformers' or "
        "diffusers') whose model the translate task trains",
    )
    add_inference_flags(translate)


def _epilog() -> str:
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
        "lines are translated. A run trained on your pairs (--data) answers any input its "
        "tokenizer encodes, and its answers are not checked."
    )


def run(args: argparse.Namespace) -> int:
    """Translate in batches of ``PREDICT_BATCH_SIZE`` lines, reading stdin lazily: each batch is
    printed and flushed before the next is read, so a long input streams its answers in
    bounded memory and a reader that goes away (``| head -1``) stops the command at the next
    batch (exit 141).

    An input the model cannot take (not UTF-8, a character outside its vocabulary, longer
    than its ``max_len``) is refused on its own: an empty output line keeps stdout aligned,
    stderr names the line (or argument) and why, the other inputs are translated, and the exit
    status is 1."""
    from addnorm.tasks.translate import PREDICT_BATCH_SIZE

    require_stdout("the dates")
    stdin = None if args.text else open_stdin()
    task, model = load_task_model(args, "translate")
    limit = model.cfg.max_len
    known = task.source_alphabet()
    inputs: Iterator[Input]
    if stdin is None:
        inputs = (Input(f"argument {i}", t, refusal(t, known, limit))
                  for i, t in enumerate(args.text, 1))
    else:
        inputs = stdin_inputs(stdin, known, limit)
    inputs = (item if item.problem is not None else
              dataclasses.replace(item, problem=task.input_problem(item.text, limit))
              for item in inputs)
    failed = 0
    for batch in batched(inputs, PREDICT_BATCH_SIZE):
        wanted = [item.text for item in batch if item.problem is None and item.text.strip()]
        try:
            answers = iter(task.predict(model, wanted))
        except ValueError as err:  # inputs are checked above: what is left is the model's
            raise CheckpointError(f"the model of {args.checkpoint} failed: {err}") from None
        for item in batch:  # a blank or refused input gets a blank answer line
            if item.problem is not None:
                print()
                print(f"addnorm translate: error: {item.where}: {item.problem}", file=sys.stderr)
                failed += 1
                continue
            answer = next(answers) if item.text.strip() else ""
            print(answer)
            problem = task.answer_problem(answer) if item.text.strip() else None
            if problem is not None:
                failed += 1
                print(
                    f"addnorm translate: warning: {item.where}: {item.text!r} -> {answer!r} is "
                    f"{problem}",
                    file=sys.stderr,
                )
        sys.stdout.flush()
    return EXIT_FAILED if failed else EXIT_OK

