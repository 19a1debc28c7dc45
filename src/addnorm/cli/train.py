"""``addnorm train TASK``: a fresh run, a resumed one, or one rank of a ``torchrun`` launch.

The flags are read into a run plan (:mod:`addnorm.tasks.plan`: the configs, the checks that the
task can train them and that they fit the memory here); a fresh run is then fitted to its time
budget and, on the user's data, its model sized from the data, after a short measured warm-up
(:mod:`addnorm.tasks.budget`), and prints its plan before it starts. The run folder is checked
before anything is built (``RunDirError`` and bad settings are usage errors, exit code 2); a run
stopped by Ctrl-C or SIGTERM ends after a checkpoint of the current step, with exit code 130
or 143 and the command that resumes it.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from addnorm.cli.bf16 import BF16_HELP, warn_if_bf16_on_cpu
from addnorm.cli.checks import (
    UsageError,
    apply_runtime_flags,
    as_flags,
    check_out_dir,
    check_run_sizes,
    data_error_as_flags,
    out_dir,
    read_config,
)
from addnorm.cli.exits import EXIT_OK, SIGNAL_STOPS, exit_on_sigterm, report_signal_stop
from addnorm.cli.shared_flags import add_runtime_flags
from addnorm.cli.time_cap import replan_text, warn_if_cut_short
from addnorm.training.config import TrainConfig
from addnorm.training.logger import REPORT_TO, tensorboard_available
from addnorm.training.watch import DEFAULT_EVERY

if TYPE_CHECKING:
    from addnorm.tasks.budget import BudgetPlan
    from addnorm.tasks.plan import RunPlan

__all__ = ["add_parser", "run"]


def add_parser(subparsers) -> None:
    """Register ``addnorm train TASK``: one subparser per task, with its model and trainer
    flags (from the fields of its configs)."""
    from addnorm.tasks.registry import TASKS
    from addnorm.training.flags import add_dataclass_flags

    train = subparsers.add_parser("train", help="train a model on a task")
    tasks = train.add_subparsers(dest="task", required=True, metavar="TASK")
    for name, task_cls in TASKS.items():
        sub = tasks.add_parser(
            name,
            help=task_cls.description,
            description=f"Train the {name} task: {task_cls.description}. Defaults shown are "
            "the task's; --preset and --config change them, flags override both. --lr is the "
            "peak learning rate of every --schedule; noam keeps the paper's shape, "
            "lr * sqrt(warmup) * min(step^-0.5, step * warmup^-1.5), peaking at lr at step "
            "warmup (the paper's values: lr = d_model^-0.5 * warmup^-0.5). " + _plan_help(task_cls),
        )
        defaults = task_cls.default_model_config()
        presets = list(task_cls.presets())
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
            "metrics.json, loss.png, samples.png, quality.png, watch.jsonl, watch.png, "
            "tensorboard/'s event files, data.json, tokenizer files, addnorm-run.json), never "
            "other files, and still "
            "refuses a folder addnorm did not start (no addnorm-run.json)",
        )
        sub.add_argument(
            "--watch",
            nargs="?",
            type=watch_interval,
            const=DEFAULT_EVERY,
            default=None,
            metavar="EVERY",
            help="look inside the model every EVERY steps (default 50; and at the first and "
            "last step): per layer and sublayer the gradient norm and update ratio, the "
            "residual stream's RMS around every norm, what each norm divides out (BatchNorm: "
            "batch against running statistics), attention entropy per head and FFN units "
            "near zero (dead, for ReLU), into watch.jsonl and watch.png in --out (addnorm "
            "info summarises them). Off unless given",
        )
        sub.add_argument(
            "--report-to",
            choices=REPORT_TO,
            default="jsonl",
            help="what the run records besides its checkpoints and metrics.json: jsonl "
            "(metrics.jsonl, loss.png, quality.png), tensorboard (those and TensorBoard event "
            "files in OUT/tensorboard: loss, lr, grad norm, tokens/s, probe scores, the final "
            "metrics, pictures of the samples and figures; needs the tensorboard package; "
            "view with tensorboard --logdir OUT), or none (default jsonl)",
        )
        add_runtime_flags(sub)
        sub.set_defaults(
            model_fields=add_dataclass_flags(sub, defaults, skip=task_cls.owned_fields),
            train_fields=[  # the trainer's settings and the task's own, told apart by the plan
                *add_dataclass_flags(sub, task_cls.default_train_config()),
                *add_dataclass_flags(sub, task_cls.default_task_config()),
            ],
        )
        _document_bf16(sub, task_cls.default_train_config().bf16)


def _plan_help(task_cls) -> str:
    """How a run is planned (:mod:`addnorm.tasks.budget`), for the task's ``--help``."""
    from addnorm.tasks.model_size import LADDER
    from addnorm.tasks.task import DEFAULT_SIZE_RULE

    rule = getattr(task_cls, "size_rule", DEFAULT_SIZE_RULE)
    bound = ("" if rule.max_epochs is None else
             f", and no more parameters than {rule.max_epochs:g} epochs of the data give "
             f"{rule.targets_per_parameter:g} targets each")
    return (
        "A fresh run with a time budget (--max-minutes) times a short warm-up and prints its "
        "plan; steps that do not fit the budget are planned fewer, the learning-rate "
        "schedule (warm-up and decay) fitted to them, and a machine that turns out slower is "
        "re-planned once in training (the time cap stays as the last resort). On "
        "your data (--data) the defaults come from the data: the steps are --max-steps, "
        "--epochs (passes over the training data) or as many as fit the budget "
        "(--fill-budget: re-planned in training to fill it on a faster machine too), and a model "
        "not given (--preset, --config's model, or a width or depth flag) is sized from the "
        f"data and the budget: the largest of {len(LADDER)} shapes (d_model "
        f"{LADDER[0][0]}-{LADDER[-1][0]}) whose every parameter the planned steps train on "
        f"{rule.targets_per_parameter:g} targets (the loss's: tokens, images) or more{bound}, "
        "its peak lr scaled by the default's d_model over its own when wider "
        "(docs/run-plans.md)."
    )


def watch_interval(text: str) -> int:
    """The argparse type of ``--watch``: steps between watched steps, an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {value}")
    return value


def _document_bf16(parser: argparse.ArgumentParser, default: bool) -> None:
    """``--bf16``'s help: where it wins and where it loses, measured (:mod:`addnorm.cli.bf16`),
    in place of the config field's one line."""
    for action in parser._actions:
        if action.dest == "bf16":
            action.help = f"{BF16_HELP} (default {default!r})"


@exit_on_sigterm
def run(args: argparse.Namespace) -> int:
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
    from addnorm.data.fingerprint import DataError
    from addnorm.tasks.run import train_run
    from addnorm.training import distributed
    from addnorm.training.run_dir import RunDirError, RunLock

    check_out_dir(args.out)
    if args.report_to == "tensorboard" and not tensorboard_available():
        raise UsageError(
            "--report-to tensorboard needs the tensorboard package: pip install tensorboard "
            "(or addnorm[tensorboard])"
        )
    model_flags = {k: getattr(args, k) for k in args.model_fields if hasattr(args, k)}
    train_flags = {k: getattr(args, k) for k in args.train_fields if hasattr(args, k)}
    try:
        plan = _plan(args, model_flags, train_flags)
        check_run_sizes(plan, device)
        plan, decided = _plan_budget(plan, device)
    except DataError as err:  # the data cannot be used (a file failing mid-read: exit 1)
        raise UsageError(data_error_as_flags(str(err), [*model_flags, *train_flags])) from None
    except (ValueError, TypeError) as err:
        message = " ".join(str(err).split())
        raise UsageError(as_flags(message, [*model_flags, *train_flags])) from None
    except RunDirError as err:
        raise UsageError(str(err)) from None
    if plan.train_cfg.fsdp and not distributed.in_process_group():
        raise UsageError(
            "--fsdp shards the model over the processes of a torchrun launch: "
            f"torchrun --nproc-per-node N -m addnorm train {args.task} --fsdp ..."
            + ("; this checkpoint trained with --fsdp: add --no-fsdp to continue it in one "
               "process" if plan.resume is not None and "fsdp" not in train_flags else "")
        )
    distributed.barrier()  # every rank has checked the folder before rank 0 writes it
    main = distributed.is_main()
    try:
        # Rank 0 takes the folder's lock before saying anything, so a writer that loses a race
        # for it prints one line (the error); train_run's own lock passes through this one.
        with RunLock(args.out, reentrant=True) if main else contextlib.nullcontext():
            if main:
                _check_again_under_lock(args, plan.resume)
                _announce(args, plan.train_cfg, device)
                _notes(args.task, plan)
                if decided is not None and (decided.pace or decided.steps_from == "epochs"):
                    print("\n".join(f"  {line}" for line in decided.lines()), file=sys.stderr,
                          flush=True)  # (without a budget or epochs: the announce says it)
                warn_if_bf16_on_cpu(plan.train_cfg.bf16, device,
                                    prefix=f"addnorm train {args.task}")
            summary = train_run(
                args.task,
                plan.model_cfg,
                plan.train_cfg,
                args.out,
                task_cfg=plan.task_cfg,
                resume=plan.resume,
                task=plan.task,
                overwrite=args.overwrite,
                device=device,
                progress=not args.quiet and sys.stderr.isatty(),
                watch=args.watch,
                report_to=args.report_to,
                progress_lines=not args.quiet and not _is_terminal(sys.stdout),
            )
    except RunDirError as err:  # another writer took the folder since the checks above
        raise UsageError(str(err)) from None
    except DataError as err:  # the data changed since the checks above (a read error: exit 1)
        raise UsageError(data_error_as_flags(str(err), [*model_flags, *train_flags])) from None
    if not distributed.is_main():  # rank 0 reports
        return SIGNAL_STOPS.get(summary.stopped_by, ("", EXIT_OK))[1]
    if summary.stopped_by in SIGNAL_STOPS:
        return report_signal_stop(summary, args.task)
    if summary.replan is not None:
        print(replan_text(summary.replan))
    warn_if_cut_short(summary, plan.train_cfg, prefix=f"addnorm train {args.task}")
    _report(plan.task_cls, summary)
    return EXIT_OK


def _plan_budget(plan: RunPlan, device: str) -> tuple[RunPlan, BudgetPlan | None]:
    """A fresh plan fitted to its budget and data (:func:`addnorm.tasks.plan.plan_budget`,
    its memory checked again when its model was sized), and what was decided; a resumed plan
    as it is, and None."""
    from addnorm.tasks.plan import plan_budget

    if plan.resume is not None:
        return plan, None
    planned, decided = plan_budget(plan, device)
    if decided.size is not None:
        check_run_sizes(planned, device)
    return planned, decided


def _plan(args, model_flags: dict, train_flags: dict) -> RunPlan:
    """The run the flags ask for (:mod:`addnorm.tasks.plan`), after checking that ``--out``
    allows it: ``--resume`` continues the run there and takes no model settings; otherwise the
    folder must be free of runs, or hold one and ``--overwrite``. Settings apply in this order:
    the task's defaults (or ``--preset``), then ``--config``, then flags."""
    from addnorm.tasks.plan import plan_fresh_run, plan_resumed_run
    from addnorm.tasks.run import has_run
    from addnorm.training.run_dir import check_fresh_run_dir, check_unlocked

    check_unlocked(args.out)
    if args.resume:
        if model_flags or args.preset or args.config or args.overwrite:
            raise UsageError(
                "--resume takes the model settings from the checkpoint; "
                "drop --preset, --config, --overwrite and model flags"
            )
        return plan_resumed_run(args.task, args.out, train_overrides=train_flags)
    if has_run(args.out) and not args.overwrite:
        raise UsageError(
            f"--out {args.out} already holds a run; add --resume to continue it or "
            "--overwrite to replace it"
        )
    check_fresh_run_dir(args.out, overwrite=args.overwrite)
    model_values = train_values = None
    if args.config is not None:
        model_values, train_values = read_config(args.config, args.task)
    return plan_fresh_run(
        args.task,
        preset=args.preset,
        model_values=model_values,
        train_values=train_values,
        source=f"--config {args.config}",
        model_overrides=model_flags,
        train_overrides=train_flags,
    )


def _check_again_under_lock(args, resume) -> None:
    """The folder checks of ``_plan`` again, now that the lock keeps other writers out:
    between the first checks and the lock another run may have started, ended or moved on
    there. Raises ``UsageError`` (or ``RunDirError``) saying so."""
    from addnorm.tasks.run import has_run
    from addnorm.training.checkpoint import find_checkpoint
    from addnorm.training.run_dir import check_fresh_run_dir
    from addnorm.utils.files import CheckpointError

    if resume is None:
        if has_run(args.out) and not args.overwrite:
            raise UsageError(
                f"--out {args.out} now holds a run (another addnorm train wrote it meanwhile); "
                "add --resume to continue it or --overwrite to replace it"
            )
        check_fresh_run_dir(args.out, overwrite=args.overwrite)
        return
    try:
        newest = find_checkpoint(args.out)
    except CheckpointError as err:
        raise UsageError(f"--out {args.out} changed meanwhile: {err}") from None
    if newest != resume.path:
        raise UsageError(
            f"--out {args.out} changed meanwhile (another run wrote {newest.name}); run the "
            "command again to resume from the newest checkpoint"
        )


def _notes(task_name: str, plan: RunPlan) -> None:
    """What the task says of the run before it starts (a DiT training your images at a size
    other than theirs), one line each on stderr, the sizes it names written as their flags."""
    from addnorm.tasks.task import NotesRun

    if isinstance(plan.task, NotesRun):
        for note in plan.task.run_notes(plan.model_cfg):
            print(f"addnorm train {task_name}: {as_flags(note, ('image_size', 'patch_size'))}",
                  file=sys.stderr)


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
        budget += f" in a {train_cfg.max_minutes:g}-minute budget"
    from addnorm.training import distributed

    where = device
    if distributed.world_size() > 1:
        where += f" in each of {distributed.world_size()} processes"
    print(
        f"training {args.task} into {args.out} on {where}: {budget}; "
        "Ctrl-C (or SIGTERM) stops and writes a checkpoint",
        file=sys.stderr,
        flush=True,
    )


def _report(task_cls, summary) -> None:
    """What a finished run did, on stdout: steps and time, its held-out metric, its files, and
    what the task shows of its samples (an lm's continuations)."""
    from addnorm.tasks.task import ReportsFigures

    metric = summary.metrics["metric"]  # the task's headline (its data may decide which)
    compiled = summary.metrics.get("compile_s")
    print(
        f"trained {summary.step} steps in {summary.elapsed_s:.0f} s "
        f"(stopped by {summary.stopped_by}"
        + ("" if compiled is None else f"; first step with compiling: {compiled:.1f} s")
        + f"); checkpoint: {summary.checkpoint}"
    )
    print(
        f"{metric}: {summary.metrics[metric]:.4f} "
        f"({summary.metrics['weights']} weights); "
        f"metrics: {summary.run_dir / 'metrics.json'}"
        + ("" if summary.loss_png is None else f"; loss curve: {summary.loss_png}")
        + ("; TensorBoard: tensorboard --logdir " + str(summary.run_dir)
           if (summary.run_dir / "tensorboard").is_dir() else "")
    )
    watched = summary.run_dir / "watch.png"
    if watched.exists():
        print(f"inside the model: {watched} (addnorm info {summary.run_dir} summarises it)")
    if isinstance(task_cls, ReportsFigures):  # several figures (a dit on images, translate)
        print(task_cls.figures_text(summary.metrics), end="")
    print(task_cls.samples_text(summary.metrics["samples"]), end="")


def _is_terminal(stream) -> bool:
    """Whether ``stream`` is a terminal (no stream, as with stdout closed, is none)."""
    try:
        return stream is not None and stream.isatty()
    except (AttributeError, ValueError, OSError):
        return False
