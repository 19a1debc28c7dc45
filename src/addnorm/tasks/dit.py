"""The ``dit`` task: a class-conditional Diffusion Transformer on scikit-learn's digits, or on
a user's images (``DiTTaskConfig.data``: a folder in the ImageFolder convention or an
``.npz``; see :class:`addnorm.data.ImageCorpus`).

Training follows DiT (Peebles & Xie, 2023): for each image ``x0`` of class ``y`` a timestep
``t`` and noise ``eps`` are drawn (by the batch source, so a resumed run sees the same
draws), the model predicts from ``q_sample(x0, t, eps)``, ``t`` and ``y`` (``y`` is
replaced by the null class with probability ``class_dropout`` inside the model), and the loss
is the mean squared error (plus the variational term when ``learn_sigma``). What it predicts
is the task's ``prediction``: ``v = sqrt(abar) eps - sqrt(1 - abar) x0`` by default (Salimans
& Ho, 2022), which reaches the quality bar in a fraction of the steps DiT's ``eps`` needs on
these digits, and the loss has the Min-SNR weighting (Hang et al., 2023), which keeps the
samples as varied as the longer eps recipe's (README, "The digits DiT's recipe"). Runs saved
before these settings existed were trained on ``eps`` with an unweighted loss and load as
such.

At the end, samples are generated for every class with DDIM and classifier-free guidance and
scored: the digits by :mod:`addnorm.tasks.digit_quality`, a user's images by
:mod:`addnorm.tasks.image_quality` (a judge, features and held-out images of their own).
``class_agreement`` is the headline figure; a user's data set of one class (a flat folder:
unconditional) has none, and its headline is ``precision``, the share of samples that fall
among the real images' features (and its samples are drawn without guidance, which needs two
classes to tell apart).

A user's images are trained on with the label dropout drawn by the batch source
(:class:`addnorm.data.ImageBatches`), not inside the model, so that ``torchrun`` ranks, each
keeping its rows of one global batch, train exactly as one process does; the digits keep the
model's own draw, as every earlier run had it.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal, cast

import torch
from torch import nn

from addnorm.data.batches import DigitBatches
from addnorm.data.digits import IMAGE_SIZE, MAX_PIXEL, N_CLASSES, to_pixel_scale
from addnorm.data.fingerprint import DataRecord, absolute_path
from addnorm.data.images import (
    DEFAULT_VAL_FRACTION,
    MAX_IMAGE_SIZE,
    ImageBatches,
    ImageCorpus,
    to_model_scale,
    to_pixels,
)
from addnorm.diffusion import Diffusion, guided_eps_fn
from addnorm.dit import DIT_PRESETS, DiT, DiTConfig
from addnorm.tasks.task import Sizing, TaskConfig
from addnorm.training.config import TrainConfig
from addnorm.training.probes import Probe
from addnorm.training.trainer import LossFn
from addnorm.utils.checks import check_bool, check_choice, check_float, check_int

if TYPE_CHECKING:
    from addnorm.tasks.image_quality import ImageJudge

__all__ = ["DiTTask", "DiTTaskConfig", "SampleSettings"]

# The probe of quality during training (``DiTTask.probe``): how often, and on how many samples
# (a user's data set of few classes: at least PROBE_MIN_SAMPLES in all).
PROBE_EVERY = 100
PROBE_PER_CLASS = 5
PROBE_MIN_SAMPLES = 50
# Samples of a user's images drawn at once (the digits' evaluation draws all at once).
SAMPLE_CHUNK = 100
# Classes whose sample a run of a user's images keeps in metrics.json.
RUN_SAMPLE_CLASSES = 10


@dataclass(frozen=True)
class SampleSettings:
    """How samples are drawn: ``steps`` respaced steps of ``method`` (``"ddim"`` or
    ``"ddpm"``), classifier-free guidance of scale ``guidance`` (1 = none). Guidance trades
    diversity for fidelity: on three default runs (500 samples each), scale 2 gave class
    agreement 0.980-0.986 and a Fréchet distance of 0.31-0.34, scale 3 gave 0.992-0.998 and
    0.57-0.63 (DiT's paper uses 1.5 for FID and 4 for its figures).

    Accepted: ``steps`` from 1 to the task's ``n_steps``, checked where both bounds are known,
    by the sampler (:meth:`addnorm.diffusion.Diffusion.sample`); any finite
    ``guidance >= 0``. Every step count works with both methods
    (:mod:`addnorm.diffusion.spacing`). A guidance scale whose samples overflow
    float32 (far beyond any useful one: measured where ``guidance * |cond - uncond|`` passes
    about 1e19) raises FloatingPointError from the sampler instead of returning NaN; see
    :func:`addnorm.diffusion.guided_eps_fn` for why no fixed bound would be honest."""

    steps: int = 50
    method: str = "ddim"
    guidance: float = 3.0

    def __post_init__(self) -> None:
        check_choice("method", self.method, ("ddim", "ddpm"))
        check_float("guidance", self.guidance, min_value=0.0)


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
            none = the model's input_size: 8 by default, or the preset's).
        val_fraction: the share of each class's images held out for scoring, in (0, 0.5]
            (with data).
        prediction: what the model learns to predict: v (the default, Salimans & Ho) or
            epsilon, the noise (DiT's).
        min_snr_gamma: the loss's Min-SNR-gamma weighting (Hang et al.; 5 is their value),
            or none to weigh every step alike (DiT's loss).
        follow_links: read the links in a data folder that lead outside it (without it they
            are skipped, and named).
    """

    resumable: ClassVar[tuple[str, ...]] = ("eval_size",)

    eval_size: int = 500
    data: str | None = None
    image_size: int | None = None
    val_fraction: float = DEFAULT_VAL_FRACTION
    prediction: Literal["v", "epsilon"] = "v"
    min_snr_gamma: float | None = 5.0
    follow_links: bool = False

    def __post_init__(self) -> None:
        check_int("eval_size", self.eval_size, min_value=1)
        check_choice("prediction", self.prediction, ("v", "epsilon"))
        check_bool("follow_links", self.follow_links)
        if self.min_snr_gamma is not None:
            check_float("min_snr_gamma", self.min_snr_gamma, min_value=0.0, min_inclusive=False)
        if self.data is not None:
            if not isinstance(self.data, str) or not self.data:
                raise TypeError(f"data must be a non-empty str or None, got {self.data!r}")
            object.__setattr__(self, "data", absolute_path(self.data))
        check_float("val_fraction", self.val_fraction, min_value=0.0, min_inclusive=False,
                    max_value=0.5)
        if self.image_size is not None:
            check_int("image_size", self.image_size, min_value=1)
            if self.image_size > MAX_IMAGE_SIZE:
                raise ValueError(f"image_size ({self.image_size}) must be <= {MAX_IMAGE_SIZE}")
        if self.data is None:
            given = [name for name, default in (("image_size", None),
                                                ("val_fraction", DEFAULT_VAL_FRACTION),
                                                ("follow_links", False))
                     if getattr(self, name) != default]
            if given:
                raise ValueError(f"{' and '.join(given)} need data (your images); the digits "
                                 "are 8x8 with a fixed split")


class DiTTask:
    """Everything the trainer and the CLI need to know about the DiT task.

    Args:
        n_steps: the diffusion's timesteps (DiT: 1000).
        schedule: its beta schedule (``"linear"``, DiT's, or ``"cosine"``).
        prediction: what the model predicts, ``"v"`` (the default) or ``"epsilon"`` (DiT's).
        min_snr_gamma: the loss's Min-SNR weighting (:class:`~addnorm.diffusion.Diffusion`),
            5 by default (Hang et al.'s value); None weighs every step alike (DiT's loss).
        data: the images: an :class:`~addnorm.data.ImageCorpus` (a user's), the
            :class:`~addnorm.data.fingerprint.DataRecord` of one (a run read back from its
            checkpoint: the files are opened, and checked unchanged, when training or scoring
            needs them; sampling never does), or None: scikit-learn's digits.
        image_size: the side a user's images are resized to; None: the model config's
            ``input_size`` (``prepare``).
    """

    name: ClassVar[str] = "dit"
    description: ClassVar[str] = (
        "class-conditional Diffusion Transformer on scikit-learn's 8x8 digits, or on your "
        "images (--data)"
    )
    owned_fields: ClassVar[frozenset[str]] = frozenset({"input_size", "in_channels", "n_classes"})

    def __init__(
        self,
        *,
        n_steps: int = 1000,
        schedule: str = "linear",
        prediction: str = "v",
        min_snr_gamma: float | None = 5.0,
        data: ImageCorpus | DataRecord | None = None,
        image_size: int | None = None,
    ) -> None:
        self.diffusion = Diffusion(
            n_steps=n_steps, schedule=schedule, prediction=prediction, min_snr_gamma=min_snr_gamma
        )
        self.n_steps, self.schedule, self.prediction = n_steps, schedule, prediction
        self.min_snr_gamma = min_snr_gamma
        target = "noise" if prediction == "epsilon" else "velocity v"
        self.loss_label = f"loss (mean squared error of the predicted {target})"
        self._corpus: ImageCorpus | None = None
        self.record: DataRecord | None = None
        if isinstance(data, ImageCorpus):
            self._corpus, self.record = data, data.record
        elif isinstance(data, DataRecord):
            self.record = data
        elif data is not None:
            raise TypeError(f"data must be an ImageCorpus, a DataRecord or None, got {data!r}")
        self.image_size = None if image_size is None else check_int(
            "image_size", image_size, min_value=1)
        self.class_names: tuple[str, ...] = tuple(str(d) for d in range(N_CLASSES))
        self.channels = 1
        if self.record is not None:
            self.class_names, self.channels = _classes_of(self.record)
        self._judges: dict[int, ImageJudge] = {}

    @property
    def metric(self) -> str:
        """The headline figure: ``class_agreement``, or ``precision`` for a user's data set
        of one class (no classes to agree with)."""
        return "precision" if len(self.class_names) == 1 else "class_agreement"

    @property
    def pixel_max(self) -> float:
        """The top of the samples' pixel scale: 16 for the digits, 255 for a user's images."""
        return MAX_PIXEL if self.record is None else 255.0

    @property
    def sample_settings(self) -> SampleSettings:
        """How the evaluation samples: ``SampleSettings()``; without guidance for one
        class."""
        return SampleSettings(guidance=1.0) if len(self.class_names) == 1 else SampleSettings()

    @property
    def corpus(self) -> ImageCorpus:
        """A user's images (opened again, and checked unchanged, for a run read back from its
        checkpoint); ValueError for the digits, which have none."""
        if self._corpus is None:
            if self.record is None:
                raise ValueError("the digits task has no image corpus")
            self._corpus = ImageCorpus.reopen(self.record)
        return self._corpus

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
        """The digits preset at d_model 96 (723,844 parameters; the preset's 128 has 1.27M).

        At this width the run (training, the probes and the final 500-sample evaluation)
        takes about 40 s on an idle 2-core machine against 65 s at 128, with the same class
        agreement (0.992-0.998 over 3 seeds, against 0.994-1.0) and Fréchet distance
        (0.57-0.63, against 0.57-0.60); README, "The digits DiT's recipe"."""
        return dataclasses.replace(DIT_PRESETS["DiT-digits"], d_model=96)

    @staticmethod
    def default_train_config() -> TrainConfig:
        """500 steps of 64 digits at a peak learning rate of 3e-3 (50 warm-up steps, then a
        cosine to 5%), scored with the EMA of the weights at decay 0.99 with its warm-up
        (``ema_warmup``: the decay ``min(0.99, (1 + n) / (10 + n))`` is 0.982 at the last of
        500 steps, a horizon of about 57 steps, so the zero-output initial weights are
        forgotten within tens of steps). With v-prediction and Min-SNR-5 weights (the
        task's defaults) class agreement passed 0.95 by step 400 on every seed measured (v
        alone: by step 300; README, "The digits DiT's recipe", and docs/dit-min-snr.json);
        the time cap only guards a machine too busy to finish."""
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
        images' size (``image_size``, else ``cfg.input_size``), channels and classes."""
        if self.record is None:
            return dataclasses.replace(
                cfg, input_size=IMAGE_SIZE, in_channels=1, n_classes=N_CLASSES
            )
        size = self.image_size or cfg.input_size
        if size % cfg.patch_size:
            origin = "" if self.image_size else " (image_size is the model's input_size)"
            raise ValueError(
                f"image_size ({size}) must be divisible by patch_size ({cfg.patch_size}){origin}"
            )
        return dataclasses.replace(
            cfg, input_size=size, in_channels=self.channels, n_classes=len(self.class_names)
        )

    def check(self, cfg: DiTConfig, train_cfg: TrainConfig, task_cfg: DiTTaskConfig) -> None:
        """Raise ValueError if the configs cannot train this task. A user's images: the train
        split must fill a batch and the held-out split hold 2 images (a Fréchet distance
        needs a spread), and every image must decode at the model's size (done here, so a
        damaged file is named before anything is written); a run read back from its
        checkpoint must find them as recorded (``DataChangedError`` otherwise)."""
        if cfg.class_dropout <= 0:
            raise ValueError(
                f"class_dropout ({cfg.class_dropout}) must be > 0: samples are drawn with "
                "classifier-free guidance, which needs the null class to be trained"
            )
        if self.record is None:
            return
        corpus = self.corpus
        n_train, n_held = len(corpus.train_index), len(corpus.val_index)
        if n_train < train_cfg.batch_size:
            raise ValueError(
                f"the train split holds {n_train} images, fewer than a batch (batch_size "
                f"{train_cfg.batch_size}): use a smaller batch_size or add images"
            )
        if n_held < 2:
            raise ValueError(
                f"the held-out split holds {n_held} image; scoring needs at least 2 (a "
                "Fréchet distance needs a spread): add images or raise val_fraction"
            )
        corpus.pixels(cfg.input_size)

    def sizing(self, cfg: DiTConfig, train_cfg: TrainConfig, task_cfg: DiTTaskConfig) -> Sizing:
        """One image's patches; the evaluation samples every image at once (a user's images:
        ``SAMPLE_CHUNK`` at a time), twice over for guidance."""
        patches = (cfg.input_size // cfg.patch_size) ** 2
        at_once = task_cfg.eval_size if self.record is None else min(task_cfg.eval_size,
                                                                     SAMPLE_CHUNK)
        return Sizing(length=patches, eval_batch=2 * at_once)

    def build_model(self, cfg: DiTConfig) -> DiT:
        """A fresh model for ``cfg`` (call ``prepare`` first)."""
        return DiT(cfg)

    def batches(
        self, cfg: DiTConfig, train_cfg: TrainConfig, task_cfg: DiTTaskConfig
    ) -> DigitBatches | ImageBatches:
        """Random train images with their timesteps and noise (and, for a user's images, the
        label dropout)."""
        self.check(cfg, train_cfg, task_cfg)
        if self.record is None:
            return DigitBatches(
                batch_size=train_cfg.batch_size, n_steps=self.n_steps, seed=train_cfg.seed
            )
        pixels, labels = self.corpus.split("train", cfg.input_size)
        return ImageBatches(
            to_model_scale(pixels), labels, batch_size=train_cfg.batch_size,
            n_steps=self.n_steps, class_dropout=cfg.class_dropout, seed=train_cfg.seed,
        )

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

    @torch.no_grad()
    def sample(
        self,
        model: DiT,
        labels: torch.Tensor,
        settings: SampleSettings = SampleSettings(),
        *,
        generator: torch.Generator | None = None,
        progress: bool = False,
    ) -> torch.Tensor:
        """Images generated for ``labels`` (model put in eval mode): digits on their 0..16
        pixel scale; a user's images as uint8 0..255, drawn ``SAMPLE_CHUNK`` at a time.

        Shapes:
            labels: (N,) class ids; returns: digits (N, 8, 8), a user's images (N, C, S, S)
        """
        model.eval()
        device = next(model.parameters()).device
        if self.record is None:
            return to_pixel_scale(self._generate(model, labels, settings, generator, progress,
                                                 device)[:, 0].float()).cpu()
        return torch.cat([
            to_pixels(self._generate(model, chunk, settings, generator, progress, device)).cpu()
            for chunk in labels.split(SAMPLE_CHUNK)
        ])

    def _generate(self, model: DiT, labels: torch.Tensor, settings: SampleSettings,
                  generator: torch.Generator | None, progress: bool, device: torch.device
                  ) -> torch.Tensor:
        """The sampler's output (N, C, S, S) on the model's [-1, 1] scale."""
        cfg = model.cfg
        shape = (labels.shape[0], cfg.in_channels, cfg.input_size, cfg.input_size)
        noise = torch.randn(shape, generator=generator, device=device)
        eps_fn = guided_eps_fn(
            model, labels.to(device), guidance_scale=settings.guidance, null_class=cfg.n_classes
        )
        return self.diffusion.sample(
            eps_fn, noise, steps=settings.steps, method=settings.method, generator=generator,
            progress=progress,
        )  # (N, C, S, S)

    def judge(self, image_size: int) -> ImageJudge:
        """The judge of a user's images at ``image_size``, fitted once on the train split and
        compared with the held-out one (:class:`~addnorm.tasks.image_quality.ImageJudge`)."""
        from addnorm.tasks.image_quality import ImageJudge

        if image_size not in self._judges:
            train, train_labels = self.corpus.split("train", image_size)
            held, held_labels = self.corpus.split("val", image_size)
            self._judges[image_size] = ImageJudge.fit(train, train_labels, held, held_labels,
                                                      self.class_names)
        return self._judges[image_size]

    def evaluate(self, model: DiT, *, per_class: int, seed: int = 0) -> dict[str, float]:
        """Generate ``per_class`` images of every class and score them (see digit_quality and
        image_quality)."""
        labels = torch.arange(len(self.class_names)).repeat_interleave(per_class)  # (K * n,)
        device = next(model.parameters()).device
        generator = torch.Generator(device=device).manual_seed(seed)
        pixels = self.sample(model, labels, self.sample_settings, generator=generator)
        if self.record is None:
            from addnorm.tasks.digit_quality import digit_judge

            return digit_judge().score(pixels, labels)
        return self.judge(model.cfg.input_size).score(pixels, labels)

    def probe(self, task_cfg: DiTTaskConfig) -> Probe:
        """Every ``PROBE_EVERY`` steps, the headline figure of ``PROBE_PER_CLASS`` samples per
        class (at least ``PROBE_MIN_SAMPLES`` in all for a user's images), by the final
        evaluation's sampler and judge, for ``quality.png``: where quality arrives in
        training time."""
        per_class = PROBE_PER_CLASS
        if self.record is not None:
            per_class = max(per_class, math.ceil(PROBE_MIN_SAMPLES / len(self.class_names)))
        metric = self.metric

        def score(model: nn.Module) -> dict[str, float]:
            scores = self.evaluate(cast(DiT, model), per_class=per_class)
            return {metric: scores[metric]}

        return Probe(every=PROBE_EVERY, score=score)

    def evaluate_run(self, model: DiT, task_cfg: DiTTaskConfig) -> dict[str, float]:
        """The held-out figures of a finished run: ``eval_size`` samples, spread over classes."""
        return self.evaluate(model, per_class=max(task_cfg.eval_size // len(self.class_names),
                                                  1))

    def run_samples(self, model: DiT) -> list[dict[str, Any]]:
        """One sample per class (a user's images: of the first ``RUN_SAMPLE_CLASSES``), for
        the run's metrics.json: digits as 8x8 lists of 0..16 pixels, a user's images as
        (S, S) or (S, S, C) lists of 0..255 pixels (``"max": 255``), under their class's
        name."""
        generator = torch.Generator(device=next(model.parameters()).device).manual_seed(1)
        if self.record is None:
            pixels = self.sample(model, torch.arange(N_CLASSES), generator=generator)
            return [
                {"class": c, "pixels": [[round(v, 2) for v in row] for row in image.tolist()]}
                for c, image in enumerate(pixels)
            ]
        classes = torch.arange(min(len(self.class_names), RUN_SAMPLE_CLASSES))
        images = self.sample(model, classes, self.sample_settings, generator=generator)
        return [{"class": self.class_names[c], "pixels": _channels_last(image).tolist(),
                 "max": 255} for c, image in enumerate(images)]

    @staticmethod
    def samples_text(samples: list[dict[str, Any]]) -> str:
        """Nothing for the digits (``addnorm sample`` draws them as a grid); for a user's
        images, the classes whose samples ``addnorm sample --class NAME`` draws."""
        names = [s["class"] for s in samples if isinstance(s.get("class"), str)]
        if not names:
            return ""
        return (f"samples of your classes ({', '.join(names)}"
                f"{', ...' if len(names) == RUN_SAMPLE_CLASSES else ''}): addnorm sample "
                "--checkpoint RUN --class NAME --out grid.png draws them\n")

    @staticmethod
    def figures_text(metrics: Mapping[str, Any]) -> str:
        """The quality figures of a run on a user's images, each beside what real held-out
        images score (see :mod:`addnorm.tasks.image_quality`); nothing for the digits (their
        headline says it)."""
        if "precision_real" not in metrics:  # the digits: their judge has no manifolds
            return ""
        lines = []
        if "judge_test_accuracy" in metrics:
            lines.append("judge_test_accuracy: "
                         f"{metrics['judge_test_accuracy']:.4f} (the class judge, trained on "
                         "your train images, on the held-out ones)")
        lines += [
            f"frechet_distance: {metrics['frechet_distance']:.2f} (real held-out images vs "
            f"train images: {metrics['frechet_distance_real']:.2f}; lower is better)",
            f"precision: {metrics['precision']:.3f}, recall: {metrics['recall']:.3f} (real: "
            f"{metrics['precision_real']:.3f}, {metrics['recall_real']:.3f})",
            f"nearest_train_distance: {metrics['nearest_train_distance']:.2f} (real: "
            f"{metrics['nearest_train_distance_real']:.2f}; far below it: copies of the "
            "train images)",
        ]
        return "".join(line + "\n" for line in lines)

    @classmethod
    def from_config(cls, task_cfg: DiTTaskConfig) -> DiTTask:
        """The task a new run trains: the digits, or ``task_cfg.data`` (its headers read and
        its files fingerprinted here; the pixels are decoded by ``check``); its diffusion
        predicts ``task_cfg.prediction`` with ``task_cfg.min_snr_gamma``'s weighting (1000
        linear steps). Raises ValueError for a gamma whose weights underflow float32."""
        corpus = None if task_cfg.data is None else ImageCorpus.build(
            task_cfg.data, val_fraction=task_cfg.val_fraction,
            follow_links=task_cfg.follow_links)
        return cls(prediction=task_cfg.prediction, min_snr_gamma=task_cfg.min_snr_gamma,
                   data=corpus, image_size=task_cfg.image_size)

    @staticmethod
    def config_from_dict(data: dict) -> DiTConfig:
        """The model config saved by ``DiTConfig.to_dict``."""
        return DiTConfig.from_dict(data)

    def to_dict(self) -> dict:
        """The task's settings, saved with every checkpoint (and the record of a user's
        images)."""
        out: dict[str, Any] = {
            "n_steps": self.n_steps, "schedule": self.schedule, "prediction": self.prediction,
            "min_snr_gamma": self.min_snr_gamma,
        }
        if self.record is not None:
            out["data"] = self.record.to_dict()
        return out

    @classmethod
    def from_dict(cls, data: dict) -> DiTTask:
        """The task a checkpoint saved; one saved before ``prediction`` and ``min_snr_gamma``
        existed predicted the noise (``"epsilon"``) with every step weighed alike (None)."""
        settings = {"prediction": "epsilon", "min_snr_gamma": None, **data}
        record = settings.pop("data", None)
        return cls(**settings, data=None if record is None else DataRecord.from_dict(record))

    def run_files(self) -> dict[str, str]:
        """For a user's images, ``data.json`` (the record of the data); nothing for the
        digits."""
        if self.record is None:
            return {}
        return {"data.json": json.dumps(self.record.to_dict(), indent=1) + "\n"}


def _classes_of(record: DataRecord) -> tuple[tuple[str, ...], int]:
    """The class names and channels a record of images holds; ValueError if it holds none."""
    classes, mode = record.details.get("classes"), record.details.get("mode")
    if record.kind != "images" or mode not in ("L", "RGB") or not (
        isinstance(classes, list) and classes
        and all(isinstance(c, str) for c in classes) and len(set(classes)) == len(classes)
    ):
        raise ValueError(f"{record.path}: not a record of images (kind {record.kind!r}, mode "
                         f"{mode!r}, classes {classes!r})")
    return tuple(classes), 1 if mode == "L" else 3


def _channels_last(image: torch.Tensor) -> torch.Tensor:
    """(C, S, S) as (S, S) for one channel, else (S, S, C): the layout of image files."""
    return image[0] if image.shape[0] == 1 else image.permute(1, 2, 0)
