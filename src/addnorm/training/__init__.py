"""Training: a generic trainer (AdamW, schedules, clipping, accumulation, bf16, EMA, budgets,
exact resume) with its loop in ``trainer`` and what surrounds it one concern a module
(``wrapping``, ``checkpoint_state``, ``stopping``, ``step_boundary``, ``step_errors``,
``probes``, ``record_window``, ``callbacks`` and the ``trainer_state`` they see, ``clock``,
``optimizer``, ``resume``), atomic safetensors checkpoints, metrics, run folders, memory
estimates and data parallelism. The tasks that wire it to the models live above it, in
:mod:`addnorm.tasks`."""

from addnorm.training.callbacks import Callback
from addnorm.training.checkpoint import load_checkpoint, save_checkpoint
from addnorm.training.config import TrainConfig
from addnorm.training.ema import make_ema
from addnorm.training.logger import Logger, TensorBoardLogger
from addnorm.training.schedules import ScheduleConfig, noam_lr
from addnorm.training.trainer import Trainer
from addnorm.training.trainer_io import TrainResult
from addnorm.training.trainer_state import TrainerState
from addnorm.utils.files import CheckpointError

__all__ = [
    "Callback",
    "CheckpointError",
    "Logger",
    "ScheduleConfig",
    "TensorBoardLogger",
    "TrainConfig",
    "TrainResult",
    "Trainer",
    "TrainerState",
    "load_checkpoint",
    "make_ema",
    "noam_lr",
    "save_checkpoint",
]
