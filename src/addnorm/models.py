"""The two whole models, configured by one frozen config each.

- :class:`~addnorm.transformer.Transformer` (:class:`~addnorm.config.TransformerConfig`):
  the encoder-decoder of Vaswani et al. (2017).
- :class:`~addnorm.lm.TransformerLM` (:class:`~addnorm.config.LMConfig`): decoder-only.

Both expose ``start``/``step`` for :mod:`addnorm.generation` and ``generate``.
"""

from addnorm.embedding import Embedder, positions_from_padding
from addnorm.lm import TransformerLM
from addnorm.transformer import Transformer

__all__ = ["Embedder", "Transformer", "TransformerLM", "positions_from_padding"]
