"""``Task``: what planning a run, training it and reading it back need from a task, typed by
the task's model config, model and task config; ``TaskConfig``, the base of a task's own
settings.

A task is a class that meets :class:`Task`, registered under its ``name``
(:func:`addnorm.tasks.registry.register_task`); ``translate``, ``lm`` and ``dit`` are. The
generic code (``plan``, ``run``, ``addnorm train``) calls only these hooks, so a new task adds
no branch there:

- planning, before anything is built: the defaults (``default_model_config``,
  ``default_train_config``, ``default_task_config``), the task a new run trains with its
  settings (``from_config``; a resumed run's comes from ``from_dict``), the family's named
  configs (``presets``), the model fields the task sets (``owned_fields``, filled in by
  ``prepare``), the checks that the configs can train it (``check``) and the sizes its
  sequences and evaluation take (``sizing``, read by the memory estimates);
- training: ``build_model``, ``batches``, ``loss_fn``, ``probe``;
- a finished run: ``evaluate_run`` (the held-out figures, ``metric`` the headline one),
  ``run_samples`` (JSON for ``metrics.json``) and ``samples_text`` (what ``addnorm train``
  prints of them);
- saving: ``to_dict`` / ``from_dict`` (what a checkpoint needs to rebuild the task, such as its
  tokenizers) and ``config_from_dict`` (its model config).

A task that trains on a data object (``data``, a :class:`~addnorm.tasks.data_source.DataSource`
that knows its ``train_size()``) meets :class:`TrainsOnData`: its runs can count steps in
epochs and, on a user's data, size their model from the data and the time budget by the
task's :class:`SizeRule` (``size_rule``, optional; :mod:`addnorm.tasks.budget`).
A task that can score weights on its validation split while training runs meets
:class:`Validates` (an optional hook, ``validation``): a run keeps its best checkpoint by it
and stops early with it (:mod:`addnorm.training.best`).

A task trained on a user's files may also write files of its own into the run folder, such as
the record of its data (``data.json``) and its tokenizer (``tokenizer.json``): it meets
:class:`WritesRunFiles` as well (an optional hook; the run writes what ``run_files`` returns
when it starts, and a resumed run's ``check`` refuses data that changed since). A task that
does with a user's data what the user did not ask for (the DiT resizing their images) meets
:class:`NotesRun` too, and ``addnorm train`` prints its ``run_notes`` before training.

The settings of a run are three frozen configs: the model's (the family's config), the
trainer's (:class:`~addnorm.training.config.TrainConfig`) and the task's own (a
:class:`TaskConfig`: its loss's label smoothing, its window length, its held-out evaluation).
The command line and a ``--config`` file's ``"train"`` object hold the last two together,
and so does a checkpoint's ``train_config``; :func:`split_train_settings` tells them apart.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, TypeVar, runtime_checkable

from torch import nn

from addnorm.family import FamilyConfig
from addnorm.tasks.data_source import DataSource
from addnorm.training.best import Validation
from addnorm.training.config import FORMER_FIELDS, TrainConfig
from addnorm.training.probes import Probe
from addnorm.training.trainer_io import BatchSource, LossFn
from addnorm.utils.checks import check_known_fields

__all__ = [
    "AnyTask",
    "DEFAULT_SIZE_RULE",
    "ModelConfig",
    "SizeRule",
    "Sizing",
    "Task",
    "TaskConfig",
    "NotesRun",
    "ReportsFigures",
    "TrainsOnData",
    "Validates",
    "WritesRunFiles",
    "split_train_settings",
]


class ModelConfig(FamilyConfig, Protocol):
    """A task's model config: a frozen dataclass of its family that sizes its model and
    saves itself as JSON."""

    def to_dict(self) -> dict:
        """The fields as JSON (read back by the task's ``config_from_dict``)."""
        ...


_Config = TypeVar("_Config", bound="TaskConfig")


@dataclass(frozen=True)
class TaskConfig:
    """The base of a task's own settings: a frozen dataclass whose fields sit beside
    ``TrainConfig``'s on the command line (one flag each, its help from the subclass's
    ``Attributes:`` section), in a ``--config`` file's ``"train"`` object and in a
    checkpoint's ``train_config``; so their names differ from ``TrainConfig``'s. A subclass
    checks its fields in ``__post_init__``.

    ``resumable``: the fields a resumed run may change (those that only the evaluation at
    the end reads); any other change would break exact resume.
    """

    resumable: ClassVar[tuple[str, ...]] = ()

    def to_dict(self) -> dict:
        """A JSON-ready dict of the fields."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls: type[_Config], data: dict) -> _Config:
        """Build from a dict; unknown keys raise ValueError naming them and the known ones."""
        return cls(**check_known_fields(cls, data, f"{cls.__name__}.from_dict"))


@dataclass(frozen=True)
class Sizing:
    """The sizes a task's run takes beyond its model config's, for the memory estimates
    (:mod:`addnorm.training.sizes`).

    Attributes:
        length: tokens (or patches) of one training sequence.
        eval_batch: sequences the held-out evaluation runs at once.
        example_units: how much of the data's ``train_size()`` one training example (a row of
            a batch) covers: a language model's window of tokens; 1 where the data counts
            examples (pairs, images). An epoch is ``train_size() / example_units`` examples.
    """

    length: int
    eval_batch: int
    example_units: int = 1


@dataclass(frozen=True)
class SizeRule:
    """How a run on a user's data sizes its model (:mod:`addnorm.tasks.model_size`): the
    largest model whose every parameter the run trains on at least ``targets_per_parameter``
    targets (the loss's: tokens, images), and that the data can feed at most
    ``max_epochs`` passes' worth of (None: no such bound).

    Attributes:
        targets_per_parameter: r, the targets a parameter is trained on at least.
        max_epochs: the passes over the data whose targets, ``r`` a parameter, bound the
            parameters; None for none.
    """

    targets_per_parameter: float = 20.0
    max_epochs: float | None = 4.0


# Language: 20 tokens a parameter (Hoffmann et al. 2022, the compute-optimal ratio) and no
# more parameters than 4 epochs of the data give 20 tokens each (Muennighoff et al. 2023:
# up to about 4 epochs, repeated tokens are worth nearly as much as new ones).
DEFAULT_SIZE_RULE = SizeRule()


ModelConfigT = TypeVar("ModelConfigT", bound=ModelConfig)
ModelT = TypeVar("ModelT", bound=nn.Module)
TaskConfigT = TypeVar("TaskConfigT", bound=TaskConfig)
_Task = TypeVar("_Task")


class Task(Protocol[ModelConfigT, ModelT, TaskConfigT]):
    """A trainable task: data, loss, model, held-out evaluation and display samples (see the
    module docstring for when each hook is called).

    Attributes:
        name: the task's name (``addnorm train NAME``, a checkpoint's ``run.task``).
        description: one line for ``addnorm train --help``.
        metric: the key of the headline figure of ``evaluate_run`` (a class attribute, or a
            property where the data decides: a DiT on one class has no class agreement).
        owned_fields: the model config fields ``prepare`` sets (vocabulary sizes, special
            ids, image size ...), never a flag or a config file.
        loss_label: the y label of the loss curve.
    """

    name: ClassVar[str]
    description: ClassVar[str]
    owned_fields: ClassVar[frozenset[str]]
    loss_label: str

    @property
    def metric(self) -> str:
        """The key of the headline figure of ``evaluate_run``."""
        ...

    @staticmethod
    def default_model_config() -> ModelConfigT:
        """The model config a new run starts from (before ``prepare``)."""
        ...

    @staticmethod
    def default_train_config() -> TrainConfig:
        """The trainer settings a new run starts from."""
        ...

    @staticmethod
    def default_task_config() -> TaskConfigT:
        """The task settings a new run starts from."""
        ...

    @staticmethod
    def presets() -> Mapping[str, ModelConfigT]:
        """The named model configs a run can start from (``--preset``): its family's."""
        ...

    @staticmethod
    def config_from_dict(data: dict) -> ModelConfigT:
        """The model config saved by its ``to_dict``."""
        ...

    @classmethod
    def from_config(cls: type[_Task], task_cfg: TaskConfigT) -> _Task:
        """The task a new run with ``task_cfg`` trains (what it reads from the settings,
        such as its data, built here; a resumed run's task comes from ``from_dict``)."""
        ...

    def prepare(self, cfg: ModelConfigT) -> ModelConfigT:
        """``cfg`` with the ``owned_fields`` this task's data sets."""
        ...

    def check(self, cfg: ModelConfigT, train_cfg: TrainConfig, task_cfg: TaskConfigT) -> None:
        """Raise ValueError naming the setting if the configs cannot train this task."""
        ...

    def sizing(self, cfg: ModelConfigT, train_cfg: TrainConfig, task_cfg: TaskConfigT) -> Sizing:
        """The sizes a run with these (prepared) configs takes; raises
        :class:`~addnorm.training.sizes.RunSizeError` for a size the task cannot take."""
        ...

    def build_model(self, cfg: ModelConfigT) -> ModelT:
        """A fresh model for ``cfg`` (call ``prepare`` first)."""
        ...

    def batches(
        self, cfg: ModelConfigT, train_cfg: TrainConfig, task_cfg: TaskConfigT
    ) -> BatchSource:
        """The training batch source, seeded by ``train_cfg.seed``."""
        ...

    def loss_fn(self, task_cfg: TaskConfigT) -> LossFn:
        """``(model, batch) -> (mean loss, n_tokens)``."""
        ...

    def probe(self, task_cfg: TaskConfigT) -> Probe | None:
        """A look at quality during training (plotted against training time), or None."""
        ...

    def evaluate_run(self, model: ModelT, task_cfg: TaskConfigT) -> dict[str, float]:
        """The held-out figures of a finished run (``metric`` among them)."""
        ...

    def run_samples(self, model: ModelT) -> list[dict[str, Any]]:
        """A few samples of a finished run, as JSON for its ``metrics.json``."""
        ...

    @staticmethod
    def samples_text(samples: list[dict[str, Any]]) -> str:
        """What ``addnorm train`` prints of ``run_samples``'s output ("" for nothing)."""
        ...

    def to_dict(self) -> dict:
        """What a checkpoint needs to rebuild this task (JSON)."""
        ...

    @classmethod
    def from_dict(cls: type[_Task], data: dict) -> _Task:
        """Rebuild from ``to_dict``'s output."""
        ...


# A task of any model config, model and task config: what the generic code holds.
AnyTask = Task[Any, Any, Any]


@runtime_checkable
class WritesRunFiles(Protocol):
    """A task that keeps files of its own in the run folder (``run_files``), written by rank 0
    when a run starts (atomically; a resumed run writes them again). Their names must be among
    ``addnorm.training.run_dir.RUN_FILES``, so that replacing the run deletes them."""

    def run_files(self) -> dict[str, str]:
        """File name -> UTF-8 text, e.g. ``{"data.json": ..., "tokenizer.json": ...}``."""
        ...


@runtime_checkable
class NotesRun(Protocol):
    """A task whose run does with a user's data what the user did not ask for, and says so
    before training (``addnorm train`` prints each line on stderr): the DiT training a user's
    images at a size other than theirs."""

    def run_notes(self, cfg: Any) -> list[str]:
        """Lines (no newline) about a run of the model config ``cfg``; [] for none."""
        ...


@runtime_checkable
class Validates(Protocol):
    """A task that scores weights on its validation split while training runs (the best
    checkpoint, early stopping: :mod:`addnorm.training.best`)."""

    def validation(self, task_cfg: Any) -> Validation:
        """How a run with ``task_cfg`` scores its weights on the validation split (never the
        split ``evaluate_run`` reports as test figures), the metric that ranks them and its
        direction, and whether a run keeps its best by default (a run on a user's data)."""
        ...


@runtime_checkable
class TrainsOnData(Protocol):
    """A task that trains on a data object which knows how much there is to train on
    (``data.train_size()``), and whose ``record`` is not None for a user's files. It may
    declare its model :class:`SizeRule` as ``size_rule`` (else ``DEFAULT_SIZE_RULE``)."""

    data: DataSource


@runtime_checkable
class ReportsFigures(Protocol):
    """A task (class) whose finished run reports more held-out figures than its headline
    (``addnorm train`` prints ``figures_text`` after the headline): the DiT on a user's
    images, whose quality is several figures; the translator's error rates."""

    @staticmethod
    def figures_text(metrics: Mapping[str, Any]) -> str:
        """Lines (each ending in a newline; "" for none) of a run's ``metrics.json``."""
        ...


def split_train_settings(
    task_cls: type[AnyTask], values: Mapping[str, Any], where: str = ""
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``values`` (a ``"train"`` object: ``TrainConfig`` fields and the task config's) split
    into the trainer's and the task's. ``FORMER_FIELDS`` that the task has no field for are
    dropped (earlier versions kept them in ``TrainConfig``, and this task ignored them); any
    other key raises ValueError naming it and the known ones (``where`` starts the message).
    """
    if not isinstance(values, Mapping):
        raise TypeError(f"{where + ': ' if where else ''}train settings must be a dict, got "
                        f"{type(values).__name__}")
    trainer_fields = {f.name for f in dataclasses.fields(TrainConfig)}
    task_fields = {f.name for f in dataclasses.fields(task_cls.default_task_config())}
    unknown = sorted(set(values) - trainer_fields - task_fields - set(FORMER_FIELDS))
    if unknown:
        prefix = f"{where}: " if where else ""
        raise ValueError(
            f"{prefix}unknown train keys {unknown} for the {task_cls.name} task; known keys "
            f"are {sorted(trainer_fields | task_fields)}"
        )
    trainer = {k: v for k, v in values.items() if k in trainer_fields}
    task = {k: v for k, v in values.items() if k in task_fields}
    return trainer, task
