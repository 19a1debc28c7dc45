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
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from addnorm.dit.class_names import ClassNames
from addnorm.interop.diffusers_folder import (
    PIPELINE_INDEX,
    diffusers_class_of,
    from_diffusers_folder,
)
from addnorm.interop.diffusers_vae import PipelinePartError, check_vae_config, load_vae
from addnorm.interop.dit_pipeline import DiTPipeline
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
           "is_pipeline_folder"]

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
    return DiTPipeline(transformer, vae, scheduler_config, class_names).eval()


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
