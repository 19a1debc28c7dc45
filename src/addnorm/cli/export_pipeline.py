"""``addnorm export RUN --format pipeline --out FOLDER``: a DiT run trained on a VAE's latents
(``addnorm train dit --data DIR --vae VAE --timestep-downscale-freq-shift 1``) as a diffusers
DiT pipeline folder, checked against diffusers' own ``DiTPipeline``.

The folder is what :func:`addnorm.tasks.dit_latents.save_pipeline` writes (its DiT, its VAE,
a ``DPMSolverMultistepScheduler`` of its diffusion, its class names as ``id2label``; a DiT of
fewer than 1000 classes padded so that diffusers' guidance is exact:
:mod:`addnorm.interop.pipeline_classes`). It is written under a temporary name beside
``--out`` and renamed into place when complete, so a failure leaves nothing behind. Then
diffusers' ``DiTPipeline.from_pretrained`` loads it and samples ``CHECK_STEPS`` steps at
guidance ``CHECK_GUIDANCE`` (4) for up to ``CHECK_IMAGES`` classes, and addnorm samples the
run's own DiT from the same noise (:class:`~addnorm.interop.dit_pipeline.DiTPipeline`); the
images (on [0, 1]) differing by more than ``TOLERANCE`` is a failure (exit 1).

Exit 2 with one line, nothing written: ``--out`` an existing non-empty folder (unless
``--overwrite``, which replaces it once the new folder is complete), a file, or the run's
own folder or one holding it, ``RUN`` no
``addnorm train`` run, a run of another task, a run on pixels (no ``--vae``), a DiT diffusers
cannot hold (``--timestep-downscale-freq-shift 0``, no null class, over 1000 classes), or a
VAE that changed since the run. What diffusers prints while saving and loading (progress bars,
notes) is shown only on failure or with ``--verbose``, as for ONNX.
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

from addnorm.cli.captured_output import CapturedOutput
from addnorm.cli.checks import UsageError
from addnorm.cli.exits import EXIT_FAILED, EXIT_OK

__all__ = ["CHECK_GUIDANCE", "CHECK_IMAGES", "CHECK_STEPS", "TOLERANCE", "export_pipeline",
           "pipeline_max_error"]

CHECK_STEPS = 4  # sampling steps of the check: a few, each of which guides
CHECK_IMAGES = 2  # images of the check: classes 0 and 1 (or 0 alone)
CHECK_GUIDANCE = 4.0  # DiTPipeline.__call__'s default guidance_scale, which guides
# Largest |diffusers - addnorm| accepted on images in [0, 1]: a tenth of one 8-bit level.
# float32 kernels of two implementations: the tests' small pipelines differ by <= 6e-7, a
# DiT-S-sized one (d 384, 12 layers) under a four-level VAE at 128x128 by 2e-6; a guidance of
# 3.9 instead of 4 moves the small ones by ~1e-3, a null row that is a class's by 6e-2.
TOLERANCE = 4e-4


def export_pipeline(args: argparse.Namespace) -> int:
    """Handle ``addnorm export --format pipeline``; returns the exit code."""
    from addnorm.dit.model import DiT
    from addnorm.tasks.dit import DiTTask
    from addnorm.tasks.dit_latents import save_pipeline
    from addnorm.tasks.trained import load_trained
    from addnorm.training.checkpoint import find_checkpoint
    from addnorm.utils.files import CheckpointError

    if args.part is not None:
        raise UsageError(f"--part {args.part}: --format pipeline writes the whole DiT, its VAE "
                         "and its scheduler")
    out, run = args.out, args.checkpoint
    _check_out_folder(out, overwrite=args.overwrite)
    if out.resolve() == run.resolve() or out.resolve() in run.resolve().parents:
        raise UsageError(f"--out {out}: holds the run {run}, which the pipeline would replace")
    try:
        find_checkpoint(run)
    except CheckpointError as err:
        raise UsageError(f"{err}; --format pipeline writes an addnorm train dit run on a "
                         "VAE's latents (--vae)") from None
    try:
        task, model, _ = load_trained(run, weights=args.weights, device="cpu")
    except ValueError as err:  # DataChangedError among them: the VAE changed or is gone
        raise UsageError(f"{run}: {err}") from None
    if not isinstance(task, DiTTask) or not isinstance(model, DiT):
        raise UsageError(f"{run} is a {type(model).__name__} run; --format pipeline writes a "
                         "DiT run on a VAE's latents (addnorm train dit --vae)")
    quiet = not args.verbose
    try:
        with CapturedOutput(quiet) as writing:
            _write_atomically(out, lambda folder: save_pipeline(task, model, folder))
    except ValueError as err:  # what diffusers cannot hold: nothing was written
        raise UsageError(f"{run}: {err}") from None
    except Exception as err:
        writing.show()
        print(f"addnorm export: error: writing the pipeline failed ({_first_line(err)})",
              file=sys.stderr)
        return EXIT_FAILED
    n_classes = model.cfg.n_classes
    print(f"wrote {out}: a diffusers DiTPipeline of {run}'s DiT ({n_classes} classes), its VAE "
          "and a DPMSolverMultistepScheduler")
    if args.no_check:
        return EXIT_OK
    labels = list(range(min(n_classes, CHECK_IMAGES)))
    try:
        with CapturedOutput(quiet) as checking:
            error = pipeline_max_error(out, task, model, labels)
    except Exception as err:
        checking.show()
        print(f"addnorm export: error: sampling {out} with diffusers' DiTPipeline failed "
              f"({_first_line(err)})", file=sys.stderr)
        return EXIT_FAILED
    print(f"diffusers' DiTPipeline vs addnorm, {len(labels)} images of {CHECK_STEPS} steps at "
          f"guidance {CHECK_GUIDANCE:g}: max |difference| {error:.1e}")
    if not error <= TOLERANCE:
        writing.show()
        checking.show()
        print(f"addnorm export: error: diffusers' images differ from addnorm's by {error:.1e} "
              f"(more than {TOLERANCE:.0e})", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


def pipeline_max_error(folder: Path, task, model, labels: list[int]) -> float:
    """max |diffusers' images - addnorm's| (on [0, 1]): diffusers' ``DiTPipeline`` loaded from
    ``folder`` against the run's DiT ``model`` and its task's VAE sampled by addnorm with the
    folder's scheduler, both from the seed-0 noise, ``CHECK_STEPS`` steps at ``CHECK_GUIDANCE``."""
    import diffusers
    import torch

    from addnorm.dit.class_names import ClassNames
    from addnorm.interop.dit_pipeline import DiTPipeline

    theirs = diffusers.DiTPipeline.from_pretrained(folder, low_cpu_mem_usage=False)
    theirs.set_progress_bar_config(disable=True)
    expected = theirs(labels, guidance_scale=CHECK_GUIDANCE, num_inference_steps=CHECK_STEPS,
                      generator=torch.Generator().manual_seed(0), output_type="pt").images
    scheduler = theirs.scheduler  # what scheduler_config.json holds: its config and class
    scheduler_config = {**scheduler.config, "_class_name": type(scheduler).__name__}
    names = ClassNames(model.cfg.n_classes, dict(enumerate(task.class_names)))
    ours = DiTPipeline(model, task.data.vae, scheduler_config, names).eval()
    images = ours.sample(labels, steps=CHECK_STEPS, guidance=CHECK_GUIDANCE,
                         generator=torch.Generator().manual_seed(0))
    return float((images - expected.to(images)).abs().max())


def _check_out_folder(out: Path, *, overwrite: bool) -> None:
    """UsageError unless a folder can be put at ``out``: its parent an existing writable
    folder, ``out`` missing, an empty folder, or (``overwrite``) any folder."""
    where = f"--out {out}"
    if out.name in ("", ".", ".."):
        raise UsageError(f"{where}: must name the folder to write")
    parent = out.parent
    if not parent.is_dir():
        what = "does not exist" if not parent.exists() else "is not a folder"
        raise UsageError(f"{where}: its folder {parent} {what}")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"{where}: cannot write in its folder {parent}")
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise UsageError(f"{where}: exists and is not a folder")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise UsageError(f"{where}: the folder exists and is not empty (--overwrite "
                         "replaces it)")


def _write_atomically(out: Path, write: Callable[[Path], object]) -> None:
    """``write(folder)`` into a new folder beside ``out``, then that folder renamed to ``out``
    (an existing ``out`` moved aside first and removed after); on any failure the new folder
    is removed and ``out`` is as it was."""
    token = f"{os.getpid()}-{secrets.token_hex(4)}"
    staging = out.parent / f".{out.name}.{token}.partial"
    aside = out.parent / f".{out.name}.{token}.old"
    staging.mkdir()
    try:
        write(staging)
        if out.exists():
            os.rename(out, aside)
            try:
                os.rename(staging, out)
            except OSError:
                os.rename(aside, out)
                raise
            shutil.rmtree(aside, ignore_errors=True)
        else:
            os.rename(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _first_line(err: Exception) -> str:
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0]}" if text else type(err).__name__
