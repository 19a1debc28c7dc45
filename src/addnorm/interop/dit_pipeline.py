"""The DiT as the paper runs it: a class-conditional DiT sampling a VAE's latents, decoded to
pictures, as diffusers' ``DiTPipeline`` (``pipelines/dit/pipeline_dit.py``) does it.

One call of :meth:`DiTPipeline.sample`, given diffusers' arguments, makes diffusers' images
(held to them in the tests, same weights and noise):

1. latents x_T ~ N(0, I), (B, C, S, S) in the DiT's dtype, drawn as diffusers'
   ``randn_tensor`` draws them (on the generator's device, then moved);
2. the sampler of the pipeline's scheduler config (:mod:`.diffusers_scheduler`), or the one
   asked for, over ``steps`` steps; classifier-free guidance on the noise channels,
   ``uncond + s (cond - uncond)`` with the null class ``n_classes`` (the DiT's extra label
   row), and the learned-sigma channels dropped before the sampler's update;
3. ``images = clamp(vae.decode(latents / scaling_factor) / 2 + 1/2, 0, 1)``.

Two differences, both where diffusers' pipeline assumes ImageNet or ignores its argument: its
null class is always 1000 (``num_embeds_ada_norm`` of DiT-XL/2), here ``n_classes`` (the same
for the paper's models, and for a model of K < 1000 classes written back by
:func:`~addnorm.interop.diffusers_pipeline.save_diffusers_pipeline`, which pads its label table
to 1000 classes so that diffusers' row 1000 is its null row); and it
guides only for scales above 1 (it runs the conditional model alone for any scale <= 1), here
every scale but 1 guides, as the formula says (1 is the conditional model alone, as there).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypedDict

import torch
from torch import Tensor, nn

from addnorm.diffusion import guided_eps_fn
from addnorm.diffusion.sampling import EpsFn
from addnorm.dit.class_names import ClassNames
from addnorm.dit.model import DiT
from addnorm.interop.diffusers_scheduler import SchedulerSettings, scheduler_settings
from addnorm.interop.diffusers_vae import LatentVAE
from addnorm.utils.checks import check_bool, check_float, check_int

if TYPE_CHECKING:  # typing.Unpack is Python 3.11's; annotations are not evaluated
    from typing_extensions import Unpack

__all__ = ["DEFAULT_GUIDANCE", "DEFAULT_STEPS", "DiTPipeline", "SampleOptions"]

DEFAULT_GUIDANCE = 4.0  # DiTPipeline.__call__'s guidance_scale (DiT's sample.py: cfg_scale 4)
DEFAULT_STEPS = 50  # DiTPipeline.__call__'s num_inference_steps


class SampleOptions(TypedDict, total=False):
    """The keyword arguments of :meth:`DiTPipeline.sample_latents`, which
    :meth:`DiTPipeline.sample` passes on (documented and defaulted there)."""

    steps: int
    method: str | None
    guidance: float
    generator: torch.Generator | None
    noise: Tensor | None
    progress: bool


class DiTPipeline(nn.Module):
    """A DiT, the VAE whose latents it models, the scheduler config it samples with, and its
    class names.

    Args:
        transformer: the DiT (on latents of ``vae.latent_channels`` channels).
        vae: the :class:`~addnorm.interop.diffusers_vae.LatentVAE` decoding its latents.
        scheduler_config: the pipeline's ``scheduler_config.json`` (its JSON object): the
            default sampler and the diffusion's schedule.
        class_names: the classes' names (``id2label``); default: ids only.

    Raises:
        ValueError: the VAE's latent channels are not the DiT's input channels.
    """

    def __init__(self, transformer: DiT, vae: LatentVAE, scheduler_config: Mapping[str, Any],
                 class_names: ClassNames | None = None) -> None:
        super().__init__()
        if not isinstance(transformer, DiT):
            raise TypeError(f"transformer must be an addnorm DiT, got "
                            f"{type(transformer).__name__}")
        if not isinstance(vae, LatentVAE):
            raise TypeError(f"vae must be a LatentVAE, got {type(vae).__name__}")
        if vae.latent_channels != transformer.cfg.in_channels:
            raise ValueError(
                f"the VAE's latents have {vae.latent_channels} channels (latent_channels) but "
                f"the DiT takes {transformer.cfg.in_channels} (in_channels): they were not "
                "made for each other"
            )
        self.transformer = transformer
        self.vae = vae
        self.scheduler_config = dict(scheduler_config)
        self.class_names = class_names or ClassNames(transformer.cfg.n_classes)

    @property
    def image_size(self) -> int:
        """The side of the images it makes: the DiT's latent side times the VAE's factor."""
        return self.transformer.cfg.input_size * self.vae.downsample

    def sampler(self, method: str | None = None) -> SchedulerSettings:
        """The settings of the pipeline's scheduler, or of ``method``'s scheduler made from
        its config (:func:`~addnorm.interop.diffusers_scheduler.scheduler_settings`)."""
        return scheduler_settings(self.scheduler_config, method=method,
                                  where="the pipeline's scheduler config")

    @torch.no_grad()
    def sample(self, labels: Tensor | Sequence[int | str], **options: Unpack[SampleOptions]
               ) -> Tensor:
        """Images of the classes ``labels``, on [0, 1] (diffusers' ``output_type="pt"``): the
        latents of :meth:`sample_latents` (its keyword arguments), decoded.

        Shapes: returns (B, image_channels, image_size, image_size)
        """
        return self.decode(self.sample_latents(labels, **options))

    @torch.no_grad()
    def sample_latents(
        self,
        labels: Tensor | Sequence[int | str],
        *,
        steps: int = DEFAULT_STEPS,
        method: str | None = None,
        guidance: float = DEFAULT_GUIDANCE,
        generator: torch.Generator | None = None,
        noise: Tensor | None = None,
        progress: bool = False,
    ) -> Tensor:
        """The latents :meth:`sample` decodes: a sample of the DiT, not yet decoded.

        Args:
            labels: (B,) class ids, or names of them (``"goldfish"``: any synonym of
                ``class_names``, or an id as a string).
            steps: sampling steps (``num_inference_steps``), 1 .. the schedule's steps.
            method: ``"ddim"`` or ``"dpm-solver++"``; default: the pipeline's scheduler's.
            guidance: the classifier-free guidance scale, finite (1: the conditional model
                alone; diffusers' pipeline also runs that for any scale below 1, which here
                guides, as the formula says).
            generator: draws the starting latents (when ``noise`` is not given).
            noise: the starting latents (B, C, S, S); default: drawn.
            progress: a tqdm bar on stderr.

        Shapes: returns (B, C, S, S), C and S the DiT's ``in_channels`` and ``input_size``
        """
        settings = self.sampler(method)
        steps = check_int("steps", steps, min_value=1)
        settings.check_steps(steps)
        guidance = check_float("guidance", guidance)
        y = self._labels(labels)
        if noise is None:
            noise = self._noise(len(y), generator)
        eps_fn = self._eps_fn(y, guidance)
        return settings.diffusion().sample(
            eps_fn, noise, steps=steps, method=settings.method, spacing=settings.spacing,
            progress=check_bool("progress", progress),
        )

    def decode(self, latents: Tensor) -> Tensor:
        """Images on [0, 1] of latents, as the pipeline decodes them.

        Shapes: latents (B, C, S, S) -> (B, image_channels, image_size, image_size)
        """
        vae_dtype = next(self.vae.parameters()).dtype
        images = self.vae.decode(latents.to(vae_dtype))  # about [-1, 1]
        return (images / 2 + 0.5).clamp(0, 1)

    def _labels(self, labels: Tensor | Sequence[int | str]) -> Tensor:
        device = next(self.transformer.parameters()).device
        if not isinstance(labels, Tensor):
            labels = [self.class_names.index(c) if isinstance(c, str) else c for c in labels]
        y = torch.as_tensor(labels, device=device)
        if y.ndim != 1 or y.is_floating_point() or y.dtype == torch.bool or len(y) == 0:
            raise ValueError(f"labels must be a non-empty 1-D sequence of class ids, got "
                             f"{tuple(y.shape)} {y.dtype}")
        return y.long()

    def _noise(self, batch: int, generator: torch.Generator | None) -> Tensor:
        """x_T as diffusers' randn_tensor draws it: on a CPU generator's device (or the
        model's), in the DiT's dtype, then moved to the model's device."""
        parameter = next(self.transformer.parameters())
        cfg = self.transformer.cfg
        shape = (batch, cfg.in_channels, cfg.input_size, cfg.input_size)
        draw_on = generator.device if generator is not None else parameter.device
        return torch.randn(shape, generator=generator, device=draw_on,
                           dtype=parameter.dtype).to(parameter.device)

    def _eps_fn(self, y: Tensor, guidance: float) -> EpsFn:
        dit = self.transformer
        if guidance == 1.0:  # the conditional model alone, as diffusers runs it
            checked = dit.checked_labels(y)
            return lambda x, t: dit(x, t, checked)
        if not dit.cfg.has_null_class:
            raise ValueError(f"guidance {guidance:g} needs the DiT's null class, and this "
                             "one has none (class_dropout 0); use guidance 1")
        return guided_eps_fn(dit, y, guidance_scale=guidance, null_class=dit.cfg.n_classes)
