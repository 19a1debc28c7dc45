"""How the ``dit`` task draws and scores samples (:class:`DiTEvaluation`, a base of
:class:`~addnorm.tasks.dit.DiTTask`): the sampler's settings (:class:`SampleSettings`), the
probe and the validation while training, the held-out figures of a finished run and the
lines ``addnorm train`` prints of them.

Samples are generated for every class with DDIM and classifier-free guidance and scored by the
data's judge. ``class_agreement`` is the headline figure; a data set of one class (a flat
folder: unconditional) has none, and its headline is ``precision``, the share of samples that
fall among the real images' features (and its samples are drawn without guidance, which needs
two classes to tell apart).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

from addnorm.diffusion import Diffusion, guided_eps_fn
from addnorm.diffusion.sampling import METHODS
from addnorm.dit import DiT
from addnorm.tasks.dit_data import ImageData, Judge
from addnorm.tasks.task import TaskConfig
from addnorm.training.best import Validation
from addnorm.training.probes import Probe
from addnorm.utils.checks import check_choice, check_float

if TYPE_CHECKING:
    from addnorm.tasks.image_quality import ImageJudge

__all__ = ["DiTEvaluation", "SampleSettings"]

# The probe of quality during training (``DiTTask.probe``): how often, and on how many samples
# (a data set of few classes: at least PROBE_MIN_SAMPLES in all).
PROBE_EVERY = 100
PROBE_PER_CLASS = 5
PROBE_MIN_SAMPLES = 50
# Classes whose sample a run keeps in metrics.json.
RUN_SAMPLE_CLASSES = 10


@dataclass(frozen=True)
class SampleSettings:
    """How samples are drawn: ``steps`` respaced steps of ``method`` (``"ddim"``, ``"ddpm"``
    or ``"dpm-solver++"``: :data:`addnorm.diffusion.sampling.METHODS`), classifier-free
    guidance of scale ``guidance`` (1 = none), which trades diversity for fidelity
    (docs/task-defaults.md measures 2 against 3).

    Accepted: ``steps`` from 1 to the task's ``n_steps``, checked where both bounds are known,
    by the sampler (:meth:`addnorm.diffusion.Diffusion.sample`); any finite
    ``guidance >= 0``. Every step count works with every method
    (:mod:`addnorm.diffusion.spacing`). A guidance scale whose samples overflow
    float32 (far beyond any useful one: measured where ``guidance * |cond - uncond|`` passes
    about 1e19) raises FloatingPointError from the sampler instead of returning NaN; see
    :func:`addnorm.diffusion.guided_eps_fn` for why no fixed bound would be honest."""

    steps: int = 50
    method: str = "ddim"
    guidance: float = 3.0

    def __post_init__(self) -> None:
        check_choice("method", self.method, METHODS)
        check_float("guidance", self.guidance, min_value=0.0)


class DiTEvaluation:
    """The sampling and scoring hooks of the ``dit`` task's :class:`~addnorm.tasks.task.Task`
    protocol (``metric``, ``probe``, ``validation``, ``run_samples``,
    ``samples_text``, ``figures_text``) and the ``sample`` the CLI draws with, over the task's
    ``diffusion`` and ``data`` (set by :class:`~addnorm.tasks.dit.DiTTask`)."""

    diffusion: Diffusion
    data: ImageData
    class_names: tuple[str, ...]
    _checked_size: int | None  # the image size ``check`` last saw

    @property
    def metric(self) -> str:
        """The headline figure: ``class_agreement``, or ``precision`` for a data set of one
        class (no classes to agree with) or a user's images whose class judge, at the size
        ``DiTTask.check`` saw, is too weak to judge (``ImageJudge.verdict``)."""
        if len(self.class_names) == 1:
            return "precision"
        if self._checked_size is not None and self.data.record is not None and getattr(
                self.judge(self._checked_size), "verdict", None) is not None:
            return "precision"
        return "class_agreement"

    @property
    def sample_settings(self) -> SampleSettings:
        """How the evaluation samples: ``SampleSettings()``; without guidance for one
        class."""
        return SampleSettings(guidance=1.0) if len(self.class_names) == 1 else SampleSettings()

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
        """Images generated for ``labels`` (model put in eval mode), on the data's pixel scale
        (:meth:`ImageData.to_pixels`): digits on 0..16; a user's images as uint8 0..255,
        drawn ``SAMPLE_CHUNK`` at a time.

        Shapes:
            labels: (N,) class ids; returns: digits (N, 8, 8), a user's images (N, C, S, S)
        """
        model.eval()
        device = next(model.parameters()).device
        chunks = labels.split(max(self.data.samples_at_once(len(labels)), 1))
        return torch.cat([
            self.data.to_pixels(self._generate(model, chunk, settings, generator, progress,
                                               device)).cpu()
            for chunk in chunks
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

    def judge(self, image_size: int) -> Judge | ImageJudge:
        """What scores samples at ``image_size``: the digits' judge, or a user's images'
        (:class:`~addnorm.tasks.image_quality.ImageJudge`, fitted once on the train split and
        compared with the held-out one)."""
        return self.data.judge(image_size)

    def evaluate(self, model: DiT, *, per_class: int, seed: int = 0) -> dict[str, float]:
        """Generate ``per_class`` images of every class and score them (see digit_quality and
        image_quality)."""
        labels = torch.arange(len(self.class_names)).repeat_interleave(per_class)  # (K * n,)
        device = next(model.parameters()).device
        generator = torch.Generator(device=device).manual_seed(seed)
        pixels = self.sample(model, labels, self.sample_settings, generator=generator)
        return self.judge(model.cfg.input_size).score(pixels, labels)

    def probe(self, task_cfg: TaskConfig) -> Probe:
        """Every ``PROBE_EVERY`` steps, the headline figure of ``PROBE_PER_CLASS`` samples per
        class (at least ``PROBE_MIN_SAMPLES`` in all), by the final evaluation's sampler and
        judge, for ``quality.png``: where quality arrives in training time."""
        per_class = max(PROBE_PER_CLASS, math.ceil(PROBE_MIN_SAMPLES / len(self.class_names)))
        metric = self.metric

        def score(model: nn.Module) -> dict[str, float]:
            scores = self.evaluate(cast(DiT, model), per_class=per_class)
            return {metric: scores[metric]}

        return Probe(every=PROBE_EVERY, score=score)

    def validation(self, task_cfg: TaskConfig) -> Validation:
        """While training: the probe's samples (``PROBE_PER_CLASS`` per class, at least
        ``PROBE_MIN_SAMPLES``) drawn from other noise (seed 1) than the final evaluation's
        (seed 0), scored by its judge, each figure as ``val_<name>``, ranked by the headline
        (``val_class_agreement``, or ``val_precision`` for one class; higher is better),
        equal ones by ``val_frechet_distance`` (lower is better: the agreement saturates at
        1.0 long before the samples have the data's spread). A run on a user's images keeps
        its best by default."""
        per_class = max(PROBE_PER_CLASS, math.ceil(PROBE_MIN_SAMPLES / len(self.class_names)))

        def score(model: nn.Module) -> dict[str, float]:
            scores = self.evaluate(cast(DiT, model), per_class=per_class, seed=1)
            return {f"val_{name}": value for name, value in scores.items()}

        return Validation(f"val_{self.metric}", higher_is_better=True, score=score,
                          keep_by_default=self.data.record is not None,
                          tie_break="val_frechet_distance")

    def run_samples(self, model: DiT) -> list[dict[str, Any]]:
        """One sample of each of the first ``RUN_SAMPLE_CLASSES`` classes, for the run's
        metrics.json (:meth:`ImageData.sample_record`): digits as 8x8 lists of 0..16 pixels
        under their class id, a user's images as (S, S) or (S, S, C) lists of 0..255 pixels
        (``"max": 255``) under their class's name."""
        generator = torch.Generator(device=next(model.parameters()).device).manual_seed(1)
        classes = torch.arange(min(len(self.class_names), RUN_SAMPLE_CLASSES))
        images = self.sample(model, classes, self.sample_settings, generator=generator)
        return [self.data.sample_record(c, image) for c, image in enumerate(images)]

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
        if metrics.get("judge_trusted") == 0.0:
            from addnorm.tasks.image_quality import MIN_JUDGE_ACCURACY

            lines.append(f"class_agreement: not judged (a judge must score {MIN_JUDGE_ACCURACY:g} "
                         "or more on held-out images, clearly above chance, to judge samples; "
                         "the headline is precision)")
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
