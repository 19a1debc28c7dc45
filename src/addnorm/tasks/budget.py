"""A fresh run planned from its data and its time budget before it starts, and the plan it
prints (``addnorm train``, ``addnorm demo``).

:func:`budget_plan` decides, for the settings its caller did not choose (``given``):

1. the pace: with a time budget (or a model to size), a short measured warm-up of
   ``MEASURED_STEPS`` steps after an untimed one, on a scratch model, optimizer and batch
   source built as the run builds them (:func:`measure_pace`); the run itself starts afresh
   from its seed afterwards, so nothing of the warm-up reaches it;
2. on a user's data (its ``record`` is not None) without a model given (a preset, a config's
   model or a flag of ``MODEL_SIZE_FIELDS``): the model, sized from the data and the budget
   (:mod:`addnorm.tasks.model_size`), its peak lr scaled by ``d_model`` of the task's model
   over the new one's when that is wider (the width rule of muP for Adam, Yang et al. 2022:
   hidden layers' learning rates in proportion to 1 / width), and its pace measured again;
3. the steps: as given (``max_steps``, or ``epochs``: :func:`steps_for_epochs`, already
   applied by ``plan_fresh_run``); else on a user's data (or with ``fill_budget`` given on)
   as many as fit the budget, recorded as ``fill_budget``; else the task's own. Then, when
   they do not fit ``FIT_SHARE`` of the budget at the measured pace, the steps that do (the
   run finishes its schedule rather than being cut), the warm-up scaled with them unless
   given (:func:`scaled_warmup`).

A run still checks its pace in training and re-plans once if the machine turns out slower,
or, when its steps fill the budget (``steps_from`` "budget": on a user's data without
``max_steps`` or ``epochs``, or ``fill_budget`` given; recorded as ``TrainConfig.fill_budget``),
faster (:mod:`addnorm.training.budget`). An upward re-plan needs no cap from this plan: the
steps from the budget have none (no epoch cap), and the model-size rule's bounds only loosen
with more steps (``D >= r N`` holds for a larger ``D``; the data bound does not depend on
the steps). :class:`BudgetPlan` holds what was decided and words it
(:meth:`BudgetPlan.lines`).
"""

from __future__ import annotations

import dataclasses
import gc
import math
import statistics
import tempfile
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

import torch

from addnorm.tasks.model_size import MODEL_SIZE_FIELDS, SizeChoice, ladder, pick_size
from addnorm.tasks.task import DEFAULT_SIZE_RULE, AnyTask, SizeRule, TaskConfig, TrainsOnData
from addnorm.training import distributed
from addnorm.training.budget import check_steps, fitting_steps
from addnorm.training.config import TrainConfig
from addnorm.training.schedules import ScheduleConfig
from addnorm.training.trainer import Trainer, time_steps

__all__ = [
    "MEASURED_STEPS",
    "BudgetPlan",
    "Pace",
    "budget_plan",
    "data_examples",
    "measure_pace",
    "scaled_warmup",
    "steps_for_epochs",
]

# Timed steps of the measured warm-up (after one untimed step: allocation, compiling).
MEASURED_STEPS = 3
# The most steps epochs may come to (2**62: far past any run, inside an int64).
MAX_STEPS = 2**62


def data_examples(task: AnyTask, model_cfg: Any, train_cfg: TrainConfig,
                  task_cfg: TaskConfig) -> float | None:
    """The examples in the task's training data, ``train_size() / example_units``
    (:class:`~addnorm.tasks.task.Sizing`: a language model's windows); None for a task
    without a data object (:class:`~addnorm.tasks.task.TrainsOnData`)."""
    if not isinstance(task, TrainsOnData):
        return None
    units = task.sizing(model_cfg, train_cfg, task_cfg).example_units
    return task.data.train_size() / units


def steps_for_epochs(task: AnyTask, model_cfg: Any, train_cfg: TrainConfig,
                     task_cfg: TaskConfig) -> int:
    """The steps of ``train_cfg.epochs`` passes over the data:
    ``ceil(epochs * examples / (batch_size * grad_accum))`` (a global batch of ``batch_size``,
    whatever the processes). Raises ValueError for a task that does not say how much data it
    has, or epochs that come to more than ``MAX_STEPS``."""
    examples = data_examples(task, model_cfg, train_cfg, task_cfg)
    if examples is None or train_cfg.epochs is None:
        raise ValueError(f"epochs needs a task that knows its training data's size; the "
                         f"{task.name} task does not: give max_steps")
    steps = train_cfg.epochs * examples / (train_cfg.batch_size * train_cfg.grad_accum)
    if not steps <= MAX_STEPS:
        raise ValueError(f"epochs ({train_cfg.epochs:g}) come to {steps:.3g} steps of "
                         f"{train_cfg.batch_size * train_cfg.grad_accum} examples, more than "
                         f"the {MAX_STEPS:.3g} any run takes")
    return max(1, math.ceil(steps - 1e-9))


def scaled_warmup(warmup: int, steps_before: int, steps: int, schedule: str) -> int:
    """The warm-up for ``steps`` of a plan made for ``steps_before``: in proportion,
    ``round(warmup * steps / steps_before)``, at most ``steps``, and at least 1 where there
    was one (noam needs one)."""
    if warmup == 0:
        return 0
    scaled = min(round(warmup * steps / steps_before), steps)
    return max(scaled, 1 if warmup >= 1 or schedule == "noam" else 0)


@dataclass(frozen=True)
class Pace:
    """A measured warm-up: the median seconds of a step and the mean targets (the loss's
    count) a step trained on."""

    step_s: float
    targets_per_step: float


def measure_pace(task: AnyTask, model_cfg: Any, train_cfg: TrainConfig, task_cfg: TaskConfig,
                 device: str, *, steps: int = MEASURED_STEPS) -> Pace:
    """Train a scratch copy of the run (``model_cfg``, prepared, fresh weights; its own
    optimizer and batch source) for one untimed and ``steps`` timed steps on ``device`` and
    return their pace; nothing is written. With several processes every rank calls it (the
    steps are collectives), and the pace is the ranks' mean."""
    cfg = dataclasses.replace(train_cfg, max_minutes=None, checkpoint_every=0)
    with tempfile.TemporaryDirectory(prefix="addnorm-warmup-") as scratch:
        model = task.build_model(model_cfg).to(device)
        trainer = Trainer(
            model, task.loss_fn(task_cfg), task.batches(model_cfg, cfg, task_cfg), cfg,
            run_dir=scratch, schedule=ScheduleConfig("constant", cfg.lr, 0),
            metrics_file=False,
        )
        timed = time_steps(trainer, 1 + steps)[1:]
        del trainer, model
    gc.collect()
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()
    step_s = statistics.median(seconds for seconds, _ in timed)  # (a passing load: one step)
    (step_s,) = distributed.all_reduce_sum([step_s])
    targets = sum(count for _, count in timed) / len(timed)
    return Pace(step_s / distributed.world_size(), targets)


@dataclass(frozen=True)
class BudgetPlan:
    """What :func:`budget_plan` decided (see the module docstring), to be printed before the
    run starts.

    Attributes:
        model: the model config (prepared).
        parameters: its parameters.
        examples_per_step: the global batch, ``batch_size * grad_accum``.
        steps: the planned steps; ``warmup``, ``lr``: the schedule's.
        steps_from: what set them: "max_steps" (given), "epochs", "budget" (as many as fit)
            or "task" (the task's own).
        asked_steps: the steps before the budget shortened them (== ``steps`` if it did not).
        examples: the examples in the training data (None: unknown), ``data_size`` its
            ``train_size()`` and ``unit`` what that counts.
        pace: the measured warm-up (None: not measured).
        budget_s: the time budget in seconds (None: none).
        size: the sized model and why (None: the model kept); ``rule`` the rule it followed.
        fill: the steps fill the budget (``TrainConfig.fill_budget``): re-planned in training
            up as well as down.
    """

    model: Any
    parameters: int
    examples_per_step: int
    steps: int
    warmup: int
    lr: float
    steps_from: str
    asked_steps: int
    examples: float | None
    data_size: int | None
    unit: str
    pace: Pace | None
    budget_s: float | None
    size: SizeChoice | None = None
    rule: SizeRule | None = None
    fill: bool = False

    @classmethod
    def kept(cls, task: AnyTask, model_cfg: Any, train_cfg: TrainConfig,
             task_cfg: TaskConfig) -> BudgetPlan:
        """The plan of a run as its configs hold it (a resumed run's), not measured."""
        model = task.prepare(model_cfg)
        return cls(model, model.count_parameters(),
                   train_cfg.batch_size * train_cfg.grad_accum, train_cfg.max_steps,
                   train_cfg.warmup, train_cfg.lr, "max_steps", train_cfg.max_steps,
                   None, None, "examples", None,
                   None if train_cfg.max_minutes is None else 60 * train_cfg.max_minutes)

    @property
    def epochs(self) -> float | None:
        """The passes over the data the steps make (None: the data's size is unknown)."""
        if not self.examples:
            return None
        return self.steps * self.examples_per_step / self.examples

    @property
    def expected_s(self) -> float | None:
        """The training time the steps take at the measured pace."""
        return None if self.pace is None else self.steps * self.pace.step_s

    def lines(self) -> list[str]:
        """The plan in words, a few lines (each without a newline)."""
        shape = self.model.activation_shape()
        model = (f"model: {self.parameters:,} parameters (d_model {shape.d_model}, "
                 f"{shape.n_layers} layers, {shape.n_heads} heads)")
        if self.size is not None and self.rule is not None:
            model += ", sized " + _size_reason(self)
        epochs = "" if self.epochs is None else f" ({self.epochs:.3g} epochs"
        if epochs and self.data_size is not None:
            epochs += f" of {self.data_size:,} {self.unit}"
        epochs += ")" if epochs else ""
        source = {"max_steps": "as given", "epochs": "from --epochs",
                  "budget": "as many as fit the budget", "task": "the task's"}[self.steps_from]
        steps = (f"steps: {self.steps:,} of {self.examples_per_step} examples{epochs}, warm-up "
                 f"{self.warmup}, peak lr {self.lr:g}; {source}")
        if self.steps < self.asked_steps:
            steps += (f", fitted to the budget from {self.asked_steps:,} (the schedule ends "
                      "with them)")
        lines = [model, steps]
        if self.pace is not None:
            budget = ("" if self.budget_s is None
                      else f", in a {self.budget_s / 60:g}-minute budget")
            lines.append(
                f"expected: {_duration(self.expected_s or 0.0)} of training here{budget} "
                f"({self.pace.step_s:.3g} s a step, the median of a measured warm-up of "
                f"{MEASURED_STEPS} steps); {self._replan_words()}")
        return lines

    def _replan_words(self) -> str:
        """When the run is re-planned in training (:mod:`addnorm.training.budget`)."""
        checks = check_steps(self.warmup, self.steps)
        if self.fill and checks:
            return (f"re-planned once, down after its first steps if slower, or up after step "
                    f"{checks[-1]} if faster")
        return "re-planned once, after its first steps, if slower"


def _size_reason(plan: BudgetPlan) -> str:
    """Why the model has its size, for :meth:`BudgetPlan.lines`."""
    assert plan.size is not None and plan.rule is not None
    rule = plan.rule
    text = (f"from the data and the budget: at least {rule.targets_per_parameter:g} targets a "
            "parameter")
    if rule.max_epochs is not None:
        text += f" and no more parameters than {rule.max_epochs:g} epochs feed"
    bound = {"compute": "a larger one would see fewer", "data": "a larger one would need more "
             "epochs", "largest": "the largest shape", "smallest": "the smallest shape"}
    return f"{text} ({bound[plan.size.bound]})"


def _duration(seconds: float) -> str:
    """``75.2`` -> ``"1 min 15 s"``; under a minute ``"42 s"``."""
    whole = round(seconds)
    return f"{whole} s" if whole < 60 else f"{whole // 60} min {whole % 60} s"


def budget_plan(
    task: AnyTask,
    model_cfg: Any,
    train_cfg: TrainConfig,
    task_cfg: TaskConfig,
    device: str,
    *,
    given: Collection[str] = (),
    measure: Callable[..., Pace] | None = None,
) -> tuple[Any, TrainConfig, BudgetPlan]:
    """A fresh run's model config (prepared) and train config fitted to its data and budget,
    and the :class:`BudgetPlan` (see the module docstring); the settings named in ``given``
    are kept. ``measure``: the warm-up's measurement (None: :func:`measure_pace`; a test's
    fake). A pace of 0 seconds a step (a fake's) fits any steps."""
    measure = measure_pace if measure is None else measure
    model = task.prepare(model_cfg)
    budget_s = None if train_cfg.max_minutes is None else 60.0 * train_cfg.max_minutes
    examples = data_examples(task, model, train_cfg, task_cfg)
    user_data = isinstance(task, TrainsOnData) and task.data.record is not None
    sizing = user_data and not ({"preset", *MODEL_SIZE_FIELDS} & set(given))
    sizing = sizing and (budget_s is not None or train_cfg.epochs is not None)
    fill = _fill_given(train_cfg, given, budget_s)
    steps_from = ("epochs" if train_cfg.epochs is not None else
                  "max_steps" if "max_steps" in given else
                  "budget" if budget_s is not None and (user_data or fill) else "task")
    pace = None
    if budget_s is not None or sizing:
        pace = measure(task, model, train_cfg, task_cfg, device)
    size = rule = None
    if sizing and pace is not None and examples is not None:
        rule = getattr(task, "size_rule", DEFAULT_SIZE_RULE)
        size, model, train_cfg, pace = _sized(task, model, train_cfg, task_cfg, device, pace,
                                             examples, rule, given, measure)
    asked = train_cfg.max_steps
    steps = asked
    if pace is not None and budget_s is not None and pace.step_s > 0:
        fit = fitting_steps(budget_s, pace.step_s)
        steps = fit if steps_from == "budget" else min(asked, fit)
    if steps_from == "budget":
        asked = steps
    if steps != train_cfg.max_steps:
        warmup = train_cfg.warmup if "warmup" in given else scaled_warmup(
            train_cfg.warmup, train_cfg.max_steps, steps, train_cfg.schedule)
        train_cfg = dataclasses.replace(train_cfg, max_steps=steps, warmup=warmup)
    if steps_from == "budget" and fill is not False:  # (for the trainer, and checkpoints:
        train_cfg = dataclasses.replace(train_cfg, fill_budget=True)  # re-planned up too)
    data_size = task.data.train_size() if isinstance(task, TrainsOnData) else None
    unit = getattr(task.data, "unit", "examples") if isinstance(task, TrainsOnData) else ""
    plan = BudgetPlan(model, model.count_parameters(),
                      train_cfg.batch_size * train_cfg.grad_accum, steps, train_cfg.warmup,
                      train_cfg.lr, steps_from, asked, examples, data_size, unit, pace,
                      budget_s, size, rule, bool(train_cfg.fill_budget))
    return model, train_cfg, plan


def _fill_given(train_cfg: TrainConfig, given: Collection[str], budget_s: float | None
                ) -> bool | None:
    """``fill_budget`` as the caller gave it (None: not given). Raises ValueError for one
    given on that has no budget to fill or whose steps ``max_steps`` or ``epochs`` set."""
    if "fill_budget" not in given or train_cfg.fill_budget is None:
        return None
    if train_cfg.fill_budget:
        if budget_s is None:
            raise ValueError("fill_budget needs a time budget to fill: give max_minutes")
        if train_cfg.epochs is not None or "max_steps" in given:
            setting = ("epochs" if train_cfg.epochs is not None else "max_steps")
            raise ValueError(f"fill_budget and {setting} both set the steps: give one")
    return train_cfg.fill_budget


def _sized(task: AnyTask, model: Any, train_cfg: TrainConfig, task_cfg: TaskConfig,
           device: str, pace: Pace, examples: float, rule: SizeRule, given: Collection[str],
           measure: Callable[..., Pace]) -> tuple[SizeChoice, Any, TrainConfig, Pace]:
    """The model the rule picks (its lr scaled when wider, unless ``lr`` is given) and its
    measured pace."""
    sizing = task.sizing(model, train_cfg, task_cfg)
    per_example = pace.targets_per_step / (train_cfg.batch_size * train_cfg.grad_accum)
    epochs = train_cfg.epochs
    choice = pick_size(
        ladder(model), rule=rule, reference=model, reference_step_s=pace.step_s,
        length=sizing.length, targets_per_step=pace.targets_per_step,
        unique_targets=examples * per_example,
        budget_s=None if train_cfg.max_minutes is None else 60.0 * train_cfg.max_minutes,
        epochs=epochs,
    )
    if "lr" not in given and choice.cfg.d_model > model.d_model:
        train_cfg = dataclasses.replace(train_cfg, lr=train_cfg.lr * model.d_model
                                        / choice.cfg.d_model)
    if choice.cfg != model:
        pace = measure(task, choice.cfg, train_cfg, task_cfg, device)
    return choice, choice.cfg, train_cfg, pace
