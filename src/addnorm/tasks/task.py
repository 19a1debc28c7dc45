"""``Task``: what the run orchestration (``addnorm.tasks.run``) and the CLI need from a
task.

``TranslateTask``, ``LMTask`` and ``DiTTask`` meet it; ``addnorm.tasks.run.TASKS`` maps task
names to their classes.
Model configs and models are typed loosely here (each task takes its own config class and
model), and each task narrows them in its own signatures.
"""

from __future__ import annotations

from typing import Any, Protocol

from torch import nn

from addnorm.training.config import TrainConfig
from addnorm.training.trainer import Probe

__all__ = ["Task"]


class Task(Protocol):
    """A trainable task: data, loss, model, held-out evaluation and display samples."""

    name: str
    description: str
    metric: str
    loss_label: str  # the y label of the loss curve

    @staticmethod
    def default_model_config() -> Any: ...

    @staticmethod
    def default_train_config() -> TrainConfig: ...

    def prepare(self, cfg: Any) -> Any: ...

    def check(self, cfg: Any, train_cfg: TrainConfig) -> None: ...

    def build_model(self, cfg: Any) -> nn.Module: ...

    def batches(self, train_cfg: TrainConfig, cfg: Any) -> Any: ...

    def loss_fn(self, train_cfg: TrainConfig) -> Any: ...

    def evaluate_run(self, model: Any, train_cfg: TrainConfig) -> dict[str, Any]: ...

    def probe(self, train_cfg: TrainConfig) -> Probe | None:
        """A look at quality during training (plotted against training time), or None."""
        ...

    def run_samples(self, model: Any) -> list[dict[str, str]]: ...

    @staticmethod
    def config_from_dict(data: dict) -> Any: ...

    def to_dict(self) -> dict: ...

    @classmethod
    def from_dict(cls, data: dict) -> Task: ...
