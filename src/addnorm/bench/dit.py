"""Cases 4 and 5: the DiT against diffusers' ``DiTTransformer2DModel`` at equal size (same
weights), and ``timestep_embedding`` against diffusers' ``get_timestep_embedding``.

- Forward (inference) of DiT-digits at batch 64 and, in the full run, DiT-S/2 on 32 x 32
  latents at batch 2: images/s.
- Sampling: 50 DDIM steps (10 in the quick run) of DiT-digits at batch 64 through addnorm's
  sampler, the network being either model: images/s.
- The timestep embedding of 256 timesteps into 256 channels (diffusers' convention: ``[cos |
  sin]``, shift 1): calls/s, and the values checked equal.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from addnorm.bench.harness import (
    BenchSettings,
    Check,
    Report,
    compiled_first_call,
    time_case,
)
from addnorm.bench.references import optional_module
from addnorm.bench.small_models import randomized_dit
from addnorm.diffusion.gaussian import Diffusion
from addnorm.timestep import timestep_embedding

__all__ = ["run_dit", "run_timestep"]

GROUP = "DiT"


def _inputs(cfg, batch: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    x = torch.randn(batch, cfg.in_channels, cfg.input_size, cfg.input_size)
    t = torch.randint(0, 1000, (batch,))
    y = torch.randint(0, cfg.n_classes, (batch,))
    return x, t, y


def _check_against_diffusers(
    fns: dict[str, Callable[[], torch.Tensor]], case: str, what: str, tolerance: float,
    report: Report,
) -> None:
    """One check per addnorm variant in ``fns``: its output against the ``"diffusers"`` one,
    named ``"{case}: {variant} vs diffusers{what}"``."""
    want = fns["diffusers"]()
    for impl, fn in fns.items():
        if impl != "diffusers":
            error = (fn() - want).abs().max().item()
            report.checks.append(Check(GROUP, f"{case}: {impl} vs diffusers{what}", error,
                                       tolerance))


def _forward(name: str, batch: int, settings: BenchSettings, report: Report,
             log: Callable[[str], None]) -> None:
    from addnorm.interop.diffusers import to_diffusers

    ours = randomized_dit(name)
    theirs = to_diffusers(ours).eval()
    x, t, y = _inputs(ours.cfg, batch)
    case = f"{name} forward B={batch}"
    log(f"{GROUP}: {case}")

    def ours_fn() -> torch.Tensor:
        with torch.no_grad():
            return ours(x, t, y)

    def theirs_fn() -> torch.Tensor:
        with torch.no_grad():
            return theirs(x, timestep=t, class_labels=y).sample

    fns = {"addnorm": ours_fn, "diffusers": theirs_fn}
    if settings.compile:
        compiled = torch.compile(ours, fullgraph=True)

        def compiled_fn() -> torch.Tensor:
            with torch.no_grad():
                return compiled(x, t, y)

        fns["addnorm, compiled"] = compiled_first_call(compiled_fn, report, f"{GROUP}: {case}")
    _check_against_diffusers(fns, case, ", same weights", 1e-4, report)
    times = time_case(fns, settings, report, GROUP, case)
    report.add_rows(GROUP, case, times, per_call=batch, unit="images/s",
                    references={"diffusers"})


def _sampling(name: str, batch: int, steps: int, settings: BenchSettings, report: Report,
              log: Callable[[str], None]) -> None:
    from addnorm.interop.diffusers import to_diffusers

    ours = randomized_dit(name)
    theirs = to_diffusers(ours).eval()
    noise, _, y = _inputs(ours.cfg, batch)
    diffusion = Diffusion(1000)
    case = f"{name} sampling, {steps} DDIM steps, B={batch}"
    log(f"{GROUP}: {case}")

    def ours_eps(x_t: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return ours(x_t, t, y)

    def theirs_eps(x_t: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return theirs(x_t, timestep=t, class_labels=y).sample

    def sample(eps_fn) -> Callable[[], torch.Tensor]:
        return lambda: diffusion.sample(eps_fn, noise, steps=steps, method="ddim")

    fns = {"addnorm": sample(ours_eps), "diffusers": sample(theirs_eps)}
    if settings.compile:  # one graph: every step has the same shapes
        compiled = torch.compile(ours, fullgraph=True)
        fns["addnorm, compiled"] = compiled_first_call(
            sample(lambda x_t, t: compiled(x_t, t, y)), report, f"{GROUP}: {case}")
    _check_against_diffusers(fns, case, " samples", 1e-3, report)
    times = time_case(fns, settings, report, GROUP, case)
    report.add_rows(GROUP, case, times, per_call=batch, unit="images/s",
                    references={"diffusers"})


def run_dit(settings: BenchSettings, report: Report, log: Callable[[str], None]) -> None:
    """DiT forward and sampling throughput against diffusers, same weights."""
    if optional_module("diffusers", report.notes) is None:
        report.notes.append(f"{GROUP}: skipped, its reference (diffusers) is missing")
        return
    if settings.size == "test":
        _forward("DiT-digits-tiny", 2, settings, report, log)
        _sampling("DiT-digits-tiny", 2, 2, settings, report, log)
        return
    _forward("DiT-digits", 64, settings, report, log)
    if settings.size == "full":
        _forward("DiT-S/2", 2, settings, report, log)
    _sampling("DiT-digits", 64, 10 if settings.size == "quick" else 50, settings, report, log)


def run_timestep(settings: BenchSettings, report: Report, log: Callable[[str], None]) -> None:
    """``timestep_embedding`` against diffusers' ``get_timestep_embedding``, same values."""
    embeddings = optional_module("diffusers.models.embeddings", report.notes)
    if embeddings is None:
        report.notes.append("timestep embedding: skipped, its reference (diffusers) is missing")
        return
    n, dim = 256, 256
    t = torch.randint(0, 1000, (n,))
    case = f"{n} timesteps x {dim} channels"
    log(f"timestep embedding: {case}")

    def ours() -> torch.Tensor:
        return timestep_embedding(t, dim, downscale_freq_shift=1.0)

    def theirs() -> torch.Tensor:
        return embeddings.get_timestep_embedding(t, dim, flip_sin_to_cos=True,
                                                 downscale_freq_shift=1.0)

    error = (ours() - theirs()).abs().max().item()
    report.checks.append(Check("timestep embedding", f"{case}: addnorm vs diffusers", error, 1e-5))
    times = time_case({"addnorm": ours, "diffusers": theirs}, settings, report,
                      "timestep embedding", case)
    report.add_rows("timestep embedding", case, times, per_call=1, unit="calls/s",
                    references={"diffusers"})
