"""The Diffusion Transformer (Peebles & Xie, 2023) built from addnorm's parts: its config and
presets, patches and 2-D positions, label embedding, adaLN-Zero blocks, the model with
classifier-free guidance in DiT's calling convention (``classifier_free_guidance`` is the one
in :mod:`addnorm.diffusion.guidance`, re-exported). Conversion to and from DiT's and diffusers'
checkpoints is in :mod:`addnorm.interop`."""

from addnorm.diffusion.guidance import classifier_free_guidance
from addnorm.dit.block import DiTBlock
from addnorm.dit.conditioning import ConditionEmbedder
from addnorm.dit.config import DIT_PRESETS, DiTConfig
from addnorm.dit.final_layer import FinalLayer
from addnorm.dit.labels import CheckedLabels, ClassEmbedder
from addnorm.dit.model import DiT
from addnorm.dit.modulation import modulate
from addnorm.dit.patches import PatchEmbed, patchify, unpatchify
from addnorm.dit.positions import sincos_2d_positions

__all__ = [
    "DIT_PRESETS",
    "CheckedLabels",
    "ClassEmbedder",
    "ConditionEmbedder",
    "DiT",
    "DiTBlock",
    "DiTConfig",
    "FinalLayer",
    "PatchEmbed",
    "classifier_free_guidance",
    "modulate",
    "patchify",
    "sincos_2d_positions",
    "unpatchify",
]
