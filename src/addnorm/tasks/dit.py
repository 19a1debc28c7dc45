"""The ``dit`` task: a class-conditional Diffusion Transformer on images
(:mod:`addnorm.tasks.dit_data`: scikit-learn's digits, or a user's images,
``DiTTaskConfig.data``).

Training follows DiT (Peebles & Xie, 2023): for each image ``x0`` of class ``y`` a timestep
``t`` and noise ``eps`` are drawn (by the batch source, so a resumed run sees the same
draws), the model predicts from ``q_sample(x0, t, eps)``, ``t`` and ``y`` (``y`` replaced by
the null class with probability ``class_dropout``), and the loss is the mean squared error
(plus the variational term when ``learn_sigma``). What it predicts is the task's
``prediction``: ``v = sqrt(abar) eps - sqrt(1 - abar) x0`` by default (Salimans & Ho, 2022),
with the Min-SNR weighting (Hang et al., 2023); runs saved before these settings existed
were trained on ``eps`` with an unweighted loss and load as such. Why the defaults are what
they are: ``docs/task-defaults.md``.

At the end, samples are generated for every class and scored by the data's judge
(:mod:`addnorm.tasks.dit_evaluation`, the base of :class:`DiTTask` that draws and scores them).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar, Literal

import torch
from torch import nn

from addnorm.data.fingerprint import DataRecord
from addnorm.data.flips import with_flips
from addnorm.data.images import DEFAULT_VAL_FRACTION, ImageCorpus
from addnorm.data.sampler import SampledBatches
from addnorm.diffusion import Diffusion
from addnorm.dit import DIT_PRESETS, DiT, DiTConfig
from addnorm.tasks.data_settings import check_image_settings
from addnorm.tasks.dit_data import ImageData, image_data
from addnorm.tasks.dit_evaluation import DiTEvaluation
from addnorm.tasks.dit_latents import check_vae_setting, latent_data_for, latent_data_from_dict
from addnorm.tasks.task import SizeRule, Sizing, TaskConfig
from addnorm.training.config import TrainConfig
from addnorm.training.trainer import LossFn
from addnorm.utils.checks import check_bool, check_choice, check_float, check_int

__all__ = ["DiTTask", "DiTTaskConfig"]

# The --data recipe's patches a side (``DiTTask.data_recipe``): the digits default's 8x8 at
# patch size 2, whose steps and quality docs/task-defaults.md measures.
RECIPE_PATCHES = 4
RECIPE_PATCH_SIZES = (2, 4, 8)


@dataclass(frozen=True)
class DiTTaskConfig(TaskConfig):
    """The DiT task's own settings.

    Attributes:
        eval_size: samples generated and scored at the end, spread evenly over the classes.
        data: your images to train on: a folder with one subfolder of images per class (a
            folder of images alone: one class, unconditional), any format Pillow reads, or
            an .npz file with an images array and optional labels; none = scikit-learn's 8x8
            digits.
        image_size: the side your images are center-cropped and resized to (with data;
            none = their own side, at most 8 patches of the model's patch_size: 16 at the
            default patch_size 2; a run says when that is not their size, and why).
        val_fraction: the share of each class's images held out for scoring, in (0, 0.5]
            (with data).
        prediction: what the model learns to predict: v (the default, Salimans & Ho) or
            epsilon, the noise (DiT's).
        min_snr_gamma: the loss's Min-SNR-gamma weighting (Hang et al.; 5 is their value),
            or none to weigh every step alike (DiT's loss).
        follow_links: read the links in a data folder that lead outside it (without it they
            are skipped, and named).
        vae: train on the latents of this VAE (with data): a diffusers AutoencoderKL folder
            or a DiT pipeline folder (its vae/); images are encoded once into a cache, and
            samples decoded by it (addnorm.tasks.dit_latents). None: on the pixels.
        flip: mirror each training image left to right with probability 1/2, the DiT
            reference's augmentation (addnorm.data.flips): for photos of things, whose
            class a mirror keeps; off by default, since it changes the class of writing
            (digits, letters) and the data cannot say which it holds.
    """

    resumable: ClassVar[tuple[str, ...]] = ("eval_size",)

    eval_size: int = 500
    data: str | None = None
    image_size: int | None = None
    val_fraction: float = DEFAULT_VAL_FRACTION
    prediction: Literal["v", "epsilon"] = "v"
    min_snr_gamma: float | None = 5.0
    follow_links: bool = False
    vae: str | None = None
    flip: bool = False

    def __post_init__(self) -> None:
        check_int("eval_size", self.eval_size, min_value=1)
        check_bool("flip", self.flip)
        check_choice("prediction", self.prediction, ("v", "epsilon"))
        check_bool("follow_links", self.follow_links)
        if self.min_snr_gamma is not None:
            check_float("min_snr_gamma", self.min_snr_gamma, min_value=0.0, min_inclusive=False)
        check_image_settings(self)
        check_vae_setting(self)


class DiTTask(DiTEvaluation):
    """Everything the trainer and the CLI need to know about the DiT task.

    Args:
        n_steps: the diffusion's timesteps (DiT: 1000).
        schedule: its beta schedule (``"linear"``, DiT's, or ``"cosine"``).
        prediction: what the model predicts, ``"v"`` (the default) or ``"epsilon"`` (DiT's).
        min_snr_gamma: the loss's Min-SNR weighting (:class:`~addnorm.diffusion.Diffusion`),
            5 by default (Hang et al.'s value); None weighs every step alike (DiT's loss).
        data: the images (:func:`~addnorm.tasks.dit_data.image_data`): an
            :class:`~addnorm.tasks.dit_data.ImageData`, an :class:`~addnorm.data.ImageCorpus`
            (a user's), the :class:`~addnorm.data.fingerprint.DataRecord` of one (a run read
            back from its checkpoint: the files are opened, and checked unchanged, when
            training or scoring needs them; sampling never does), or None: scikit-learn's
            digits.
        image_size: the side a user's images are resized to; None: for an
            ``ImageCorpus``, the side :func:`~addnorm.tasks.dit_data.default_image_size`
            picks (their own, at most ``MAX_DEFAULT_PATCHES`` patches a side), for a
            ``DataRecord`` (a trained run's) the model config's ``input_size``
            (``prepare``).

    Attributes:
        data: the images (:class:`~addnorm.tasks.dit_data.ImageData`).
    """

    name: ClassVar[str] = "dit"
    description: ClassVar[str] = (
        "class-conditional Diffusion Transformer on scikit-learn's 8x8 digits, or on your "
        "images (--data)"
    )
    owned_fields: ClassVar[frozenset[str]] = frozenset({"input_size", "in_channels", "n_classes"})
    # A run on your images sizes its model at the digits default's ratio: 500 steps of 64
    # images for 723,844 parameters, 0.044 images a parameter (docs/task-defaults.md), with
    # no bound from the data (every step draws fresh noise and timesteps for its images).
    size_rule: ClassVar[SizeRule] = SizeRule(targets_per_parameter=0.04, max_epochs=None)

    def __init__(
        self,
        *,
        n_steps: int = 1000,
        schedule: str = "linear",
        prediction: str = "v",
        min_snr_gamma: float | None = 5.0,
        data: ImageData | ImageCorpus | DataRecord | None = None,
        image_size: int | None = None,
    ) -> None:
        self.diffusion = Diffusion(
            n_steps=n_steps, schedule=schedule, prediction=prediction, min_snr_gamma=min_snr_gamma
        )
        self.n_steps, self.schedule, self.prediction = n_steps, schedule, prediction
        self.min_snr_gamma = min_snr_gamma
        target = "noise" if prediction == "epsilon" else "velocity v"
        self.loss_label = f"loss (mean squared error of the predicted {target})"
        self.data = image_data(data, image_size)
        self.class_names = self.data.class_names
        self.channels = self.data.channels
        self._checked_size = None

    @property
    def record(self) -> DataRecord | None:
        """The record of a user's images; None for the digits."""
        return self.data.record

    @property
    def pixel_max(self) -> float:
        """The top of the samples' pixel scale: 16 for the digits, 255 for a user's images."""
        return self.data.pixel_max

    @property
    def corpus(self) -> ImageCorpus:
        """A user's images (opened again, and checked unchanged, for a run read back from its
        checkpoint); ValueError for the digits, which have none."""
        return self.data.corpus

    def class_index(self, name: str) -> int:
        """The id of the class named ``name``; ValueError listing the names otherwise."""
        if name in self.class_names:
            return self.class_names.index(name)
        shown = ", ".join(self.class_names[:20]) + (", ..." if len(self.class_names) > 20
                                                     else "")
        raise ValueError(f"class must be one of the run's {len(self.class_names)} classes "
                         f"({shown}), got {name!r}")

    @staticmethod
    def default_model_config() -> DiTConfig:
        """The digits preset at d_model 96 (the preset has 128): as good on the digits, in
        less time (docs/task-defaults.md)."""
        return dataclasses.replace(DIT_PRESETS["DiT-digits"], d_model=96)

    @staticmethod
    def default_train_config() -> TrainConfig:
        """500 steps of 64 digits at a peak learning rate of 3e-3 (50 warm-up steps, then a
        cosine to 5%), scored with the EMA of the weights at decay 0.99 with its warm-up
        (``ema_warmup``: the decay ``min(0.99, (1 + n) / (10 + n))`` is 0.982 at the last of
        500 steps, a horizon of about 57 steps, so the zero-output initial weights are
        forgotten within tens of steps); the time cap only guards a machine too busy to
        finish (docs/task-defaults.md)."""
        return TrainConfig(
            max_steps=500,
            max_minutes=5.0,
            batch_size=64,
            lr=3e-3,
            schedule="cosine",
            warmup=50,
            final_lr_fraction=0.05,
            weight_decay=0.0,
            beta2=0.999,
            grad_clip=1.0,
            ema_decay=0.99,
            ema_warmup=True,
            checkpoint_every=250,
            log_every=25,
        )

    @staticmethod
    def default_task_config() -> DiTTaskConfig:
        """500 samples scored at the end, 50 per class."""
        return DiTTaskConfig()

    @staticmethod
    def presets() -> Mapping[str, DiTConfig]:
        """The DiT's named configs (``DIT_PRESETS``: the paper's and the digits')."""
        return DIT_PRESETS

    def prepare(self, cfg: DiTConfig) -> DiTConfig:
        """``cfg`` with the digits' image size, one channel and ten classes; or a user's
        images' size (``image_size``; else the data's default, or a trained run's
        ``cfg.input_size``), channels and classes."""
        return self.data.prepare(cfg)

    def data_recipe(self, cfg: DiTConfig, task_cfg: DiTTaskConfig, given: frozenset[str]
                    ) -> tuple[DiTTask, DiTConfig, DiTTaskConfig]:
        """A fresh run's task, model and task settings on a user's images (itself and the
        configs unchanged for the digits):

        - where neither ``patch_size`` nor a preset is ``given``, the patch size is the
          smallest of ``RECIPE_PATCH_SIZES`` at which the size the images train at (their
          ``image_size``, else :func:`~addnorm.tasks.dit_data.default_image_size`'s at that
          patch) is at most ``RECIPE_PATCHES`` patches a side (else the largest that divides
          it; none: ``cfg``'s), so that an image is at most 16 tokens, as the digits
          default's is: 16x16 images train at patch size 4, 8x8 at 2, 32x32 at 8. A step's
          time grows faster than the tokens (docs/task-defaults.md), and a budget buys more
          steps of fewer tokens;
        - where ``min_snr_gamma`` is not ``given``, none: every step weighed alike. A run on
          a user's data is planned to its budget, and v-prediction alone learns the digits in
          fewer steps (class agreement 0.86-0.95 at step 200 over six seeds, against
          0.23-0.50 with Min-SNR-5; both 0.99-1.0 by step 500: docs/dit-min-snr.json)."""
        if self.record is None:
            return self, cfg, task_cfg
        task = self
        if "min_snr_gamma" not in given and task_cfg.min_snr_gamma is not None:
            task_cfg = dataclasses.replace(task_cfg, min_snr_gamma=None)
            task = DiTTask(n_steps=self.n_steps, schedule=self.schedule,
                           prediction=task_cfg.prediction, min_snr_gamma=None, data=self.data)
        if {"preset", "patch_size"} & given:
            return task, cfg, task_cfg
        from addnorm.tasks.dit_data import default_image_size

        wanted = getattr(self.data, "image_size", "data")
        fitting = []  # (patch, patches a side) of the patch sizes that divide the size
        for patch in RECIPE_PATCH_SIZES:
            size = (default_image_size(self.corpus.sizes, patch)[0] if wanted == "data"
                    else wanted)
            if isinstance(size, int) and size % patch == 0:
                fitting.append((patch, size // patch))
        if not fitting:  # an image_size none of them divides: the patch size given
            return task, cfg, task_cfg
        patch = next((p for p, side in fitting if side <= RECIPE_PATCHES), fitting[-1][0])
        return task, dataclasses.replace(cfg, patch_size=patch), task_cfg

    def run_notes(self, cfg: DiTConfig) -> list[str]:
        """How the size a user's images train at for ``cfg`` differs from their own, and
        why, where the data picked it (:func:`~addnorm.tasks.dit_data.default_image_size`);
        nothing for the digits, a size asked for, or a trained run's."""
        note = self.data.size_note(cfg)
        return [] if note is None else [note]

    def check(self, cfg: DiTConfig, train_cfg: TrainConfig, task_cfg: DiTTaskConfig) -> None:
        """Raise ValueError if the configs cannot train this task: guidance needs
        ``class_dropout`` > 0; a user's images must fill a batch, hold 2 out for scoring and
        decode at the model's size (:meth:`ImageData.check`); a run read back from its
        checkpoint must find them as recorded (``DataChangedError`` otherwise)."""
        if cfg.class_dropout <= 0:
            raise ValueError(
                f"class_dropout ({cfg.class_dropout}) must be > 0: samples are drawn with "
                "classifier-free guidance, which needs the null class to be trained"
            )
        self.data.check(cfg, train_cfg.batch_size)
        self._checked_size = cfg.input_size

    def sizing(self, cfg: DiTConfig, train_cfg: TrainConfig, task_cfg: DiTTaskConfig) -> Sizing:
        """One image's patches; the evaluation samples every image at once (a user's images:
        ``SAMPLE_CHUNK`` at a time), twice over for guidance."""
        patches = (cfg.input_size // cfg.patch_size) ** 2
        return Sizing(length=patches, eval_batch=2 * self.data.samples_at_once(
            task_cfg.eval_size))

    def build_model(self, cfg: DiTConfig) -> DiT:
        """A fresh model for ``cfg`` (call ``prepare`` first)."""
        return DiT(cfg)

    def batches(
        self, cfg: DiTConfig, train_cfg: TrainConfig, task_cfg: DiTTaskConfig
    ) -> SampledBatches:
        """Random train images with their timesteps and noise (and, for a user's images, the
        label dropout; with ``task_cfg.flip``, random horizontal flips)."""
        self.check(cfg, train_cfg, task_cfg)
        batches = self.data.batches(cfg, batch_size=train_cfg.batch_size, n_steps=self.n_steps,
                                    seed=train_cfg.seed)
        return with_flips(batches) if task_cfg.flip else batches

    def loss_fn(self, task_cfg: DiTTaskConfig) -> LossFn:
        """``(model, batch) -> (loss, n_images)``: the diffusion training loss (with the
        batch's label dropout, ``drop``, where it has one)."""
        diffusion = self.diffusion

        def loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, int]:
            x0, t, noise = batch["images"], batch["t"], batch["noise"]
            x_t = diffusion.q_sample(x0, t, noise)  # (B, C, H, W)
            output = model(x_t, t, batch["labels"], force_drop_ids=batch.get("drop"))
            return diffusion.loss(output, x0, t, noise), x0.shape[0]  # output: (B, C or 2C, H, W)

        return loss

    def evaluate_run(self, model: DiT, task_cfg: DiTTaskConfig) -> dict[str, float]:
        """The held-out figures of a finished run: ``eval_size`` samples, spread over classes."""
        return self.evaluate(model, per_class=max(task_cfg.eval_size // len(self.class_names),
                                                  1))

    @classmethod
    def from_config(cls, task_cfg: DiTTaskConfig) -> DiTTask:
        """The task a new run trains: the images ``task_cfg`` names
        (:func:`~addnorm.tasks.dit_data.image_data_for`); its diffusion predicts
        ``task_cfg.prediction`` with ``task_cfg.min_snr_gamma``'s weighting (1000 linear
        steps). Raises ValueError for a gamma whose weights underflow float32."""
        return cls(prediction=task_cfg.prediction, min_snr_gamma=task_cfg.min_snr_gamma,
                   data=latent_data_for(task_cfg))

    @staticmethod
    def config_from_dict(data: dict) -> DiTConfig:
        """The model config saved by ``DiTConfig.to_dict``."""
        return DiTConfig.from_dict(data)

    def to_dict(self) -> dict:
        """The task's settings, saved with every checkpoint (and the record of a user's
        images)."""
        return {
            "n_steps": self.n_steps, "schedule": self.schedule, "prediction": self.prediction,
            "min_snr_gamma": self.min_snr_gamma, **self.data.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: dict) -> DiTTask:
        """The task a checkpoint saved; one saved before ``prediction`` and ``min_snr_gamma``
        existed predicted the noise (``"epsilon"``) with every step weighed alike (None)."""
        settings = {"prediction": "epsilon", "min_snr_gamma": None, **data}
        settings.pop("data", None)
        settings.pop("vae", None)
        return cls(**settings, data=latent_data_from_dict(data))

    def run_files(self) -> dict[str, str]:
        """For a user's images, ``data.json`` (the record of the data); nothing for the
        digits."""
        return self.data.run_files()
