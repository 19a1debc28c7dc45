"""The ``addnorm`` command (also ``python -m addnorm``): parsing and dispatch only.

    addnorm train translate|lm [--preset NAME] [--config FILE.json] [--out DIR] [flags]
    addnorm translate ["21 Nov 2026" ...] [--checkpoint DIR]   (no text: one per stdin line)
    addnorm generate --prompt TEXT [--max-new-tokens N] [--temperature T] [--top-k K]
    addnorm info CHECKPOINT
    addnorm demo [--out DIR] [--max-minutes M]
    addnorm explain [--out DIR]

Model flags (``--d-model``, ``--norm-position``, ...) are derived from the fields of
``TransformerConfig`` / ``LMConfig``, trainer flags (``--max-steps``, ``--lr``, ...) from
``TrainConfig``. Settings apply in this order: the task's defaults (or ``--preset``), then
``--config FILE.json`` (``{"model": {...}, "train": {...}}``), then flags.

``addnorm train`` refuses a ``--out`` that already holds a run unless ``--resume`` (continue
it) or ``--overwrite`` (replace it) is given; ``addnorm demo`` replaces its own run directory.
``translate`` and ``generate`` use a checkpoint's EMA weights when it has them (``--weights
raw`` for the trained ones), the weights a finished run was scored with.

Exit codes: 0 success; 1 a checkpoint is missing, incomplete or corrupt (the message names
the file), training failed, a file could not be read or written, or (``translate``) some
answer is not a valid date (flagged on stderr; stdout still has one line per input);
2 bad arguments (one line on stderr); 130 interrupted by Ctrl-C (a checkpoint was written;
the message says where); 141 stdout was closed early (``addnorm translate | head``): the rest
of the output is dropped quietly, the status a tool killed by SIGPIPE reports.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import re
import sys
from pathlib import Path
from typing import NoReturn

from addnorm.config import PRESETS
from addnorm.training.checkpoint import CheckpointError
from addnorm.training.config import TrainConfig
from addnorm.training.flags import add_dataclass_flags

__all__ = ["build_parser", "main"]

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED, EXIT_BROKEN_PIPE = 0, 1, 2, 130, 141
# --threads above this is refused when os.cpu_count() is unknown.
_MAX_THREADS = 1024
# Set by the task (vocabularies and special ids from its tokenizers; the date task's two
# vocabularies differ, so it never shares embeddings), so not flags.
_TASK_OWNED = {
    "src_vocab_size",
    "tgt_vocab_size",
    "vocab_size",
    "pad_id",
    "bos_id",
    "eos_id",
    "share_embeddings",
}


class UsageError(Exception):
    """A bad value found after parsing; reported like argparse's errors (exit code 2)."""


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
        "generate text, inspect checkpoints.",
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
    generate.add_argument("--seed", type=int, default=0)
    generate.add_argument("--checkpoint", type=Path, default=Path("runs/lm"))
    _add_inference_flags(generate)

    info = commands.add_parser("info", help="print a checkpoint's configs, step and metrics")
    info.add_argument("checkpoint", type=Path, help="a checkpoint or run directory")

    demo = commands.add_parser("demo", help="train the default date translator and show it")
    demo.add_argument("--out", type=Path, default=Path("runs/translate"))
    demo.add_argument(
        "--max-minutes",
        type=float,
        default=None,
        help="training time budget (default: the task's, 4 minutes)",
    )
    _add_runtime_flags(demo)

    explain = commands.add_parser("explain", help="print the SPEC worked examples, draw figures")
    explain.add_argument("--out", type=Path, default=Path("runs/explain"))
    return parser


def _add_train_parser(commands) -> None:
    """``addnorm train TASK``: one subparser per task, with its model and trainer flags."""
    from addnorm.training.run import TASKS

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
        presets = [k for k, v in PRESETS.items() if isinstance(v, type(defaults))]
        sub.add_argument("--preset", choices=presets, help="start from a named model config")
        sub.add_argument(
            "--config",
            type=Path,
            metavar="FILE.json",
            help='JSON {"model": {...}, "train": {...}} applied over the preset',
        )
        sub.add_argument(
            "--out",
            type=Path,
            default=Path("runs") / name,
            help=f"run directory (default runs/{name})",
        )
        sub.add_argument(
            "--resume", action="store_true", help="continue the newest checkpoint in --out exactly"
        )
        sub.add_argument(
            "--overwrite",
            action="store_true",
            help="replace a previous run in --out (without it, or --resume, a run there is "
            "refused)",
        )
        _add_runtime_flags(sub)
        sub.set_defaults(
            model_fields=add_dataclass_flags(sub, defaults, skip=_TASK_OWNED),
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
        "printed anyway, flagged on stderr, and the exit status is 1."
    )


def main(argv: list[str] | None = None) -> int:
    """Run the ``addnorm`` command with ``argv`` (default ``sys.argv[1:]``); returns the exit
    code instead of calling ``sys.exit``."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as stop:  # argparse: --help (0) or a usage error (2, one line)
        return stop.code if isinstance(stop.code, int) else EXIT_USAGE
    handler = {
        "train": _train,
        "translate": _translate,
        "generate": _generate,
        "info": _info,
        "demo": _demo,
        "explain": _explain,
    }[args.command]
    prog = f"addnorm {args.command}"
    try:
        return handler(args)
    except BrokenPipeError:  # the reader of stdout went away (| head): stop quietly
        _silence_stdout()
        return EXIT_BROKEN_PIPE
    except UsageError as err:
        print(f"{prog}: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    except CheckpointError as err:
        print(f"{prog}: error: {err}", file=sys.stderr)
        return EXIT_FAILED
    except FloatingPointError as err:
        print(f"{prog}: error: {err}", file=sys.stderr)
        return EXIT_FAILED
    except OSError as err:  # a file or directory that cannot be read or written
        print(f"{prog}: error: {err}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:  # outside training (loading, evaluating, decoding)
        print(f"{prog}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's last flush does not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # stdout is not a real file (tests)
        pass


def _setup(args) -> str:
    """Check and apply --threads, and check and resolve --device to a device string."""
    import torch

    limit = os.cpu_count() or _MAX_THREADS
    if not 0 <= args.threads <= limit:
        raise UsageError(f"--threads must be between 0 and {limit} (the CPUs), got {args.threads}")
    if args.threads:
        torch.set_num_threads(args.threads)
    return _resolve_device(args.device)


def _resolve_device(name: str) -> str:
    """The device --device names: auto (cuda if available, else cpu), or cpu, cuda, cuda:N or
    mps when that device is present."""
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    match = re.fullmatch(r"(cpu|cuda|mps)(?::(\d+))?", name)
    if match is None or (match.group(2) is not None and match.group(1) != "cuda"):
        raise UsageError(f"--device must be auto, cpu, cuda, cuda:N or mps, got {name!r}")
    kind, index = match.groups()
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise UsageError(f"--device {name}: CUDA is not available")
        count = torch.cuda.device_count()
        if index is not None and int(index) >= count:
            raise UsageError(f"--device {name}: there are {count} CUDA devices (0 to {count - 1})")
    if kind == "mps" and not torch.backends.mps.is_available():
        raise UsageError(f"--device {name}: MPS is not available")
    return name


def _check_out_dir(out: Path, flag: str = "--out") -> None:
    """``out`` must be a directory, or a path where one can be made."""
    if out.exists() and not out.is_dir():
        raise UsageError(f"{flag} {out}: exists and is not a directory")
    parent = out
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise UsageError(f"{flag} {out}: {parent} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"{flag} {out}: cannot create or write in {parent}")


def _train(args) -> int:
    from addnorm.training.checkpoint import load_checkpoint
    from addnorm.training.run import TASKS, has_run, resume_configs, train_run

    device = _setup(args)
    _check_out_dir(args.out)
    task_cls = TASKS[args.task]
    model_flags = {k: getattr(args, k) for k in args.model_fields if hasattr(args, k)}
    train_flags = {k: getattr(args, k) for k in args.train_fields if hasattr(args, k)}
    resume = None
    try:
        if args.resume:
            if model_flags or args.preset or args.config or args.overwrite:
                raise UsageError(
                    "--resume takes the model settings from the checkpoint; "
                    "drop --preset, --config, --overwrite and model flags"
                )
            resume = load_checkpoint(args.out)
            model_cfg, train_cfg = resume_configs(resume, train_flags, task_name=args.task)
        else:
            if has_run(args.out) and not args.overwrite:
                raise UsageError(
                    f"--out {args.out} already holds a run; add --resume to continue it or "
                    "--overwrite to replace it"
                )
            model_cfg, train_cfg = _fresh_configs(task_cls, args, model_flags, train_flags)
            task = task_cls()
            task.check(task.prepare(model_cfg), train_cfg)
    except (ValueError, TypeError) as err:
        raise UsageError(" ".join(str(err).split())) from None
    _announce(args, train_cfg, device)
    summary = train_run(
        args.task,
        model_cfg,
        train_cfg,
        args.out,
        resume=resume,
        device=device,
        progress=not args.quiet and sys.stderr.isatty(),
    )
    if summary.stopped_by == "interrupt":
        print(
            f"interrupted at step {summary.step}; checkpoint written to {summary.checkpoint}"
            f" (continue with: addnorm train {args.task} --out {args.out} --resume)",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED
    print(
        f"trained {summary.step} steps in {summary.elapsed_s:.0f} s "
        f"(stopped by {summary.stopped_by}); checkpoint: {summary.checkpoint}"
    )
    print(
        f"{task_cls.metric}: {summary.metrics[task_cls.metric]:.4f} "
        f"({summary.metrics['weights']} weights); "
        f"metrics: {summary.run_dir / 'metrics.json'}; loss curve: {summary.loss_png}"
    )
    if args.task == "lm":
        for sample in summary.metrics["samples"]:
            print(f"\nsample (prompt {sample['prompt']!r}):\n{sample['text']}")
    return EXIT_OK


def _announce(args, train_cfg: TrainConfig, device: str) -> None:
    """One line on stderr saying what is about to happen (training can be long and quiet)."""
    from addnorm.training.checkpoint import list_checkpoints

    if args.overwrite and list_checkpoints(args.out):
        print(
            f"replacing the previous run in {args.out}",
            file=sys.stderr,
        )
    budget = f"{train_cfg.max_steps} steps"
    if train_cfg.max_minutes is not None:
        budget += f" or {train_cfg.max_minutes:g} minutes"
    print(
        f"training {args.task} into {args.out} on {device}: up to {budget}; "
        "Ctrl-C stops and writes a checkpoint",
        file=sys.stderr,
        flush=True,
    )


def _fresh_configs(task_cls, args, model_flags: dict, train_flags: dict):
    """Task defaults (or the preset), then the JSON file, then flags."""
    model_cfg = PRESETS[args.preset] if args.preset else task_cls.default_model_config()
    train_cfg = task_cls.default_train_config()
    if args.config is not None:
        model_values, train_values = _read_config(args.config, args.task)
        model_cfg = dataclasses.replace(model_cfg, **_known(model_cfg, model_values, args.config))
        train_cfg = dataclasses.replace(train_cfg, **_known(train_cfg, train_values, args.config))
    return (
        dataclasses.replace(model_cfg, **model_flags),
        dataclasses.replace(train_cfg, **train_flags),
    )


def _read_config(path: Path, task_name: str) -> tuple[dict, dict]:
    """The "model" and "train" objects of a ``--config`` file, after checking its shape."""
    where = f"--config {path}"
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise UsageError(f"{where}: not UTF-8 text ({err.reason} at byte {err.start})") from None
    except OSError as err:
        raise UsageError(f"{where}: {err.strerror or err}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise UsageError(f"{where}: not valid JSON: {err}") from None
    expected = '{"model": {...}, "train": {...}}'
    if not isinstance(data, dict):
        raise UsageError(f"{where}: expected a JSON object {expected}, got {_json_type(data)}")
    unknown = sorted(set(data) - {"model", "train"})
    if unknown:
        raise UsageError(f"{where}: expected {expected}, got the keys {unknown}")
    parts = {}
    for key in ("model", "train"):
        value = data.get(key, {})
        if not isinstance(value, dict):
            raise UsageError(f'{where}: "{key}" must be a JSON object, got {_json_type(value)}')
        parts[key] = value
    owned = sorted(set(parts["model"]) & _TASK_OWNED)
    if owned:
        raise UsageError(
            f"{where}: {', '.join(owned)} are set by the {task_name} task (its tokenizers), "
            "not by a config"
        )
    return parts["model"], parts["train"]


def _json_type(value: object) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean"}
    if value is None:
        return "null"
    return names.get(type(value), "a number")


def _known(cfg, values: dict, path: Path) -> dict:
    names = {f.name for f in dataclasses.fields(cfg)}
    unknown = sorted(set(values) - names)
    if unknown:
        raise UsageError(f"--config {path}: unknown {type(cfg).__name__} fields {unknown}")
    return values


def _load(args, task_name: str):
    from addnorm.training.run import load_trained

    device = _setup(args)
    task, model, checkpoint = load_trained(args.checkpoint, device=device, weights=args.weights)
    if task.name != task_name:
        raise UsageError(
            f"{checkpoint.path} holds a {task.name!r} model; this command needs a {task_name!r} one"
        )
    return task, model


def _translate(args) -> int:
    from addnorm.data.dates import FIRST_YEAR, LAST_YEAR

    task, model = _load(args, "translate")
    try:
        texts = args.text or [line.rstrip("\r\n") for line in sys.stdin]
    except UnicodeDecodeError as err:
        raise UsageError(f"stdin is not UTF-8 text ({err.reason} at byte {err.start})") from None
    answers = iter(task.predict(model, [t for t in texts if t.strip()]))
    flagged = 0
    for text in texts:  # a blank input line gets a blank answer line
        answer = next(answers) if text.strip() else ""
        print(answer)
        if text.strip() and not _is_supported_date(answer, FIRST_YEAR, LAST_YEAR):
            flagged += 1
            print(
                f"addnorm translate: warning: {text!r} -> {answer!r} is not a valid date "
                f"from {FIRST_YEAR} to {LAST_YEAR}",
                file=sys.stderr,
            )
    return EXIT_FAILED if flagged else EXIT_OK


def _is_supported_date(answer: str, first_year: int, last_year: int) -> bool:
    """Whether ``answer`` is a real YYYY-MM-DD date in the supported years."""
    if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", answer):
        return False
    try:
        day = dt.date.fromisoformat(answer)
    except ValueError:
        return False
    return first_year <= day.year <= last_year


def _generate(args) -> int:
    import torch

    task, model = _load(args, "lm")
    device = next(model.parameters()).device
    try:
        text = task.sample(
            model,
            args.prompt,
            max_new_tokens=args.max_new_tokens,
            temperature=args.temperature,
            top_k=args.top_k,
            top_p=args.top_p,
            generator=torch.Generator(device=device).manual_seed(args.seed),
        )
    except (ValueError, TypeError) as err:
        raise UsageError(str(err)) from None
    print(text)
    return EXIT_OK


def _info(args) -> int:
    from addnorm.training.checkpoint import load_checkpoint
    from addnorm.training.run import read_run_metrics

    checkpoint = load_checkpoint(args.checkpoint)
    state = checkpoint.state
    report = {
        "checkpoint": str(checkpoint.path),
        "task": state.get("run", {}).get("task"),
        "step": checkpoint.step,
        "elapsed_s": state.get("elapsed_s"),
        "model_config": state.get("run", {}).get("model_config"),
        "train_config": state.get("train_config"),
        "metrics": read_run_metrics(checkpoint),
    }
    print(json.dumps(report, indent=2, ensure_ascii=False))
    return EXIT_OK


def _demo(args) -> int:
    from addnorm.demo import run_demo

    device = _setup(args)
    _check_out_dir(args.out)
    if args.max_minutes is not None and not args.max_minutes > 0:
        raise UsageError(f"--max-minutes must be > 0, got {args.max_minutes}")
    return run_demo(
        args.out,
        max_minutes=args.max_minutes,
        device=device,
        progress=not args.quiet and sys.stderr.isatty(),
    )


def _explain(args) -> int:
    from addnorm.explain import run_explain

    _check_out_dir(args.out)
    return run_explain(args.out)
