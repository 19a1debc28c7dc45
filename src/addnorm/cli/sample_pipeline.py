"""``addnorm sample --checkpoint PIPELINE``: decoded RGB images from a diffusers DiT pipeline
folder (``facebook/DiT-XL-2-256``, or ``DiTPipeline.save_pretrained``'s), as a PNG grid and,
with ``--save-array``, uint8 (N, H, W, 3).

The folder is opened by :func:`addnorm.interop.diffusers_pipeline.from_diffusers_pipeline`;
its scheduler config is the default sampler (``--sampler`` replaces it, as diffusers'
``OtherScheduler.from_config(config)`` would), ``--guidance`` defaults to ``DiTPipeline``'s 4,
and ``--class`` takes an id or any synonym of the folder's ``id2label``. A folder that is not
such a pipeline (a part missing, a ``vae/`` that is no ``AutoencoderKL``, latent channels other
than the DiT's), an unknown class name (the closest names are said), a scheduler setting
addnorm does not reproduce, and ``--sampler ddpm`` exit 2 with one line and write nothing; a
damaged file exits 1. Images are drawn ``PIPELINE_CHUNK`` at a time (the VAE decoder's
activations grow with the image side), the starting latents of each chunk drawn in turn from
the ``--seed`` generator.
"""

from __future__ import annotations

import argparse
import sys

from addnorm.cli.checks import UsageError, apply_runtime_flags
from addnorm.cli.exits import EXIT_OK
from addnorm.interop.diffusers_pipeline import is_pipeline_folder

__all__ = ["PIPELINE_CHUNK", "is_pipeline_folder", "sample_pipeline"]

PIPELINE_CHUNK = 16  # images sampled and decoded at once


def sample_pipeline(args: argparse.Namespace) -> int:
    """Draw ``--n`` images from the pipeline folder ``--checkpoint`` (flags checked by
    ``sample``'s run: the ones that need no folder)."""
    import numpy as np
    import torch

    from addnorm.cli.grid import save_image_grid
    from addnorm.interop.diffusers_vae import PipelinePartError
    from addnorm.interop.dit_pipeline import DEFAULT_GUIDANCE
    from addnorm.tasks.loading import load

    if args.method == "ddpm":
        raise UsageError("--sampler ddpm: a pipeline folder samples with ddim or dpm-solver++")
    device = apply_runtime_flags(args)
    try:
        pipe = load(args.checkpoint, device=device)
    except PipelinePartError as err:
        raise UsageError(f"--checkpoint {err}") from None
    except ImportError as err:  # diffusers, for the VAE: the message says how to install it
        raise UsageError(str(err)) from None
    try:
        settings = pipe.sampler(args.method)
        settings.check_steps(args.steps)
    except ValueError as err:
        raise UsageError(f"--checkpoint {args.checkpoint}: {err}") from None
    if args.steps > settings.n_steps:
        raise UsageError(f"--steps must be <= the diffusion's {settings.n_steps} steps, got "
                         f"{args.steps}")
    names = pipe.class_names
    if args.class_name is None:
        labels = torch.arange(args.n) % names.n_classes
    else:
        try:
            labels = torch.full((args.n,), names.index(args.class_name))
        except ValueError as err:
            raise UsageError(f"--{err}") from None
    guidance = DEFAULT_GUIDANCE if args.guidance is None else args.guidance
    generator = torch.Generator(device=device).manual_seed(args.seed)
    progress = not args.quiet and sys.stderr.isatty()
    try:
        images = torch.cat([
            pipe.sample(chunk, steps=args.steps, method=settings.method, guidance=guidance,
                        generator=generator, progress=progress).cpu()
            for chunk in labels.split(PIPELINE_CHUNK)
        ])  # (N, 3, H, W) on [0, 1]
    except FloatingPointError:
        raise FloatingPointError(
            f"--guidance {guidance:g} (--sampler {settings.method}, --steps {args.steps}) gave "
            "non-finite samples, nothing written: use a smaller --guidance (DiT uses 1.5 to 4)"
        ) from None
    pixels = (images * 255).round().to(torch.uint8)  # as diffusers' numpy_to_pil
    title = f"{settings.method} {args.steps} steps, guidance {guidance:g}"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    grid = save_image_grid(pixels, [names.name(int(c)) for c in labels], args.out, vmax=255,
                           title=title)
    print(f"grid: {grid}")
    if args.save_array is not None:
        array = pixels.permute(0, 2, 3, 1).numpy()  # (N, H, W, 3), the layout of image files
        args.save_array.parent.mkdir(parents=True, exist_ok=True)
        np.save(args.save_array, array)
        print(f"array: {args.save_array} {tuple(array.shape)} {array.dtype}, 0..255 scale")
    return EXIT_OK
