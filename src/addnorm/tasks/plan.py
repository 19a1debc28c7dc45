"""Planning a training run before anything is built: which task, which model and train configs
(a new run's from the task's defaults or a preset, then a config's values, then overrides; a
resumed run's from its checkpoint), and whether they fit the memory of a device.

``addnorm train`` plans its runs here and :func:`addnorm.tasks.run.train_run` carries them
out; a library user can do the same without the command:

    plan = plan_fresh_run("lm", model_overrides={"n_layers": 2}, train_overrides={"max_steps": 50})
    check_run_fits(plan, "cpu")
    train_run(plan.task_name, plan.model_cfg, plan.train_cfg, "runs/lm", resume=plan.resume)

A plan that cannot train raises ``ValueError`` or ``TypeError`` naming the config field;
sizes no memory here holds raise ``RunSizeError`` (naming the setting to blame); a checkpoint
to resume that is missing, damaged or does not fit its own config raises ``CheckpointError``.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from addnorm.tasks.run import TASKS, presets_for, resume_configs
from addnorm.tasks.task import Task
from addnorm.training.checkpoint import LoadedCheckpoint, load_checkpoint
from addnorm.training.config import TrainConfig
from addnorm.training.sizes import SizeError
from addnorm.utils.checks import check_choice, check_known_fields

__all__ = [
    "TASK_OWNED",
    "RunPlan",
    "RunSizeError",
    "check_run_fits",
    "plan_fresh_run",
    "plan_resumed_run",
]

# Set by the task (vocabularies and special ids from its tokenizers; the date task's two
# vocabularies differ, so it never shares embeddings; the digits' size, channels and
# classes), so never by a config file or a flag.
TASK_OWNED = {
    "src_vocab_size",
    "tgt_vocab_size",
    "vocab_size",
    "pad_id",
    "bos_id",
    "eos_id",
    "share_embeddings",
    "input_size",
    "in_channels",
    "n_classes",
}


@dataclass(frozen=True)
class RunPlan:
    """What a training run is, decided before anything is built.

    Attributes:
        task_name: a key of ``addnorm.tasks.run.TASKS``.
        model_cfg, train_cfg: the run's configs (the model's before ``task.prepare``).
        resume: the checkpoint a resumed run continues; None for a new run.
    """

    task_name: str
    model_cfg: Any
    train_cfg: TrainConfig
    resume: LoadedCheckpoint | None = None

    @property
    def task_cls(self) -> type[Task]:
        return TASKS[self.task_name]


class RunSizeError(SizeError):
    """A run whose sizes cannot fit: ``setting`` (a config field, or None when no one setting
    is to blame) has ``value``, and ``reason`` says why that is too much."""

    def __init__(self, setting: str | None, value: object, reason: str) -> None:
        blame = f"{setting} {value}" if setting is not None else "these settings"
        super().__init__(f"{blame}: {reason}")
        self.setting, self.value, self.reason = setting, value, reason


def plan_fresh_run(
    task_name: str,
    *,
    preset: str | None = None,
    model_values: Mapping[str, Any] | None = None,
    train_values: Mapping[str, Any] | None = None,
    source: str = "",
    model_overrides: Mapping[str, Any] | None = None,
    train_overrides: Mapping[str, Any] | None = None,
) -> RunPlan:
    """A new run of ``task_name``: the task's default configs (or the model config named
    ``preset``), then ``model_values`` / ``train_values`` (a config file's, named by ``source``
    in errors), then the overrides; checked by the task. Raises ValueError or TypeError for an
    unknown task, preset or field, or configs the task cannot train."""
    task_cls = TASKS[check_choice("task_name", task_name, tuple(TASKS))]
    presets = presets_for(task_cls)
    if preset is not None:
        check_choice("preset", preset, tuple(presets))
    model_cfg = presets[preset] if preset else task_cls.default_model_config()
    train_cfg = task_cls.default_train_config()
    if model_values is not None:
        known = check_known_fields(type(model_cfg), model_values, source)
        model_cfg = dataclasses.replace(model_cfg, **known)
    if train_values is not None:
        known = check_known_fields(type(train_cfg), train_values, source)
        train_cfg = dataclasses.replace(train_cfg, **known)
    model_cfg = dataclasses.replace(model_cfg, **(model_overrides or {}))
    train_cfg = dataclasses.replace(train_cfg, **(train_overrides or {}))
    task = task_cls()
    task.check(task.prepare(model_cfg), train_cfg)
    return RunPlan(task_name, model_cfg, train_cfg)


def plan_resumed_run(
    task_name: str,
    run_dir: str | os.PathLike,
    *,
    train_overrides: Mapping[str, Any] | None = None,
) -> RunPlan:
    """The run in ``run_dir`` continued from its newest checkpoint: the checkpoint's configs,
    with ``train_overrides`` (only ``addnorm.tasks.run.RESUMABLE_FIELDS``) applied. Raises
    ``CheckpointError`` if the checkpoint is missing, damaged, or holds weights or optimizer
    state that do not fit its own model config (checked on the meta device, without memory),
    and ValueError if it is another task's or an override may not change."""
    checkpoint = load_checkpoint(run_dir)
    model_cfg, train_cfg = resume_configs(
        checkpoint, dict(train_overrides or {}), task_name=task_name
    )
    _check_resume_fits(TASKS[task_name], model_cfg, train_cfg, checkpoint)
    return RunPlan(task_name, model_cfg, train_cfg, resume=checkpoint)


def _check_resume_fits(task_cls, model_cfg, train_cfg: TrainConfig, resume) -> None:
    """Refuse (``CheckpointError``, naming the file and tensor) a checkpoint whose weights or
    optimizer state do not fit its own model config, before anything is built: the model is
    made on the meta device, shapes without memory."""
    import torch

    from addnorm.training.trainer import check_checkpoint_fits

    with torch.device("meta"):
        model = task_cls().build_model(model_cfg)
    check_checkpoint_fits(model, train_cfg, resume)


def check_run_fits(plan: RunPlan, device: str) -> None:
    """Refuse (``RunSizeError``, naming the setting, the estimate and the limit) a run whose
    model, batches or evaluation cannot fit in the memory ``device`` has now, before anything
    is allocated; see ``addnorm.training.sizes``."""
    from addnorm.training.sizes import (
        inference_bytes,
        largest_setting,
        replace_fields,
        training_bytes,
    )
    from addnorm.utils.memory import MAX_LAYERS, available_memory, format_bytes

    task_cls, model_cfg, train_cfg = plan.task_cls, plan.model_cfg, plan.train_cfg
    for name in ("n_layers", "n_encoder_layers", "n_decoder_layers"):
        value = getattr(model_cfg, name, None)
        if value is not None and value > MAX_LAYERS:
            raise RunSizeError(name, value, f"at most {MAX_LAYERS} layers per stack")
    task = task_cls()
    model_cfg = task.prepare(model_cfg)
    if task.name == "translate":
        _check_translate_eval_size(train_cfg.eval_size)
    length, eval_batch = _length_and_eval_batch(task, model_cfg, train_cfg)
    limit = available_memory(device)
    if limit is None:
        return
    checks = [
        ("train", lambda s: training_bytes(
            replace_fields(model_cfg, s), batch_size=s["batch_size"], length=_length(s, length),
            ema=train_cfg.ema_decay > 0)),
        ("evaluate", lambda s: inference_bytes(
            replace_fields(model_cfg, s), batch_size=eval_batch(s), length=_length(s, length))),
    ]
    settings = {**dataclasses.asdict(model_cfg), **dataclasses.asdict(train_cfg)}
    defaults = {
        **dataclasses.asdict(task.prepare(task_cls.default_model_config())),
        **dataclasses.asdict(task_cls.default_train_config()),
    }
    for what, estimate in checks:
        needed = estimate(settings)
        if needed > limit:
            culprit = largest_setting(estimate, settings, defaults) or _other_culprit(
                estimate, settings, defaults
            )
            raise RunSizeError(
                culprit or None,
                settings[culprit] if culprit else None,
                f"to {what} this model needs about {format_bytes(needed)} of memory, "
                f"more than the {format_bytes(limit)} available on {device}",
            )


def _other_culprit(estimate, settings: dict, defaults: dict) -> str | None:
    """The numeric setting outside ``sizes.SIZE_FIELDS`` (``d_freq``, ...) whose default value
    shrinks ``estimate`` the most, for a message that names a setting; None if none does."""
    best, best_value = None, estimate(settings)
    for key, value in settings.items():
        if isinstance(value, bool) or not isinstance(value, int) or value == defaults.get(key):
            continue
        try:
            smaller = estimate({**settings, key: defaults[key]})
        except (KeyError, ValueError, TypeError):  # no default, or it breaks a constraint
            continue
        if smaller < best_value:
            best, best_value = key, smaller
    return best


def _length(settings: dict, fixed: int | None) -> int:
    """Tokens per sequence: the task's fixed length, or the lm's ``seq_len``."""
    return settings["seq_len"] if fixed is None else fixed


def _length_and_eval_batch(task, model_cfg, train_cfg):
    """The tokens of one sequence (None: ``seq_len``) and the evaluation batch (a function of
    the settings) of ``task``."""
    if task.name == "translate":
        from addnorm.data.dates import longest_source_length
        from addnorm.tasks.translate import PREDICT_BATCH_SIZE

        return longest_source_length() + 12, lambda s: min(s["eval_size"], PREDICT_BATCH_SIZE)
    if task.name == "dit":  # every evaluation sample at once, twice over for guidance
        patches = (model_cfg.input_size // model_cfg.patch_size) ** 2
        return patches, lambda s: 2 * s["eval_size"]
    return None, lambda s: s["batch_size"]


def _check_translate_eval_size(eval_size: int) -> None:
    """The translate task scores ``eval_size`` test examples (a quarter as many validation
    ones) drawn from the distinct (test date, format) pairs; more would only repeat them."""
    from addnorm.data.dates import FORMATS, dates_in_split

    distinct = len(dates_in_split("test")) * len(FORMATS)
    if eval_size > distinct:
        raise RunSizeError(
            "eval_size",
            eval_size,
            f"the translate task has {distinct} distinct test examples "
            f"({len(dates_in_split('test'))} dates in {len(FORMATS)} formats); ask for at most "
            "that many",
        )
