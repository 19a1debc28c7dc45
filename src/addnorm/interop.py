"""Conversion to and from other libraries' modules and checkpoints, in one place.

- torch.nn's Transformer modules: :func:`from_torch` / :func:`to_torch`
  (:mod:`addnorm.transformer.interop`).
- facebookresearch/DiT's checkpoints: :func:`from_dit_state_dict` / :func:`to_dit_state_dict`;
  diffusers' ``DiTTransformer2DModel``: :func:`from_diffusers` / :func:`to_diffusers`
  (:mod:`addnorm.dit.interop`; diffusers is needed only for the last two, see the
  ``interop`` extra).
- Hugging Face ``transformers``: :func:`from_transformers` / :func:`to_transformers` for
  ``BertModel`` <-> :class:`~addnorm.transformer.encoder_model.EncoderModel` and GPT-2 <->
  :class:`~addnorm.transformer.lm.TransformerLM`
  (:mod:`addnorm.transformer.transformers_interop`; transformers is imported only inside
  them, see the ``transformers`` extra); :func:`from_transformers_folder` for a folder that
  transformers' ``save_pretrained`` wrote, read without transformers (``addnorm.load`` calls
  it for such a folder).
"""

from addnorm.dit.interop import from_diffusers, from_dit_state_dict, to_diffusers, to_dit_state_dict
from addnorm.transformer.interop import from_torch, to_torch
from addnorm.transformer.transformers_interop import (
    from_transformers,
    from_transformers_folder,
    to_transformers,
)

__all__ = [
    "from_diffusers",
    "from_dit_state_dict",
    "from_torch",
    "from_transformers",
    "from_transformers_folder",
    "to_diffusers",
    "to_dit_state_dict",
    "to_torch",
    "to_transformers",
]
