"""One DiT block's own conditioning, for the per-block layout (``conditioning="per_block"``).

    c_i = timestep_embed_i(t) + class_embed_i(y)         # block i's conditioning vector

The paper's DiT computes one ``c`` for all blocks and the final layer (the shared layout,
``DiTConfig``'s default). diffusers' ``DiTTransformer2DModel`` gives every block its own
timestep MLP and label table (``transformer_blocks[i].norm1.emb``), and its final layer reads
block 0's; a model built or fine-tuned there has a different pair per block, so addnorm's
per-block layout holds one :class:`ConditionEmbedder` per block (``DiT.block_embeds``).

Label dropout: the DiT draws one mask per forward (:func:`addnorm.dit.labels.label_drops`)
and hands it to every block's embedder as ``force_drop_ids``, so every block and the final
layer drop the same labels (diffusers draws again in every block and for its final layer).

Shapes legend: B batch, D d_model.
"""

from __future__ import annotations

import torch
from torch import nn

from addnorm.dit.labels import ClassEmbedder
from addnorm.timestep import TimestepEmbedder

__all__ = ["ConditionEmbedder"]


class ConditionEmbedder(nn.Module):
    """``timestep_embed(t) + class_embed(y)``: one block's conditioning vector.

    Args:
        d_model: D.
        n_classes: class labels; id ``n_classes`` is the null class (with ``class_dropout``).
        class_dropout: the label table has the null row when > 0 (:class:`ClassEmbedder`).
        d_freq, flip_sin_to_cos, downscale_freq_shift: the timestep sinusoids
            (:class:`~addnorm.timestep.TimestepEmbedder`).

    Submodules: ``timestep_embed`` (:class:`~addnorm.timestep.TimestepEmbedder`),
    ``class_embed`` (:class:`ClassEmbedder`), the shared layout's pair under the same names.
    """

    def __init__(
        self,
        d_model: int,
        *,
        n_classes: int,
        class_dropout: float,
        d_freq: int = 256,
        flip_sin_to_cos: bool = True,
        downscale_freq_shift: float = 0.0,
    ) -> None:
        super().__init__()
        self.timestep_embed = TimestepEmbedder(
            d_model, d_freq=d_freq, flip_sin_to_cos=flip_sin_to_cos,
            downscale_freq_shift=downscale_freq_shift,
        )
        self.class_embed = ClassEmbedder(n_classes, d_model, class_dropout=class_dropout)

    def forward(
        self, t: torch.Tensor, y: torch.Tensor, *, force_drop_ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The conditioning vector of each sample.

        ``force_drop_ids`` (True = the null class) is the DiT's one draw for all blocks; called
        alone in training without it, the label table draws its own, as a ClassEmbedder does.

        Shapes:
            t: (B,); y: (B,); force_drop_ids: (B,) bool
            returns: (B, D)
        """
        y_emb = self.class_embed(y, force_drop_ids=force_drop_ids)  # (B, D)
        return self.timestep_embed(t) + y_emb
