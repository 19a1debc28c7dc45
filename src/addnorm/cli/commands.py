"""The handlers of the ``addnorm`` subcommands (``train``, ``translate``, ``generate``,
``info``, ``demo``, ``explain``), by name in ``COMMANDS``: each takes the parsed arguments and
returns the exit code (``addnorm.cli.parser`` documents them). A bad argument value raises
``UsageError``; ``addnorm.cli.parser.main`` turns it and the other failures into messages and
codes.

``train`` and ``demo`` refuse a run folder addnorm cannot use (``RunDirError``: files it did
not write, a run without ``--overwrite``, another writer's lock) with exit code 2, and stop
on SIGTERM with exit code 143: inside the trainer's loop after a checkpoint of the current
step, elsewhere at once (leaving the run's lock and files in order).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import json
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator

from addnorm._checks import check_known_fields
from addnorm.cli.bench import run_bench_command
from addnorm.cli.checks import (
    UsageError,
    apply_runtime_flags,
    check_out_dir,
    check_run_sizes,
    read_config,
)
from addnorm.cli.embed import run_embed
from addnorm.cli.export import run_export
from addnorm.cli.translate_input import Input, batched, open_stdin, refusal, stdin_inputs
from addnorm.training.config import TrainConfig

__all__ = [
    "COMMANDS",
    "SIGNAL_STOPS",
    "EXIT_BROKEN_PIPE",
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_TERMINATED",
    "EXIT_USAGE",
]

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED, EXIT_BROKEN_PIPE = 0, 1, 2, 130, 141
EXIT_TERMINATED = 143  # 128 + SIGTERM, as a shell reports a process SIGTERM ended
# How a run stopped by a signal ends (a checkpoint was written): by its stopped_by, a word for
# the message and the exit code.
SIGNAL_STOPS = {
    "interrupt": ("interrupted", EXIT_INTERRUPTED),
    "terminate": ("terminated", EXIT_TERMINATED),
}


class _Terminated(BaseException):
    """SIGTERM outside the trainer's loop (which handles it itself); a BaseException, so that
    only ``finally`` and ``with`` blocks (the run lock's among them) see it on its way out."""


def _exit_on_sigterm(handler: Callable[..., int]) -> Callable[..., int]:
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


@_exit_on_sigterm
def _train(args) -> int:
    """Train in this process, or as one rank of a ``torchrun`` launch (its environment names
    the rank and world size): then the process group lives as long as the command."""
    import os

    from addnorm.training import distributed

    device = apply_runtime_flags(args)
    try:
        world = distributed.world_from_env(os.environ)
    except ValueError as err:
        raise UsageError(str(err)) from None
    if world is None:
        return _train_here(args, device)
    device = distributed.init_distributed(world, device)
    try:
        return _train_here(args, device)
    finally:
        distributed.shutdown()


def _train_here(args, device: str) -> int:
    from addnorm.tasks.run import TASKS, has_run, resume_configs, train_run
    from addnorm.training import distributed
    from addnorm.training.checkpoint import load_checkpoint
    from addnorm.training.run_dir import RunDirError, check_fresh_run_dir, check_unlocked

    check_out_dir(args.out)
    task_cls = TASKS[args.task]
    model_flags = {k: getattr(args, k) for k in args.model_fields if hasattr(args, k)}
    train_flags = {k: getattr(args, k) for k in args.train_fields if hasattr(args, k)}
    resume = None
    try:
        check_unlocked(args.out)
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
            check_fresh_run_dir(args.out, overwrite=args.overwrite)
            model_cfg, train_cfg = _fresh_configs(task_cls, args, model_flags, train_flags)
            task = task_cls()
            task.check(task.prepare(model_cfg), train_cfg)
        check_run_sizes(task_cls, model_cfg, train_cfg, device)
    except (ValueError, TypeError) as err:
        raise UsageError(" ".join(str(err).split())) from None
    except RunDirError as err:
        raise UsageError(str(err)) from None
    if train_cfg.fsdp and not distributed.in_process_group():
        raise UsageError(
            "--fsdp shards the model over the processes of a torchrun launch: "
            f"torchrun --nproc-per-node N -m addnorm train {args.task} --fsdp ..."
        )
    distributed.barrier()  # every rank has checked the folder before rank 0 writes it
    if distributed.is_main():
        _announce(args, train_cfg, device)
    try:
        summary = train_run(
            args.task,
            model_cfg,
            train_cfg,
            args.out,
            resume=resume,
            overwrite=args.overwrite,
            device=device,
            progress=not args.quiet and sys.stderr.isatty(),
        )
    except RunDirError as err:  # another writer took the folder since the checks above
        raise UsageError(str(err)) from None
    if not distributed.is_main():  # rank 0 reports
        return SIGNAL_STOPS.get(summary.stopped_by, ("", EXIT_OK))[1]
    if summary.stopped_by in SIGNAL_STOPS:
        how, code = SIGNAL_STOPS[summary.stopped_by]
        print(
            f"{how} at step {summary.step}; checkpoint written to {summary.checkpoint}"
            f" (continue with: addnorm train {args.task} --out {args.out} --resume)",
            file=sys.stderr,
        )
        return code
    compiled = summary.metrics.get("compile_s")
    print(
        f"trained {summary.step} steps in {summary.elapsed_s:.0f} s "
        f"(stopped by {summary.stopped_by}"
        + ("" if compiled is None else f"; first step with compiling: {compiled:.1f} s")
        + f"); checkpoint: {summary.checkpoint}"
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
    from addnorm.tasks.run import has_run

    if args.overwrite and has_run(args.out):
        print(
            f"replacing the previous run in {args.out} (its own files only)",
            file=sys.stderr,
        )
    budget = f"{train_cfg.max_steps} steps"
    if train_cfg.max_minutes is not None:
        budget += f" or {train_cfg.max_minutes:g} minutes"
    from addnorm.training import distributed

    where = device
    if distributed.world_size() > 1:
        where += f" in each of {distributed.world_size()} processes"
    print(
        f"training {args.task} into {args.out} on {where}: up to {budget}; "
        "Ctrl-C (or SIGTERM) stops and writes a checkpoint",
        file=sys.stderr,
        flush=True,
    )


def _fresh_configs(task_cls, args, model_flags: dict, train_flags: dict):
    """Task defaults (or the preset), then the JSON file, then flags. A field the JSON file
    names that the config lacks raises ValueError (the caller reports it as a usage error)."""
    from addnorm.tasks.run import presets_for

    default = task_cls.default_model_config()
    model_cfg = presets_for(task_cls)[args.preset] if args.preset else default
    train_cfg = task_cls.default_train_config()
    if args.config is not None:
        model_values, train_values = read_config(args.config, args.task)
        where = f"--config {args.config}"
        model_cfg = dataclasses.replace(
            model_cfg, **check_known_fields(type(model_cfg), model_values, where)
        )
        train_cfg = dataclasses.replace(
            train_cfg, **check_known_fields(type(train_cfg), train_values, where)
        )
    return (
        dataclasses.replace(model_cfg, **model_flags),
        dataclasses.replace(train_cfg, **train_flags),
    )


def _load(args, task_name: str):
    from addnorm.tasks.run import load_trained

    device = apply_runtime_flags(args)
    task, model, checkpoint = load_trained(args.checkpoint, device=device, weights=args.weights)
    if task.name != task_name:
        raise UsageError(
            f"{checkpoint.path} holds a {task.name!r} model; this command needs a {task_name!r} one"
        )
    return task, model


def _translate(args) -> int:
    """Translate in batches of ``PREDICT_BATCH_SIZE`` lines, reading stdin lazily: each batch is
    printed and flushed before the next is read, so a long input streams its answers in
    bounded memory and a reader that goes away (``| head -1``) stops the command at the next
    batch (exit 141).

    An input the model cannot take (not UTF-8, a character outside its vocabulary, longer
    than its ``max_len``) is refused on its own: an empty output line keeps stdout aligned,
    stderr names the line (or argument) and why, the other inputs are translated, and the exit
    status is 1."""
    from addnorm.data.dates import FIRST_YEAR, LAST_YEAR
    from addnorm.tasks.translate import PREDICT_BATCH_SIZE

    stdin = None if args.text else open_stdin()
    task, model = _load(args, "translate")
    limit = model.cfg.max_len
    known = frozenset(task.src_tok.chars)
    inputs: Iterator[Input]
    if stdin is None:
        inputs = (Input(f"argument {i}", t, refusal(t, known, limit))
                  for i, t in enumerate(args.text, 1))
    else:
        inputs = stdin_inputs(stdin, known, limit)
    failed = 0
    for batch in batched(inputs, PREDICT_BATCH_SIZE):
        wanted = [item.text for item in batch if item.problem is None and item.text.strip()]
        answers = iter(task.predict(model, wanted))
        for item in batch:  # a blank or refused input gets a blank answer line
            if item.problem is not None:
                print()
                print(f"addnorm translate: error: {item.where}: {item.problem}", file=sys.stderr)
                failed += 1
                continue
            answer = next(answers) if item.text.strip() else ""
            print(answer)
            if item.text.strip() and not _is_supported_date(answer, FIRST_YEAR, LAST_YEAR):
                failed += 1
                print(
                    f"addnorm translate: warning: {item.where}: {item.text!r} -> {answer!r} is "
                    f"not a valid date from {FIRST_YEAR} to {LAST_YEAR}",
                    file=sys.stderr,
                )
        sys.stdout.flush()
    return EXIT_FAILED if failed else EXIT_OK


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

    if "" in args.stop:
        raise UsageError("--stop must not be empty")
    task, model = _load(args, "lm")
    device = next(model.parameters()).device
    start = time.perf_counter()
    try:
        text = task.sample(
            model,
            args.prompt,
            max_new_tokens=args.max_new_tokens,
            temperature=args.temperature,
            top_k=args.top_k,
            top_p=args.top_p,
            generator=torch.Generator(device=device).manual_seed(args.seed),
            stop=tuple(args.stop),
            compile=args.compile,
        )
    except (ValueError, TypeError) as err:
        raise UsageError(str(err)) from None
    if args.compile:
        seconds = time.perf_counter() - start
        print(f"compiling the decode step and generating took {seconds:.1f} s", file=sys.stderr)
    print(text)
    return EXIT_OK


def _sample(args) -> int:
    """Draw digits from a dit run: a PNG grid, and the raw array with --save-array."""
    import numpy as np
    import torch

    from addnorm.cli.grid import save_digit_grid
    from addnorm.tasks.dit import SampleSettings

    if args.digit is not None and not 0 <= args.digit <= 9:
        raise UsageError(f"--class must be a digit 0-9, got {args.digit}")
    if not 1 <= args.n <= 10_000:
        raise UsageError(f"--n must be from 1 to 10000, got {args.n}")
    if args.out.suffix.lower() != ".png":
        raise UsageError(f"--out must name a .png file, got {args.out}")
    if args.save_array is not None and args.save_array.suffix.lower() != ".npy":
        raise UsageError(f"--save-array must name a .npy file, got {args.save_array}")
    try:
        settings = SampleSettings(steps=args.steps, method=args.method, guidance=args.guidance)
    except (ValueError, TypeError) as err:
        raise UsageError(f"--{str(err).replace('_', '-')}") from None
    task, model = _load(args, "dit")
    if settings.steps > task.n_steps:
        raise UsageError(
            f"--steps must be <= the diffusion's {task.n_steps} steps, got {settings.steps}"
        )
    if args.digit is None:
        labels = torch.arange(args.n) % 10
    else:
        labels = torch.full((args.n,), args.digit)
    device = next(model.parameters()).device
    generator = torch.Generator(device=device).manual_seed(args.seed)
    pixels = task.sample(
        model, labels, settings, generator=generator,
        progress=not args.quiet and sys.stderr.isatty(),
    )  # (N, 8, 8), 0..16
    title = f"{settings.method} {settings.steps} steps, guidance {settings.guidance:g}"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    print(f"grid: {save_digit_grid(pixels, labels, args.out, title=title)}")
    if args.save_array is not None:
        args.save_array.parent.mkdir(parents=True, exist_ok=True)
        np.save(args.save_array, pixels.numpy())
        print(f"array: {args.save_array} {tuple(pixels.shape)}, 0..16 scale")
    return EXIT_OK


def _info(args) -> int:
    from addnorm.tasks.run import read_run_metrics
    from addnorm.training.checkpoint import load_checkpoint

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


@_exit_on_sigterm
def _demo(args) -> int:
    from addnorm.cli.demo import run_demo, run_dit_demo
    from addnorm.training.run_dir import RunDirError, check_fresh_run_dir, check_unlocked

    device = apply_runtime_flags(args)
    check_out_dir(args.out)
    check_out_dir(args.dit_out, "--dit-out")
    for flag, minutes in (("--max-minutes", args.max_minutes),
                          ("--dit-max-minutes", args.dit_max_minutes)):
        if minutes is not None and not minutes > 0:
            raise UsageError(f"{flag} must be > 0, got {minutes}")
    progress = not args.quiet and sys.stderr.isatty()
    try:  # both folders before the first training, which takes minutes
        for out in (args.out,) if args.no_dit else (args.out, args.dit_out):
            check_unlocked(out)
            check_fresh_run_dir(out, overwrite=True)  # the demo replaces its own runs
        code = run_demo(args.out, max_minutes=args.max_minutes, device=device, progress=progress)
        if code != EXIT_OK or args.no_dit:
            return code
        return run_dit_demo(
            args.dit_out, max_minutes=args.dit_max_minutes, device=device, progress=progress
        )
    except RunDirError as err:
        raise UsageError(str(err)) from None


def _explain(args) -> int:
    from addnorm.cli.explain import run_explain

    check_out_dir(args.out)
    return run_explain(args.out, args.name, quick=args.quick, list_only=args.list)


COMMANDS: dict[str, Callable[..., int]] = {
    "train": _train,
    "translate": _translate,
    "generate": _generate,
    "sample": _sample,
    "info": _info,
    "demo": _demo,
    "explain": _explain,
    "export": run_export,
    "embed": run_embed,
    "bench": run_bench_command,
}
