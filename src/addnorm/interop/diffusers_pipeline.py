"""A diffusers DiT pipeline folder (``DiTPipeline.save_pretrained``, or ``facebook/DiT-XL-2-256``
from the Hub) as a :class:`~addnorm.interop.dit_pipeline.DiTPipeline`.

The folder::

    model_index.json        {"_class_name": "DiTPipeline", "transformer": [...], "vae": [...],
                             "scheduler": [...], "id2label": {"0": "tench, Tinca tinca", ...}}
    transformer/            a DiTTransformer2DModel: read without diffusers
                            (:func:`~addnorm.interop.diffusers_folder.from_diffusers_folder`)
    vae/                    an AutoencoderKL: loaded by diffusers (:mod:`.diffusers_vae`)
    scheduler/scheduler_config.json

``id2label`` is the Hub folder's (``save_pretrained`` does not write it; diffusers reads it
back from ``model_index.json`` into ``DiTPipeline(id2label=...)``); without it classes are
named by id. Everything the DiT and the VAE must agree on is checked before either's weights
are read: a folder that is not such a pipeline (another ``_class_name``, a part missing, a
``vae/`` that is no ``AutoencoderKL``, latent channels other than the DiT's input channels,
``id2label`` naming classes the DiT lacks) raises
:class:`~addnorm.interop.diffusers_vae.PipelinePartError` naming the file; a damaged file, a
:class:`~addnorm.utils.files.CheckpointError`. The scheduler config is read here and checked
when sampling (a sampler asked for may replace it).

:func:`save_diffusers_pipeline` writes such a folder: a DiT (trained by addnorm on a VAE's
latents), that VAE, the scheduler config of its diffusion (diffusers'
``DPMSolverMultistepScheduler``, the sampler DiT users reach for, with the diffusion's steps,
schedule and prediction) and its class names as ``id2label``, by diffusers' own
``DiTPipeline.save_pretrained``, so that ``DiTPipeline.from_pretrained`` loads it. diffusers'
pipeline guides with the null class 1000 whatever the model's classes, so a DiT of K < 1000
classes is written as one of 1000 (:func:`~addnorm.interop.pipeline_classes.widen_classes`:
its classes, then copies of its null row up to row 1000): diffusers' images are addnorm's at
every guidance scale. :func:`from_diffusers_pipeline` reads such a folder back as the DiT of K
classes (:func:`~addnorm.interop.pipeline_classes.narrow_classes`: when ``id2label`` names
exactly ids 0 .. K-1 and the rows after them are the null row), so ``addnorm.load`` and
``addnorm sample --checkpoint FOLDER`` see the run's classes, named as in the run.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from addnorm.dit.class_names import ClassNames
from addnorm.dit.model import DiT
from addnorm.interop.diffusers import to_diffusers
from addnorm.interop.diffusers_folder import (
    PIPELINE_INDEX,
    diffusers_class_of,
    from_diffusers_folder,
)
from addnorm.interop.diffusers_vae import (
    LatentVAE,
    PipelinePartError,
    check_vae_config,
    load_vae,
)
from addnorm.interop.dit_pipeline import DiTPipeline
from addnorm.interop.pipeline_classes import narrow_classes, widen_classes
from addnorm.pretrained.files import CONFIG_FILE, read_config_json
from addnorm.pretrained.mixin import check_device, check_dtype, check_path
from addnorm.utils.files import (
    MAX_JSON_BYTES,
    CheckpointError,
    UnsafeFileError,
    parse_json,
    read_text,
)

__all__ = ["PIPELINE_CLASS", "PIPELINE_PARTS", "SCHEDULER_CONFIG", "from_diffusers_pipeline",
           "is_pipeline_folder", "save_diffusers_pipeline"]

PIPELINE_CLASS = "DiTPipeline"
PIPELINE_PARTS = ("transformer", "vae", "scheduler")
SCHEDULER_CONFIG = "scheduler_config.json"


def is_pipeline_folder(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a folder with a ``model_index.json`` (a diffusers pipeline)."""
    return (Path(path) / PIPELINE_INDEX).is_file()


def from_diffusers_pipeline(
    path: str | os.PathLike,
    *,
    dtype: torch.dtype | str | None = None,
    device: torch.device | str | None = None,
) -> DiTPipeline:
    """The DiT pipeline in ``path``, in eval mode; ``dtype`` and ``device`` as in
    :func:`addnorm.load` (default: the DiT's saved dtype, the VAE in float32; the CPU).

    Raises:
        PipelinePartError: the folder is not a DiT pipeline whose parts fit (module
            docstring), naming what is missing or wrong.
        CheckpointError: a file is damaged or unreadable.
        ImportError: diffusers (for the VAE) is not installed.
    """
    directory = check_path(path)
    dtype, device = check_dtype(dtype), check_device(device)
    index = _read_json(directory / PIPELINE_INDEX)
    _check_index(index, directory)
    transformer_config = read_config_json(directory / "transformer")
    diffusers_class_of(transformer_config, directory / "transformer" / CONFIG_FILE)
    vae_config = read_config_json(directory / "vae")
    check_vae_config(vae_config, directory / "vae")
    in_channels = transformer_config.get("in_channels", 4)  # DiTTransformer2DModel's default
    latent_channels = vae_config.get("latent_channels", 4)  # AutoencoderKL's default
    if latent_channels != in_channels:
        raise PipelinePartError(
            f"{directory}: the VAE's latents have {latent_channels!r} channels "
            f"(vae/{CONFIG_FILE} latent_channels) but the DiT takes {in_channels!r} "
            f"(transformer/{CONFIG_FILE} in_channels): the parts do not fit each other"
        )
    scheduler_config = _read_json(directory / "scheduler" / SCHEDULER_CONFIG)
    n_classes = transformer_config.get("num_embeds_ada_norm", 1000)  # its default too
    try:
        class_names = ClassNames.from_id2label(index.get("id2label"), n_classes)
    except (TypeError, ValueError) as err:
        raise PipelinePartError(f"{directory / PIPELINE_INDEX}: {err}") from None
    vae = load_vae(directory / "vae", dtype=dtype, device=device)  # no AutoencoderKL: refused
    transformer = from_diffusers_folder(directory / "transformer", dtype=dtype, device=device)
    transformer = narrow_classes(transformer, class_names.labels)  # K classes written as 1000
    if transformer.cfg.n_classes != class_names.n_classes:
        class_names = ClassNames(transformer.cfg.n_classes, class_names.labels)
    return DiTPipeline(transformer, vae, scheduler_config, class_names).eval()


# addnorm's schedules as diffusers' beta_schedule names (diffusers_scheduler reads them back).
_BETA_SCHEDULES = {"linear": "linear", "cosine": "squaredcos_cap_v2"}
_PREDICTION_TYPES = {"epsilon": "epsilon", "v": "v_prediction"}


def save_diffusers_pipeline(
    folder: str | os.PathLike, transformer: DiT, vae: LatentVAE, *, n_steps: int = 1000,
    schedule: str = "linear", prediction: str = "epsilon",
    class_names: tuple[str, ...] | None = None,
) -> Path:
    """Write ``transformer`` and ``vae`` as a diffusers DiT pipeline folder (module
    docstring) that ``DiTPipeline.from_pretrained`` and :func:`from_diffusers_pipeline` load;
    returns the folder. The diffusion is ``n_steps`` steps of ``schedule`` (``"linear"``:
    betas ``0.1 / n`` to ``20 / n``, DiT's; ``"cosine"``) predicting ``prediction``
    (``"epsilon"`` or ``"v"``).

    A DiT of fewer than 1000 classes is written as one of 1000 whose null row is row 1000,
    where diffusers' ``DiTPipeline.__call__`` looks for it (module docstring), with
    ``id2label`` naming its classes (``class_names``, else their ids): diffusers' pipeline
    then makes addnorm's images at any ``guidance_scale``.

    Raises:
        ValueError: the DiT cannot be a diffusers ``DiTTransformer2DModel`` (diffusers fixes
            the timestep features' shift at 1, DiT's is 0: train with
            ``--timestep-downscale-freq-shift 1``), has no null class or more than 1000
            classes (diffusers' pipeline guides with id 1000), its input channels are not
            the VAE's latent channels, ``class_names`` are not one per class, or the schedule
            or prediction has no diffusers name.
        ImportError: diffusers is not installed.
    """
    import diffusers

    if transformer.cfg.in_channels != vae.latent_channels:
        raise ValueError(f"the DiT takes {transformer.cfg.in_channels} channels but the VAE's "
                         f"latents have {vae.latent_channels}")
    if schedule not in _BETA_SCHEDULES or prediction not in _PREDICTION_TYPES:
        raise ValueError(f"schedule {schedule!r} and prediction {prediction!r} must be one of "
                         f"{list(_BETA_SCHEDULES)} and {list(_PREDICTION_TYPES)}")
    n_classes = transformer.cfg.n_classes
    if class_names is not None and len(class_names) != n_classes:
        raise ValueError(f"class_names must name the DiT's {n_classes} classes, got "
                         f"{len(class_names)}")
    try:
        theirs = to_diffusers(widen_classes(transformer)).eval()
    except ValueError as err:
        raise ValueError(f"{err} (train with --timestep-downscale-freq-shift 1 for a DiT "
                         "that diffusers holds)") from None
    scheduler = diffusers.DPMSolverMultistepScheduler(
        num_train_timesteps=n_steps, beta_start=0.1 / n_steps, beta_end=20 / n_steps,
        beta_schedule=_BETA_SCHEDULES[schedule], prediction_type=_PREDICTION_TYPES[prediction])
    directory = check_path(folder)
    pipeline: Any = diffusers.DiTPipeline(transformer=theirs, vae=vae.autoencoder.eval(),
                                          scheduler=scheduler)
    pipeline.save_pretrained(directory)
    if class_names is None and n_classes != theirs.config.num_embeds_ada_norm:
        class_names = tuple(str(i) for i in range(n_classes))  # the ids narrow_classes reads
    if class_names is not None:  # where the Hub's folder keeps them (module docstring)
        index_file = directory / PIPELINE_INDEX
        index = json.loads(index_file.read_text(encoding="utf-8"))
        index["id2label"] = {str(i): name for i, name in enumerate(class_names)}
        index_file.write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
    return directory


def _check_index(index: dict[str, Any], directory: Path) -> None:
    """PipelinePartError unless ``model_index.json`` is a DiTPipeline's with every part."""
    where = directory / PIPELINE_INDEX
    name = index.get("_class_name")
    if name != PIPELINE_CLASS:
        shown = repr(name) if len(repr(name)) <= 60 else repr(name)[:57] + "..."
        raise PipelinePartError(f"{where} names the pipeline {shown}; addnorm opens a "
                                f"{PIPELINE_CLASS} (a DiT, a VAE, a scheduler)")
    missing = [part for part in PIPELINE_PARTS if part not in index]
    if missing:
        raise PipelinePartError(f"{where} lists no {' and no '.join(missing)}: a "
                                f"{PIPELINE_CLASS} has {', '.join(PIPELINE_PARTS)}")
    needed = {"transformer": CONFIG_FILE, "vae": CONFIG_FILE, "scheduler": SCHEDULER_CONFIG}
    for part, file in needed.items():
        if not (directory / part / file).is_file():
            raise PipelinePartError(f"{directory} misses its {part} ({part}/{file}): a "
                                    f"{PIPELINE_CLASS} folder has {', '.join(PIPELINE_PARTS)}")


def _read_json(path: Path) -> dict[str, Any]:
    """A JSON object file of the pipeline, read without trusting it (as ``config.json``)."""
    try:
        data = parse_json(read_text(path, max_bytes=MAX_JSON_BYTES, what="pipeline config"))
    except FileNotFoundError:
        raise CheckpointError(f"pipeline file missing: {path}") from None
    except UnsafeFileError as err:
        raise CheckpointError(f"cannot read {err}") from None
    except (json.JSONDecodeError, ValueError) as err:
        raise CheckpointError(f"{path} is not valid JSON: {err}") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path} must hold a JSON object, got {type(data).__name__}")
    return data
