"""Conversion to and from other libraries' modules and checkpoints, one file per counterpart.

- torch.nn's Transformer modules: :func:`from_torch` / :func:`to_torch` (:mod:`.torch_nn`).
- facebookresearch/DiT's checkpoints: :func:`from_dit_state_dict` / :func:`to_dit_state_dict`
  (:mod:`.dit_checkpoint`).
- diffusers' ``DiTTransformer2DModel``: :func:`from_diffusers` / :func:`to_diffusers`
  (:mod:`.diffusers`; diffusers is needed only for these two, see the ``interop`` extra);
  :func:`from_diffusers_folder` reads a folder that its ``save_pretrained`` wrote, without
  diffusers (:mod:`.diffusers_folder`; ``addnorm.load`` calls it for such a folder).
- diffusers' ``DiTPipeline`` folders: :func:`from_diffusers_pipeline` opens one whole as a
  :class:`DiTPipeline` (:mod:`.diffusers_pipeline`, :mod:`.dit_pipeline`: the DiT, the VAE
  through diffusers' ``AutoencoderKL`` (:mod:`.diffusers_vae`), the scheduler config as
  addnorm's sampler (:mod:`.diffusers_scheduler`), the class names; ``addnorm.load`` calls it
  for such a folder).
- Hugging Face ``transformers`` models: :func:`from_transformers` / :func:`to_transformers`
  for ``BertModel`` <-> :class:`~addnorm.transformer.encoder_model.EncoderModel` and GPT-2
  <-> :class:`~addnorm.transformer.lm.TransformerLM` (:mod:`.hf_models`; transformers is
  imported only inside them, see the ``transformers`` extra).
- Hugging Face folders: :func:`from_transformers_folder` reads a folder that transformers'
  ``save_pretrained`` wrote, without transformers (:mod:`.hf_folder`; ``addnorm.load`` calls
  it for such a folder), through the key and config layout of :mod:`.hf_layout`.
"""

from addnorm.interop.diffusers import from_diffusers, to_diffusers
from addnorm.interop.diffusers_folder import from_diffusers_folder
from addnorm.interop.diffusers_pipeline import from_diffusers_pipeline
from addnorm.interop.dit_checkpoint import from_dit_state_dict, to_dit_state_dict
from addnorm.interop.dit_pipeline import DiTPipeline
from addnorm.interop.hf_folder import from_transformers_folder
from addnorm.interop.hf_models import from_transformers, to_transformers
from addnorm.interop.torch_nn import from_torch, to_torch

__all__ = [
    "DiTPipeline",
    "from_diffusers",
    "from_diffusers_folder",
    "from_diffusers_pipeline",
    "from_dit_state_dict",
    "from_torch",
    "from_transformers",
    "from_transformers_folder",
    "to_diffusers",
    "to_dit_state_dict",
    "to_torch",
    "to_transformers",
]
