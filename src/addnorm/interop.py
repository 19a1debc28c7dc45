"""Conversion to and from other libraries' modules and checkpoints, in one place.

- torch.nn's Transformer modules: :func:`from_torch` / :func:`to_torch`
  (:mod:`addnorm.transformer.interop`).
- facebookresearch/DiT's checkpoints: :func:`from_dit_state_dict` / :func:`to_dit_state_dict`;
  diffusers' ``DiTTransformer2DModel``: :func:`from_diffusers` / :func:`to_diffusers`
  (:mod:`addnorm.dit.interop`; diffusers is needed only for the last two, see the
  ``interop`` extra).
"""

from addnorm.dit.interop import from_diffusers, from_dit_state_dict, to_diffusers, to_dit_state_dict
from addnorm.transformer.interop import from_torch, to_torch

__all__ = [
    "from_diffusers",
    "from_dit_state_dict",
    "from_torch",
    "to_diffusers",
    "to_dit_state_dict",
    "to_torch",
]
