"""``addnorm sample --out GRID.png``: images drawn by a trained dit run, as a PNG grid for
people and, with ``--save-array``, an array for programs: the digits as (N, 8, 8) on their own
0..16 scale; a run on your images as uint8 0..255, (N, S, S) grayscale or (N, S, S, 3) colour
(the layout ``--data FILE.npz`` takes). ``--class NAME`` names a class as the run does: a digit
0-9, or your class folder's name (``addnorm info RUN`` lists them). ``--checkpoint`` may also
be a diffusers DiT pipeline folder (:mod:`addnorm.cli.sample_pipeline`: decoded RGB images).

``--sampler`` (``--method`` before it, still accepted) is ``ddim``, ``ddpm`` or
``dpm-solver++``, each the dit task's ``SampleSettings.method``.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from pathlib import Path

from addnorm.cli.checks import UsageError, check_out_file, seed
from addnorm.cli.exits import EXIT_OK
from addnorm.cli.sample_pipeline import is_pipeline_folder, sample_pipeline
from addnorm.cli.shared_flags import add_inference_flags, load_task_model
from addnorm.diffusion.sampling import METHODS

__all__ = ["add_parser", "run"]


def add_parser(subparsers) -> None:
    """Register ``addnorm sample``."""
    sample = subparsers.add_parser(
        "sample",
        help="draw images from a trained DiT",
        description="Generate images with a trained dit run: a PNG grid for people and, with "
        "--save-array, an array for programs: the digits as (N, 8, 8) on their own 0..16 "
        "scale, your images as uint8 (N, S, S) or (N, S, S, 3); or with a diffusers DiT "
        "pipeline folder: decoded RGB images, uint8 (N, H, W, 3).",
    )
    sample.add_argument(
        "--checkpoint", type=Path, default=Path("runs/dit"),
        help="a dit run folder (its best checkpoint, else its newest: --which), one checkpoint "
        "folder, a folder addnorm.load opens (save_pretrained's, transformers' or diffusers') "
        "whose model the dit task trains (a folder holds no diffusion: it is sampled with "
        "the dit task's own settings, 1000 linear steps, v-prediction), or a diffusers DiT "
        "pipeline folder (model_index.json, transformer/, vae/, scheduler/: decoded RGB "
        "images; its VAE needs diffusers, pip install 'addnorm[interop]')",
    )
    sample.add_argument(
        "--class", dest="class_name", metavar="NAME", default=None,
        help="the class to draw, by the run's name for it: a digit 0-9, or your class "
        "folder's name; for a pipeline folder, an id or any name of its id2label ('goldfish', "
        "'Carassius auratus') (default: every class in turn)",
    )
    sample.add_argument("--n", type=int, default=20, help="how many samples (default 20)")
    sample.add_argument(
        "--steps", type=int, default=50,
        help="sampling steps, 1 to the run's diffusion steps (default 50)",
    )
    sample.add_argument(
        "--sampler", "--method", dest="method", choices=METHODS, default=None,
        help="ddim (deterministic, eta 0, on DiT's strided steps: 0, 20, ..., 980 for 50 of "
        "1000), ddpm (ancestral, on DiT's evenly divided steps: 0, 20, 41, ..., 999) or "
        "dpm-solver++ (DPM-Solver++(2M), deterministic, on diffusers' steps: 20, 40, ..., "
        "999 for 50 of 1000; on the digits DiT its 10 steps score as DDIM's 50); default "
        "ddim, or a pipeline folder's own scheduler (DDIM or DPM-Solver++)",
    )
    sample.add_argument(
        "--guidance", type=float, default=None,
        help="classifier-free guidance scale, finite and >= 0; 1 = none (default 3.0; 1 for "
        "a run on one class, which has no other to tell apart; 4.0 for a pipeline folder, "
        "as diffusers' DiTPipeline)",
    )
    sample.add_argument("--seed", type=seed, default=0,
                        help="seeds the starting noise (and ddpm's), 0 to 2**64 - 1")
    sample.add_argument("--out", type=Path, required=True, metavar="GRID.png",
                        help="the PNG grid to write (its folder is created)")
    sample.add_argument(
        "--save-array", type=Path, default=None, metavar="SAMPLES.npy",
        help="also write the samples: digits as an (N, 8, 8) float array on the 0..16 "
        "scale, your images as uint8 (N, S, S) or (N, S, S, 3) (default: not written)",
    )
    sample.add_argument("--quiet", action="store_true", help="no progress bar")
    add_inference_flags(sample)


def run(args: argparse.Namespace) -> int:
    """Draw images from a dit run: a PNG grid, and the raw array with --save-array.

    Accepted: ``--steps`` 1 .. the run's diffusion steps with any sampler (every count has
    its steps, :mod:`addnorm.diffusion.spacing`), ``--guidance`` finite and >= 0, ``--class``
    one of the run's class names; anything else exits 2 before the checkpoint is read (the
    steps' upper bound and the class: once it is; a run on a VAE's latents whose VAE changed
    or is gone: when it decodes). Samples that come out non-finite (a guidance scale far past
    any useful one) exit 1 with one line and nothing written. A pipeline folder is sampled by
    :func:`~addnorm.cli.sample_pipeline.sample_pipeline`."""
    import numpy as np
    import torch

    from addnorm.cli.grid import save_image_grid
    from addnorm.data.data_errors import DataChangedError
    from addnorm.tasks.dit_evaluation import SampleSettings
    from addnorm.utils.publish import publishing

    check_sample_flags(args)
    if is_pipeline_folder(args.checkpoint):
        return sample_pipeline(args)
    method = args.method or "ddim"
    try:
        guidance = {} if args.guidance is None else {"guidance": args.guidance}
        settings = SampleSettings(steps=args.steps, method=method, **guidance)
    except (ValueError, TypeError) as err:
        raise UsageError(f"--{str(err).replace('_', '-')}") from None
    task, model = load_task_model(args, "dit")
    if settings.steps > task.n_steps:
        raise UsageError(
            f"--steps must be <= the diffusion's {task.n_steps} steps, got {settings.steps}"
        )
    if args.guidance is None:  # the run's own default: none for a single class
        settings = dataclasses.replace(settings, guidance=task.sample_settings.guidance)
    n_classes = len(task.class_names)
    if args.class_name is None:
        labels = torch.arange(args.n) % n_classes
    else:
        try:
            labels = torch.full((args.n,), task.class_index(args.class_name))
        except ValueError as err:
            raise UsageError(f"--{err}") from None
    device = next(model.parameters()).device
    generator = torch.Generator(device=device).manual_seed(args.seed)
    try:
        pixels = task.sample(
            model, labels, settings, generator=generator,
            progress=not args.quiet and sys.stderr.isatty(),
        )  # digits (N, 8, 8) on 0..16; your images uint8 (N, C, S, S)
    except DataChangedError as err:  # a run on a VAE's latents whose VAE changed or is gone
        raise UsageError(f"--checkpoint {args.checkpoint}: {err}") from None
    except FloatingPointError:  # the parser's main: one line, exit 1
        raise FloatingPointError(
            f"--guidance {settings.guidance:g} (--sampler {method}, --steps "
            f"{settings.steps}) gave non-finite samples, nothing written: the model's guided "
            "predictions overflowed or were not finite; use a smaller --guidance (DiT uses "
            "1.5 to 4)"
        ) from None
    title = f"{method} {settings.steps} steps, guidance {settings.guidance:g}"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    names = [task.class_names[int(c)] for c in labels]
    grid = save_image_grid(pixels, names, args.out, vmax=task.pixel_max, title=title)
    print(f"grid: {grid}")
    if args.save_array is not None:
        array = pixels.numpy()
        if array.ndim == 4:  # (N, C, S, S) -> the layout of image files
            array = array[:, 0] if array.shape[1] == 1 else array.transpose(0, 2, 3, 1)
        args.save_array.parent.mkdir(parents=True, exist_ok=True)
        with publishing(args.save_array) as staged:  # whole or not at all
            np.save(staged, array)
        print(f"array: {args.save_array} {tuple(array.shape)} {array.dtype}, "
              f"0..{task.pixel_max:g} scale")
    return EXIT_OK


def check_sample_flags(args: argparse.Namespace) -> None:
    """The checks of ``sample``'s flags that need no checkpoint (UsageError, exit 2)."""
    if not 1 <= args.n <= 10_000:
        raise UsageError(f"--n must be from 1 to 10000, got {args.n}")
    if args.out.suffix.lower() != ".png":
        raise UsageError(f"--out must name a .png file, got {args.out}")
    if args.save_array is not None and args.save_array.suffix.lower() != ".npy":
        raise UsageError(f"--save-array must name a .npy file, got {args.save_array}")
    check_out_file(args.out, "--out", make_parents=True)
    if args.save_array is not None:
        check_out_file(args.save_array, "--save-array", make_parents=True)
    if args.steps < 1:  # its upper bound, the diffusion's steps, once the model is loaded
        raise UsageError(f"--steps must be >= 1, got {args.steps}")
    if args.guidance is not None and not math.isfinite(args.guidance):
        raise UsageError(f"--guidance must be finite, got {args.guidance}")
    if args.guidance is not None and args.guidance < 0:
        raise UsageError(f"--guidance must be >= 0.0, got {args.guidance}")

