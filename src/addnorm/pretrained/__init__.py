"""Saving and loading whole models as a folder: ``config.json`` + ``model.safetensors``.

:class:`PretrainedMixin` (:mod:`.mixin`) gives a model ``save_pretrained`` and
``from_pretrained``; :mod:`.files` reads such a folder's files (and transformers') without
trusting them.
"""

from addnorm.pretrained.files import (
    CONFIG_FILE,
    MAX_COMPUTED_NUMBERS,
    WEIGHTS_FILE,
    state_dict_without_aliases,
)
from addnorm.pretrained.mixin import (
    PretrainedMixin,
    check_device,
    check_dtype,
    check_path,
    for_inference,
    model_type_of,
)

__all__ = [
    "CONFIG_FILE",
    "MAX_COMPUTED_NUMBERS",
    "WEIGHTS_FILE",
    "PretrainedMixin",
    "check_device",
    "check_dtype",
    "check_path",
    "for_inference",
    "model_type_of",
    "state_dict_without_aliases",
]
