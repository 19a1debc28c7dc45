"""Gaussian diffusion (Ho et al. 2020, with Nichol & Dhariwal's learned variance, Song et al.'s
DDIM and Lu et al.'s DPM-Solver++): the forward process, the training loss, and sampling.

Conventions are facebookresearch/DiT's (``diffusion/gaussian_diffusion.py`` and
``respace.py``, from improved-diffusion), and the tests hold this module to them: steps
``t = 0 .. n_steps - 1`` (``t = 0`` is one step of noise), float64 tables cast to the data's
dtype at use, models fed original step numbers even when sampling with fewer steps.

Shapes legend: B batch, C channels (dim 1), ``...`` further data dims (H, W for images).
A model's output is its prediction (B, C, ...), the noise ``eps`` (``prediction="epsilon"``)
or ``v = sqrt(abar) eps - sqrt(1 - abar) x_0`` (``prediction="v"``), optionally followed by C
variance channels (B, 2C, ...) as DiT's ``learn_sigma`` (see :mod:`.reverse`).

Typical training step and sampling::

    diffusion = Diffusion(1000, "linear")
    t = torch.randint(0, diffusion.n_steps, (B,), generator=g)
    noise = torch.randn(x0.shape, generator=g)
    loss = diffusion.loss(model(diffusion.q_sample(x0, t, noise), t, y), x0, t, noise)
    images = diffusion.sample(lambda x, t: model(x, t, y), torch.randn(B, C, H, W), steps=250)
    eps_fn = guided_eps_fn(model, y, guidance_scale=4.0, null_class=n_classes)
    guided = diffusion.sample(eps_fn, torch.randn(B, C, H, W), steps=50, method="ddim")

A DiT checks its labels at every call given plain ones (one host read each); sampled through
:func:`.guided_eps_fn`, or called with ``labels = dit.checked_labels(y)``, it reads them once,
and a sampling step reads nothing back.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from addnorm.diffusion.dpm_solver import run_dpm_solver
from addnorm.diffusion.likelihood import discretized_gaussian_log_likelihood, normal_kl
from addnorm.diffusion.reverse import (
    PREDICTIONS,
    ddpm_mean_log_variance,
    predicted_eps,
    predicted_x0,
    split_output,
)
from addnorm.diffusion.sampling import DEFAULT_SPACINGS, METHODS, EpsFn, run_sampler
from addnorm.diffusion.schedules import NoiseSchedule, beta_schedule, gather
from addnorm.diffusion.spacing import SPACINGS, spaced_timesteps
from addnorm.utils.checks import check_bool, check_choice, check_float, check_int, check_tensor

__all__ = ["Diffusion"]

REDUCTIONS = ("mean", "none")


class Diffusion:
    """A Gaussian diffusion of ``n_steps`` steps with a named beta schedule.

    Args:
        n_steps: number of noising steps (DiT: 1000).
        schedule: ``"linear"`` or ``"cosine"`` (:func:`.beta_schedule`).
        prediction: what a model predicts: ``"epsilon"`` (the noise, DiT) or ``"v"``.
        min_snr_gamma: None (DiT: every step's squared error counts alike), or gamma > 0 for
            the Min-SNR weighting (Hang et al., 2023): the error at step t is weighted so that
            it counts as an error of x0 weighted by ``min(SNR(t), gamma)``, with ``SNR(t) =
            abar_t / (1 - abar_t)``: ``min(SNR, gamma) / SNR`` for ``epsilon``,
            ``min(SNR, gamma) / (SNR + 1)`` for ``v`` (as diffusers' training scripts). It
            stops the nearly clean steps, which the loss otherwise weighs most, from taking
            the model's capacity. A gamma so small that some step's weight falls below
            float32's smallest normal number (about 1.2e-38; the loss's dtype, or bfloat16's
            alike) is refused: that weight rounds to 0 or loses its digits, and with the
            smallest gammas every loss would be exactly 0 (1e-34 is about the least for
            DiT's 1000 linear steps).

    ``noise_schedule`` holds the float64 tables (:class:`.NoiseSchedule`). The object has no
    device: tables are cast to each input's dtype and moved to its device at use.
    """

    def __init__(
        self,
        n_steps: int = 1000,
        schedule: str = "linear",
        *,
        prediction: str = "epsilon",
        min_snr_gamma: float | None = None,
    ) -> None:
        self.n_steps = check_int("n_steps", n_steps, min_value=2)
        self.schedule = check_choice("schedule", schedule, ("linear", "cosine"))
        self.prediction = check_choice("prediction", prediction, PREDICTIONS)
        if min_snr_gamma is not None:
            min_snr_gamma = check_float(
                "min_snr_gamma", min_snr_gamma, min_value=0.0, min_inclusive=False
            )
        self.min_snr_gamma = min_snr_gamma
        self.noise_schedule = NoiseSchedule.from_betas(beta_schedule(schedule, n_steps))
        if min_snr_gamma is not None:
            self._check_weights_are_normal_floats()

    def __repr__(self) -> str:
        weighting = "" if self.min_snr_gamma is None else f", min_snr_gamma={self.min_snr_gamma:g}"
        return (
            f"Diffusion(n_steps={self.n_steps}, schedule={self.schedule!r}, "
            f"prediction={self.prediction!r}{weighting})"
        )

    def q_sample(self, x0: Tensor, t: Tensor, noise: Tensor) -> Tensor:
        """x_t = sqrt(abar_t) x0 + sqrt(1 - abar_t) noise, a draw from q(x_t | x_0).

        Shapes: x0, noise (B, C, ...); t (B,) integer steps in [0, n_steps); out like x0.
        """
        self._check_data(x0, t, noise)
        return self._q_sample(x0, t, noise)

    def target(self, x0: Tensor, t: Tensor, noise: Tensor) -> Tensor:
        """What the model regresses onto: ``noise``, or v = sqrt(abar_t) noise - sqrt(1 -
        abar_t) x0. Shapes: as :meth:`q_sample`."""
        self._check_data(x0, t, noise)
        return self._target(x0, t, noise)

    def loss(
        self, output: Tensor, x0: Tensor, t: Tensor, noise: Tensor, *, reduction: str = "mean"
    ) -> Tensor:
        """The training loss of a model's ``output`` at x_t = ``q_sample(x0, t, noise)``.

        mse = mean over non-batch dims of (target - prediction)^2 (:meth:`target`), times the
        Min-SNR weight of each sample's step when ``min_snr_gamma`` is set. With
        learned variance (``output`` of 2C channels) DiT's loss adds :meth:`vb_term`, unscaled
        (DiT's LossType.MSE): loss = mse + vb, where vb sees the prediction detached, so only
        the variance channels learn from it.

        Args:
            reduction: ``"mean"`` (a scalar, the batch mean, as DiT's train.py) or
                ``"none"`` (the (B,) per-sample losses).

        Shapes: output (B, C, ...) or (B, 2C, ...); x0, noise (B, C, ...); t (B,).
        """
        check_choice("reduction", reduction, REDUCTIONS)
        self._check_data(x0, t, noise)
        prediction, variance_values = split_output(output, x0, "output")
        per_sample = _mean_flat((self._target(x0, t, noise) - prediction) ** 2)  # (B,)
        if self.min_snr_gamma is not None:
            per_sample = per_sample * self._loss_weight(t).to(per_sample.dtype)
        if variance_values is not None:
            per_sample = per_sample + self._vb_term(
                prediction.detach(), variance_values, x0, t, noise
            )
        return per_sample.mean() if reduction == "mean" else per_sample

    def _loss_weight(self, t: Tensor) -> Tensor:
        """Each step's weight in :meth:`loss` (1 without ``min_snr_gamma``), float64.

        Shapes: t (B,) integer steps; returns (B,)
        """
        abar = self.noise_schedule.alphas_cumprod.to(t.device)[t]  # (B,)
        if self.min_snr_gamma is None:
            return torch.ones_like(abar)
        snr = abar / (1.0 - abar)  # (B,)
        clipped = snr.clamp(max=self.min_snr_gamma)
        return clipped / snr if self.prediction == "epsilon" else clipped / (snr + 1.0)

    def _check_weights_are_normal_floats(self) -> None:
        """ValueError naming ``min_snr_gamma`` where a step's weight underflows float32."""
        weights = self._loss_weight(torch.arange(self.n_steps))  # (n_steps,) float64, CPU
        step = int(weights.argmin())
        smallest, tiny = float(weights[step]), torch.finfo(torch.float32).tiny
        if smallest >= tiny:
            return
        snr = self.noise_schedule.alphas_cumprod / (1.0 - self.noise_schedule.alphas_cumprod)
        # min(SNR, gamma) / SNR (or / (SNR + 1)) >= tiny at every step where gamma < SNR
        least = tiny * float(snr.max() + (0.0 if self.prediction == "epsilon" else 1.0))
        unit = 10.0 ** (math.floor(math.log10(least)) - 2)
        least = math.ceil(least / unit) * unit  # rounded up to 3 digits: accepted as printed
        raise ValueError(
            f"min_snr_gamma ({self.min_snr_gamma:g}) weights the loss at step {step} by "
            f"{smallest:.3g}, below float32's smallest normal number ({tiny:.3g}): the weighted "
            f"losses would underflow to 0; use min_snr_gamma >= {least:.3g} with this "
            f"schedule (Hang et al. use 5)"
        )

    def vb_term(self, output: Tensor, x0: Tensor, t: Tensor, noise: Tensor) -> Tensor:
        """Step t's term of the variational bound, in bits per dimension, for a model whose
        ``output`` has 2C channels (prediction, then variance values).

        KL(q(x_{t-1} | x_t, x_0) || p(x_{t-1} | x_t)) for t > 0, and for t = 0 the negative
        log-likelihood of x0 under p(x_0 | x_1) discretized to 256 bins of [-1, 1]. As DiT's
        ``_vb_terms_bpd`` (``clip_denoised=False``). Gradients reach both halves; :meth:`loss`
        detaches the prediction. Shapes: output (B, 2C, ...); x0, noise (B, C, ...); t, out (B,).
        """
        self._check_data(x0, t, noise)
        prediction, variance_values = split_output(output, x0, "output")
        if variance_values is None:
            raise ValueError(
                f"vb_term needs an output with variance channels, shape "
                f"{(x0.shape[0], 2 * x0.shape[1], *x0.shape[2:])}, got {tuple(output.shape)}"
            )
        return self._vb_term(prediction, variance_values, x0, t, noise)

    def sample(
        self,
        eps_fn: EpsFn,
        noise: Tensor,
        /,
        *,
        steps: int | None = None,
        method: str = "ddpm",
        eta: float = 0.0,
        spacing: str | None = None,
        clip_denoised: bool = False,
        generator: torch.Generator | None = None,
        progress: bool = False,
    ) -> Tensor:
        """Samples x_0 from x_T = ``noise`` by running the reverse process.

        Args:
            eps_fn: ``eps_fn(x_t, t)`` returns the predicted noise (B, C, ...) (v, for
                ``prediction="v"``), or (B, 2C, ...) followed by learned-variance channels
                (DDPM steps use them; DDIM and DPM-Solver++ read the first C only). ``t``
                is a (B,) long tensor of original step numbers (0 .. n_steps - 1) whatever
                ``steps``. Any
                callable works: a model in a lambda, :func:`.guided_eps_fn`, an analytic
                denoiser. Nothing here reads a value back per step; what ``eps_fn`` reads is
                its own (a DiT's checked labels: none).
            noise: the starting x_T (B, C, ...), finite; it fixes the output's shape, dtype,
                device.
            steps: number of steps, any of 1 .. n_steps with any spacing (default: all).
            method: ``"ddpm"`` (ancestral sampling), ``"ddim"`` or ``"dpm-solver++"``
                (DPM-Solver++(2M), deterministic, :mod:`.dpm_solver`).
            eta: DDIM's noise scale in [0, 1] (0: deterministic; 1: DDPM's posterior
                variance). DDIM only.
            spacing: which steps a shorter sampler visits (:mod:`.spacing`); default
                ``"strided"`` for DDIM, ``"sections"`` for DDPM, as DiT;
                ``"dpm-linspace"`` for DPM-Solver++, as diffusers' scheduler.
            clip_denoised: clamp each predicted x_0 to [-1, 1] (pixel-space data).
            generator: the source of DDPM's (and DDIM's eta > 0) noise.
            progress: show a tqdm bar (stderr); nothing is printed otherwise.

        Raises:
            FloatingPointError: the sample is not finite. With finite noise this means
                ``eps_fn``'s outputs grew past the dtype's range: typically a classifier-free
                guidance scale so large that ``s * (cond - uncond)`` sends x_t, and with it
                the model's activations, to overflow. Where that happens depends on the
                model (how far its conditional and unconditional predictions differ), not on
                the scale alone, so it is caught here, on the result, rather than guessed
                from the arguments. Costs one host sync per call.

        Shapes: noise (B, C, ...) -> (B, C, ...). Runs under ``torch.no_grad``.
        """
        if not callable(eps_fn):
            raise TypeError(f"eps_fn must be callable, got {type(eps_fn).__name__}")
        check_tensor("noise", noise, floating=True)
        if noise.ndim < 2:
            raise ValueError(f"noise must have shape (B, C, ...), got {tuple(noise.shape)}")
        check_choice("method", method, METHODS)
        steps = self.n_steps if steps is None else check_int("steps", steps, min_value=1)
        if steps > self.n_steps:
            raise ValueError(f"steps ({steps}) must be <= n_steps ({self.n_steps})")
        eta = check_float("eta", eta, min_value=0.0, max_value=1.0)  # > 1: sqrt of < 0
        if method != "ddim" and eta != 0.0:
            raise ValueError(
                f"eta applies to method='ddim' only, got eta={eta} with {method!r}"
            )
        if spacing is None:
            spacing = DEFAULT_SPACINGS[method]
        check_choice("spacing", spacing, SPACINGS)
        if generator is not None and not isinstance(generator, torch.Generator):
            raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")
        _check_finite_noise(noise)
        timesteps = spaced_timesteps(self.n_steps, steps, spacing)  # checked above
        chain = self.noise_schedule.respaced(timesteps)
        clip_denoised = check_bool("clip_denoised", clip_denoised)
        progress = check_bool("progress", progress)
        if method == "dpm-solver++":
            sample = run_dpm_solver(chain, eps_fn, noise, prediction=self.prediction,
                                    clip_denoised=clip_denoised, progress=progress)
        else:
            sample = run_sampler(chain, eps_fn, noise, method=method, prediction=self.prediction,
                                 eta=eta, generator=generator, clip_denoised=clip_denoised,
                                 progress=progress)
        _check_finite_sample(sample, f"{method}, {steps} of {self.n_steps} steps, {spacing}")
        return sample

    # ----------------------------------------------------------------- unchecked internals

    def _q_sample(self, x0: Tensor, t: Tensor, noise: Tensor) -> Tensor:
        sched = self.noise_schedule
        return (
            gather(sched.sqrt_alphas_cumprod, t, x0) * x0
            + gather(sched.sqrt_one_minus_alphas_cumprod, t, x0) * noise
        )

    def _target(self, x0: Tensor, t: Tensor, noise: Tensor) -> Tensor:
        if self.prediction == "epsilon":
            return noise
        sched = self.noise_schedule
        return (
            gather(sched.sqrt_alphas_cumprod, t, x0) * noise
            - gather(sched.sqrt_one_minus_alphas_cumprod, t, x0) * x0
        )

    def _vb_term(
        self, prediction: Tensor, variance_values: Tensor, x0: Tensor, t: Tensor, noise: Tensor
    ) -> Tensor:
        sched = self.noise_schedule
        x_t = self._q_sample(x0, t, noise)
        eps = predicted_eps(sched, prediction, x_t, t, self.prediction)
        model_mean, model_log_var = ddpm_mean_log_variance(
            sched, predicted_x0(sched, eps, x_t, t), x_t, t, variance_values
        )
        true_mean, _ = ddpm_mean_log_variance(sched, x0, x_t, t, None)
        true_log_var = gather(sched.posterior_log_variance, t, x_t)
        kl = _mean_flat(normal_kl(true_mean, true_log_var, model_mean, model_log_var))
        nll = -_mean_flat(
            discretized_gaussian_log_likelihood(
                x0, means=model_mean, log_scales=(0.5 * model_log_var).expand_as(x0)
            )
        )
        return torch.where(t == 0, nll, kl) / math.log(2.0)  # (B,) bits per dim

    def _check_data(self, x0: Tensor, t: Tensor, noise: Tensor) -> None:
        check_tensor("x0", x0, floating=True)
        check_tensor("noise", noise, floating=True)
        check_tensor("t", t, ndim=1)
        if x0.ndim < 2:
            raise ValueError(f"x0 must have shape (B, C, ...), got {tuple(x0.shape)}")
        if noise.shape != x0.shape:
            raise ValueError(
                f"noise shape {tuple(noise.shape)} must equal x0 shape {tuple(x0.shape)}"
            )
        if t.dtype == torch.bool or t.is_floating_point() or t.is_complex():
            raise TypeError(f"t must be an integer tensor, got dtype {t.dtype}")
        if len(t) != len(x0):
            raise ValueError(f"t must have shape ({len(x0)},) to match x0, got {tuple(t.shape)}")
        if t.numel() == 0:
            return
        low, high = torch.stack(torch.aminmax(t)).tolist()  # one host sync
        if low < 0 or high >= self.n_steps:
            raise ValueError(
                f"t must lie in [0, {self.n_steps - 1}], got values in [{low}, {high}]"
            )


def _mean_flat(x: Tensor) -> Tensor:
    """Mean over every dim but the batch: (B, ...) -> (B,)."""
    return x.mean(dim=tuple(range(1, x.ndim)))


def _check_finite_noise(noise: Tensor) -> None:
    """ValueError unless every value of the starting noise is finite (one host sync)."""
    bad = int((~torch.isfinite(noise)).sum()) if noise.numel() else 0
    if bad:
        raise ValueError(f"noise must be finite, got {bad} non-finite of {noise.numel()} values")


def _check_finite_sample(sample: Tensor, run: str) -> None:
    """FloatingPointError if sampling from finite noise ended in non-finite values."""
    bad = int((~torch.isfinite(sample)).sum()) if sample.numel() else 0
    if bad:
        raise FloatingPointError(
            f"sampling ({run}) ended with {bad} non-finite of {sample.numel()} values in "
            f"{sample.dtype}: eps_fn's outputs overflowed it or were not finite (under "
            "classifier-free guidance, a smaller guidance scale keeps the samples finite)"
        )
