"""``addnorm train TASK``: a fresh run, a resumed one, or one rank of a ``torchrun`` launch.

The run folder is checked before anything is built (``RunDirError`` and bad settings are
usage errors, exit code 2); a run stopped by Ctrl-C or SIGTERM ends after a checkpoint of the
current step, with exit code 130 or 143 and the command that resumes it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys

from addnorm._checks import check_known_fields
from addnorm.cli.checks import (
    UsageError,
    apply_runtime_flags,
    check_out_dir,
    check_run_sizes,
    read_config,
)
from addnorm.cli.exits import EXIT_OK, SIGNAL_STOPS, exit_on_sigterm, report_signal_stop
from addnorm.training.config import TrainConfig

__all__ = ["as_flags", "run_train"]


@exit_on_sigterm
def run_train(args) -> int:
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
    from addnorm.training.run_dir import (
        RunDirError,
        RunLock,
        check_fresh_run_dir,
        check_unlocked,
    )

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
            _check_resume_fits(task_cls, model_cfg, train_cfg, resume)
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
        message = " ".join(str(err).split())
        raise UsageError(as_flags(message, [*model_flags, *train_flags])) from None
    except RunDirError as err:
        raise UsageError(str(err)) from None
    if train_cfg.fsdp and not distributed.in_process_group():
        raise UsageError(
            "--fsdp shards the model over the processes of a torchrun launch: "
            f"torchrun --nproc-per-node N -m addnorm train {args.task} --fsdp ..."
        )
    distributed.barrier()  # every rank has checked the folder before rank 0 writes it
    main = distributed.is_main()
    try:
        # Rank 0 takes the folder's lock before saying anything, so a writer that loses a race
        # for it prints one line (the error); train_run's own lock passes through this one.
        with RunLock(args.out, reentrant=True) if main else contextlib.nullcontext():
            if main:
                _check_again_under_lock(args, resume)
                _announce(args, train_cfg, device)
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
        return report_signal_stop(summary, args.task)
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


def _check_resume_fits(task_cls, model_cfg, train_cfg: TrainConfig, resume) -> None:
    """Refuse (``CheckpointError``, exit 1, naming the file and tensor) a checkpoint whose
    weights or optimizer state do not fit its own model config, before anything is built:
    the model is made on the meta device, shapes without memory."""
    import torch

    from addnorm.training.trainer import check_checkpoint_fits

    with torch.device("meta"):
        model = task_cls().build_model(model_cfg)
    check_checkpoint_fits(model, train_cfg, resume)


def _check_again_under_lock(args, resume) -> None:
    """The folder checks of ``_train_here`` again, now that the lock keeps other writers out:
    between the first checks and the lock another run may have started, ended or moved on
    there. Raises ``UsageError`` (or ``RunDirError``) saying so."""
    from addnorm.safe_files import CheckpointError
    from addnorm.tasks.run import has_run
    from addnorm.training.checkpoint import find_checkpoint
    from addnorm.training.run_dir import check_fresh_run_dir

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


def as_flags(message: str, fields) -> str:
    """``message`` (a config's error) with each of ``fields`` written as the flag that set it:
    ``lr must be finite, got nan`` -> ``--lr must be finite, got nan``."""
    import re

    for name in sorted(fields, key=len, reverse=True):  # max_len before len-like prefixes
        flag = "--" + name.replace("_", "-")
        message = re.sub(rf"(?<![\w-]){re.escape(name)}(?!\w)", flag, message)
    return message


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
