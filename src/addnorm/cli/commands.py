"""The handlers of the ``addnorm`` subcommands (``train``, ``translate``, ``generate``,
``info``, ``demo``, ``explain``), by name in ``COMMANDS``: each takes the parsed arguments and
returns the exit code (``addnorm.cli.parser`` documents them). A bad argument value raises
``UsageError``; ``addnorm.cli.parser.main`` turns it and the other failures into messages and
codes.

``train`` (:mod:`addnorm.cli.train_command`) and ``demo`` refuse a run folder addnorm cannot
use (``RunDirError``: files it did not write, a run without ``--overwrite``, another writer's
lock) with exit code 2, and stop on SIGTERM with exit code 143 (:mod:`addnorm.cli.exits`).
"""

from __future__ import annotations

import datetime as dt
import json
import re
import sys
import time
from collections.abc import Callable, Iterator

from addnorm.cli.bench import run_bench_command
from addnorm.cli.checks import (
    UsageError,
    apply_runtime_flags,
    check_out_dir,
)
from addnorm.cli.embed import run_embed
from addnorm.cli.exits import EXIT_FAILED, EXIT_OK, exit_on_sigterm
from addnorm.cli.export import run_export
from addnorm.cli.train_command import run_train
from addnorm.cli.translate_input import Input, batched, open_stdin, refusal, stdin_inputs

__all__ = ["COMMANDS"]


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
    _check_sampling_flags(args)
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


def _check_sampling_flags(args) -> None:
    """``generate``'s decoding flags, before the checkpoint is read: ``--max-new-tokens`` >= 1
    (more than the model's ``max_len`` is cut to it), ``--temperature`` finite, >= 0 and
    representable in float32 (the logits' dtype: a larger one becomes inf there and turns the
    masked logits into NaN), ``--top-k`` >= 1, ``--top-p`` in (0, 1]."""
    import torch

    from addnorm._checks import check_float, check_int
    from addnorm.cli.train_command import as_flags

    try:
        check_int("max_new_tokens", args.max_new_tokens, min_value=1)
        check_float("temperature", args.temperature, min_value=0.0,
                    max_value=torch.finfo(torch.float32).max)
        if args.top_k is not None:
            check_int("top_k", args.top_k, min_value=1)
        if args.top_p is not None:
            check_float("top_p", args.top_p, min_value=0.0, min_inclusive=False, max_value=1.0)
    except (ValueError, TypeError) as err:
        names = ("max_new_tokens", "temperature", "top_k", "top_p")
        raise UsageError(as_flags(str(err), names)) from None


def _sample(args) -> int:
    """Draw digits from a dit run: a PNG grid, and the raw array with --save-array.

    Accepted: ``--steps`` 1 .. the run's diffusion steps with either method (every count has
    its steps, :mod:`addnorm.diffusion.spacing`), ``--guidance`` finite and >= 0; anything
    else exits 2 before the checkpoint is read (the steps' upper bound: once it is). Samples
    that come out non-finite (a guidance scale far past any useful one) exit 1 with one line
    and nothing written."""
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
    from addnorm.cli.checks import check_out_file

    check_out_file(args.out, "--out", make_parents=True)
    if args.save_array is not None:
        check_out_file(args.save_array, "--save-array", make_parents=True)
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
    try:
        pixels = task.sample(
            model, labels, settings, generator=generator,
            progress=not args.quiet and sys.stderr.isatty(),
        )  # (N, 8, 8), 0..16
    except FloatingPointError:  # the parser's main: one line, exit 1
        raise FloatingPointError(
            f"--guidance {settings.guidance:g} (--method {settings.method}, --steps "
            f"{settings.steps}) gave non-finite samples, nothing written: the model's guided "
            "predictions overflowed or were not finite; use a smaller --guidance (DiT uses "
            "1.5 to 4)"
        ) from None
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


@exit_on_sigterm
def _demo(args) -> int:
    from addnorm.cli.demo import run_demo, run_dit_demo
    from addnorm.training.run_dir import RunDirError, check_fresh_run_dir, check_unlocked

    device = apply_runtime_flags(args)
    check_out_dir(args.out)
    check_out_dir(args.dit_out, "--dit-out")
    for flag, minutes in (("--max-minutes", args.max_minutes),
                          ("--dit-max-minutes", args.dit_max_minutes)):
        if minutes is not None and not 0 < minutes < float("inf"):  # NaN fails both
            raise UsageError(f"{flag} must be finite and > 0, got {minutes}")
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
    "train": run_train,
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
