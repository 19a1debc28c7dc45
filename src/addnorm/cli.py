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

Exit codes: 0 success; 1 a checkpoint is missing, incomplete or corrupt (the message names
the file) or training failed; 2 bad arguments (one line on stderr); 130 interrupted by
Ctrl-C (a checkpoint was written; the message says where).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from addnorm.config import PRESETS
from addnorm.training.checkpoint import CheckpointError
from addnorm.training.config import TrainConfig
from addnorm.training.flags import add_dataclass_flags

__all__ = ["build_parser", "main"]

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
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


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    parser = argparse.ArgumentParser(
        prog="addnorm",
        description="The Transformer, part by part: train, translate dates, "
        "generate text, inspect checkpoints.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    _add_train_parser(commands)
    translate = commands.add_parser("translate", help="normalize dates with a trained model")
    translate.add_argument("text", nargs="*", help="dates to normalize (default: stdin lines)")
    translate.add_argument("--checkpoint", type=Path, default=Path("runs/translate"))
    translate.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:1, ...")

    generate = commands.add_parser("generate", help="continue a prompt with a trained lm")
    generate.add_argument("--prompt", required=True)
    generate.add_argument("--max-new-tokens", type=int, default=200)
    generate.add_argument("--temperature", type=float, default=0.8, help="0 = greedy")
    generate.add_argument("--top-k", type=int, default=None)
    generate.add_argument("--top-p", type=float, default=None)
    generate.add_argument("--seed", type=int, default=0)
    generate.add_argument("--checkpoint", type=Path, default=Path("runs/lm"))
    generate.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:1, ...")

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
            "the task's; --preset and --config change them, flags override both.",
        )
        cls = task_cls.config_class
        presets = [k for k, v in PRESETS.items() if isinstance(v, cls)]
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
        _add_runtime_flags(sub)
        sub.set_defaults(
            model_fields=add_dataclass_flags(
                sub, task_cls.default_model_config(), skip=_TASK_OWNED
            ),
            train_fields=add_dataclass_flags(sub, task_cls.default_train_config()),
        )


def _add_runtime_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:1, ...")
    parser.add_argument(
        "--threads", type=int, default=0, help="torch CPU threads (default 0: torch's choice)"
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def main(argv: list[str] | None = None) -> int:
    """Run the ``addnorm`` command with ``argv`` (default ``sys.argv[1:]``); returns the exit
    code instead of calling ``sys.exit``."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as stop:  # argparse: --help (0) or a usage error (2)
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
    except UsageError as err:
        print(f"{prog}: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    except CheckpointError as err:
        print(f"{prog}: error: {err}", file=sys.stderr)
        return EXIT_FAILED
    except FloatingPointError as err:
        print(f"{prog}: error: {err}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:  # outside training (loading, evaluating, decoding)
        print(f"{prog}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


def _setup(args) -> str:
    """Apply --threads and resolve --device ("auto": cuda if available) to a device string."""
    import torch

    if getattr(args, "threads", 0):
        if args.threads < 0:
            raise UsageError(f"--threads must be >= 0, got {args.threads}")
        torch.set_num_threads(args.threads)
    if args.device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(args.device)
    except RuntimeError:
        raise UsageError(f"--device: unknown device {args.device!r}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"--device {args.device}: CUDA is not available")
    return args.device


def _train(args) -> int:
    from addnorm.training.checkpoint import load_checkpoint
    from addnorm.training.run import TASKS, resume_configs, train_run

    device = _setup(args)
    task_cls = TASKS[args.task]
    model_flags = {k: getattr(args, k) for k in args.model_fields if hasattr(args, k)}
    train_flags = {k: getattr(args, k) for k in args.train_fields if hasattr(args, k)}
    resume = None
    try:
        if args.resume:
            if model_flags or args.preset or args.config:
                raise UsageError(
                    "--resume takes the model settings from the checkpoint; "
                    "drop --preset, --config and model flags"
                )
            resume = load_checkpoint(args.out)
            model_cfg, train_cfg = resume_configs(resume, train_flags)
        else:
            model_cfg, train_cfg = _fresh_configs(task_cls, args, model_flags, train_flags)
            task_cls.check(model_cfg, train_cfg)
    except (ValueError, TypeError) as err:
        raise UsageError(str(err)) from None
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
        f"{task_cls.metric}: {summary.metrics[task_cls.metric]:.4f}; "
        f"metrics: {summary.run_dir / 'metrics.json'}; loss curve: {summary.loss_png}"
    )
    return EXIT_OK


def _announce(args, train_cfg: TrainConfig, device: str) -> None:
    """One line on stderr saying what is about to happen (training can be long and quiet)."""
    from addnorm.training.checkpoint import list_checkpoints

    if not args.resume and list_checkpoints(args.out):
        print(
            f"replacing the previous run in {args.out} (use --resume to continue it)",
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
        try:
            data = json.loads(args.config.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as err:
            raise UsageError(f"--config {args.config}: {err}") from None
        if not isinstance(data, dict) or set(data) - {"model", "train"}:
            raise UsageError(
                f'--config {args.config}: expected {{"model": {{...}}, '
                f'"train": {{...}}}}, got keys {sorted(data)}'
            )
        model_cfg = dataclasses.replace(model_cfg, **_known(model_cfg, data.get("model", {})))
        train_cfg = dataclasses.replace(train_cfg, **_known(train_cfg, data.get("train", {})))
    return (
        dataclasses.replace(model_cfg, **model_flags),
        dataclasses.replace(train_cfg, **train_flags),
    )


def _known(cfg, values: dict) -> dict:
    names = {f.name for f in dataclasses.fields(cfg)}
    unknown = sorted(set(values) - names)
    if unknown:
        raise UsageError(f"unknown {type(cfg).__name__} fields in --config: {unknown}")
    return values


def _load(args, task_name: str):
    from addnorm.training.run import load_trained

    task, model, checkpoint = load_trained(args.checkpoint, device=_setup(args))
    if task.name != task_name:
        raise UsageError(
            f"{checkpoint.path} holds a {task.name!r} model; this command needs a {task_name!r} one"
        )
    return task, model


def _translate(args) -> int:
    task, model = _load(args, "translate")
    texts = args.text or [line.rstrip("\r\n") for line in sys.stdin]
    answers = iter(task.predict(model, [t for t in texts if t.strip()]))
    for text in texts:  # a blank input line gets a blank answer line
        print(next(answers) if text.strip() else "")
    return EXIT_OK


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

    return run_explain(args.out)
