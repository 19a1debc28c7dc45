"""The encoder-only model, the BERT family: token ids in, one hidden state per token out.

Shapes legend: B batch, L sequence length, D d_model, V vocab, G token types.

    x = dropout(norm(E[ids] * scale + P[positions] + T[token_type_ids]))    the input layer
    h = Encoder(x, padding_mask)                                            (B, L, D)

This is the third family beside the encoder-decoder ``Transformer`` and the decoder-only
``TransformerLM``; the stack is the same :class:`~addnorm.transformer.stacks.Encoder`, run
without a causal mask. BERT (Devlin et al., 2019) is ``position_encoding="learned"``,
``embed_scale="none"``, ``n_token_types=2``, ``embed_norm=True``, ``norm_position="post"``,
``activation="gelu"``; :func:`addnorm.interop.from_transformers` builds one from a Hugging
Face ``BertModel``, weights included. Its pooler (``tanh(W h[CLS] + b)``) is the optional
``pooler`` submodule, called on the hidden states.

Sentence embeddings (sentence-transformers' recipe): ``mean_pool(h, padding_mask)``, the mean
of each row's real tokens, then ``F.normalize`` for cosine similarities.

Positions count each row's real tokens (as in the other models); on unpadded or right-padded
rows, BERT's usual input, that is ``arange(L)``, BERT's own positions.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from addnorm.family import ActivationShape, DynamicShapes, ExportPart
from addnorm.norms import NoNorm
from addnorm.packing import check_unpad
from addnorm.pretrained.mixin import PretrainedMixin
from addnorm.transformer.config import (
    EmbedScale,
    _check_layer,
    _check_model_edges,
    _check_token_id,
    _ModelConfig,
)
from addnorm.transformer.embedding import (
    check_ids,
    ids_dynamic_shapes,
    ids_example_inputs,
    init_token_table_,
    learned_max_len,
    model_inputs,
    position_module,
    rotary_for,
)
from addnorm.transformer.layers import EncoderLayer, norm_module
from addnorm.transformer.stacks import Encoder
from addnorm.utils.checks import (
    check_bool,
    check_bool_mask,
    check_int,
    check_tensor,
)

__all__ = ["ClsPooler", "EncoderConfig", "EncoderEmbedder", "EncoderModel", "mean_pool"]


@dataclass(frozen=True)
class EncoderConfig(_ModelConfig):
    """An encoder-only model; the defaults are a small BERT-style encoder.

    Attributes:
        vocab_size: V.
        d_model, n_heads, n_layers, d_ff: widths D, H, the number of layers N, and F.
        dropout: P_drop (input layer, attention weights, sublayers, FFN).
        activation: FFN activation (``"relu"``, ``"gelu"``, ``"gelu_tanh"``, ``"swiglu"``).
        norm, norm_position, norm_eps, bias: as in
            :class:`~addnorm.transformer.config.TransformerConfig` (post-LN by default, as
            BERT). The stack is not causal, so ``"group"`` is allowed here.
        final_norm: a norm after the stack; None = only for pre-LN.
        position_encoding: ``"learned"`` (BERT), ``"sinusoidal"``, ``"rotary"`` or ``"none"``.
        position_base: base of the sinusoids / rotary frequencies.
        max_len: rows of a learned position table (longer inputs are refused).
        embed_scale: ``"none"`` (BERT) or ``"sqrt_d_model"`` (the Transformer paper).
        n_token_types: G, rows of the token-type (segment) table; 0 = no table.
        embed_norm: a norm (the config's kind and eps) on the summed embeddings (BERT).
        pooler: BERT's pooler, ``tanh(W h[:, 0] + b)``, as the ``pooler`` submodule.
        pad_id: the padding token (default padding mask ``ids == pad_id``), or None.
        unpad: the layers run on the real tokens only (see
            :class:`~addnorm.transformer.stacks.Encoder`); the hidden states are then zero at
            padding. Not with ``norm="group"``.
    """

    vocab_size: int = 256
    d_model: int = 128
    n_heads: int = 4
    n_layers: int = 4
    d_ff: int = 512
    dropout: float = 0.1
    activation: str = "gelu"
    norm: str = "layer"
    norm_position: str = "post"
    norm_eps: float = 1e-12
    bias: bool = True
    final_norm: bool | None = None
    position_encoding: str = "learned"
    position_base: float = 10000.0
    max_len: int = 512
    embed_scale: EmbedScale = "none"
    n_token_types: int = 2
    embed_norm: bool = True
    pooler: bool = False
    pad_id: int | None = 0
    unpad: bool = False

    def __post_init__(self) -> None:
        _check_layer(self)
        check_unpad(self.unpad, self.norm)
        check_int("vocab_size", self.vocab_size, min_value=1)
        check_int("n_layers", self.n_layers, min_value=1)
        _check_model_edges(self)
        check_int("n_token_types", self.n_token_types, min_value=0)
        check_bool("embed_norm", self.embed_norm)
        check_bool("pooler", self.pooler)
        if self.pad_id is not None:
            _check_token_id("pad_id", self.pad_id, "vocab_size", self.vocab_size)

    @property
    def d_head(self) -> int:
        """Dh = D / H."""
        return self.d_model // self.n_heads

    def count_parameters(self) -> int:
        """The parameters of ``EncoderModel(self)``, without building it: within 2% of the
        built model's, as the other configs' (every bias and norm vector of the layers
        counted; see :mod:`addnorm.transformer.config`)."""
        attention, feedforward, norm = self._sublayer_parameters()
        d = self.d_model
        tables = (self.vocab_size + self.n_token_types) * d + self._learned_positions()
        embed_norm = norm if self.embed_norm else 0
        body = self.n_layers * (attention + feedforward + 2 * norm) + norm
        pooler = d * d + d if self.pooler else 0
        return tables + embed_norm + body + pooler

    def count_buffers(self) -> int:
        """The numbers of ``EncoderModel(self)``'s computed position table."""
        return self._position_buffers(n_embedders=1)

    def activation_shape(self) -> ActivationShape:
        """The layers and their widths (the output is the last layer's hidden states)."""
        return ActivationShape(
            n_layers=self.n_layers, d_model=self.d_model, d_ff=self.d_ff,
            n_heads=self.n_heads, d_output=0,
        )


class EncoderEmbedder(nn.Module):
    """The input layer: ``dropout(norm(E[ids] * scale + P[positions] + T[token_type_ids]))``.

    Submodules: ``tokens`` (``nn.Embedding`` V x D), ``pos_enc`` (or None), ``token_types``
    (``nn.Embedding`` G x D, or None), ``norm`` (the config's norm, or ``NoNorm``),
    ``dropout``. Without token-type ids every token has type 0 (BERT's default).
    """

    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        self.embed_scale = cfg.embed_scale
        self.scale = cfg.d_model**0.5 if cfg.embed_scale == "sqrt_d_model" else 1.0
        self.tokens = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_enc = position_module(cfg)
        self.token_types = (
            nn.Embedding(cfg.n_token_types, cfg.d_model) if cfg.n_token_types else None
        )
        self.norm = norm_module(cfg.layer_config()) if cfg.embed_norm else NoNorm()
        self.dropout = nn.Dropout(cfg.dropout)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Token table as in :func:`~addnorm.transformer.embedding.init_token_table_`; the
        token-type table N(0, 0.02^2) (BERT's rule)."""
        init_token_table_(self.tokens, self.embed_scale)
        if self.token_types is not None:
            nn.init.normal_(self.token_types.weight, mean=0.0, std=0.02)

    def forward(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor | None,
        *,
        token_type_ids: torch.Tensor | None = None,
        padding_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Embed ids (checked by the model) at ``positions`` (None: ``arange(L)``).

        Shapes:
            ids, positions, token_type_ids, padding_mask: (B, L)
            returns: (B, L, D)
        """
        x = self.tokens(ids) * self.scale  # (B, L, D)
        if self.pos_enc is not None:
            x = self.pos_enc(x, positions=positions)
        if self.token_types is not None:
            if token_type_ids is None:
                x = x + self.token_types.weight[0]  # every token of type 0
            else:
                x = x + self.token_types(token_type_ids)  # (B, L, D)
        return self.dropout(self.norm(x, padding_mask=padding_mask))


class ClsPooler(nn.Module):
    """BERT's pooler: ``tanh(dense(h[:, 0]))``, the first ([CLS]) token's state.

    Submodules: ``dense`` (Linear D -> D).
    """

    def __init__(self, d_model: int) -> None:
        super().__init__()
        self.dense = nn.Linear(d_model, d_model)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """Shapes: hidden (B, L, D) -> (B, D)."""
        return torch.tanh(self.dense(hidden[:, 0]))  # (B, D)


class EncoderModel(PretrainedMixin, nn.Module):
    """An encoder-only Transformer (the BERT family): hidden states for every token.

    Submodules: ``embed`` (:class:`EncoderEmbedder`), ``encoder`` (:class:`Encoder`, not
    causal), ``pooler`` (:class:`ClsPooler`, or None); ``rotary`` or None. Nothing is tied.
    ``save_pretrained`` / ``from_pretrained`` come from :class:`PretrainedMixin`.
    """

    config_class = EncoderConfig  # save_pretrained / from_pretrained (addnorm.pretrained.mixin)

    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        if not isinstance(cfg, EncoderConfig):
            raise TypeError(f"cfg must be an EncoderConfig, got {type(cfg).__name__}")
        self.cfg = cfg
        self.rotary = rotary_for(cfg)
        self.embed = EncoderEmbedder(cfg)
        self.encoder = Encoder(
            cfg.layer_config(), cfg.n_layers, rotary=self.rotary, final_norm=cfg.final_norm,
            unpad=cfg.unpad,
        )
        self.pooler = ClsPooler(cfg.d_model) if cfg.pooler else None

    def forward(
        self,
        ids: torch.Tensor,
        *,
        padding_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The last layer's hidden state of every token.

        Args:
            ids: token ids.
            padding_mask: True = padding (default ``ids == cfg.pad_id``; none when pad_id is
                None). Hugging Face's ``attention_mask`` is its negation.
            token_type_ids: segment ids in ``[0, n_token_types)`` (default all 0).

        Shapes:
            ids: (B, L); padding_mask: (B, L) bool; token_type_ids: (B, L)
            returns: (B, L, D)
        """
        cfg = self.cfg
        tokens = model_inputs(
            "ids", ids, "padding_mask", padding_mask, vocab_size=cfg.vocab_size,
            max_len=learned_max_len(cfg), pad_id=cfg.pad_id,
        )
        types = self._token_types(token_type_ids, tokens.ids)
        x = self.embed(
            tokens.ids, tokens.positions, token_type_ids=types,
            padding_mask=tokens.padding_mask,
        )  # (B, L, D)
        return self.encoder(x, padding_mask=tokens.padding_mask, positions=tokens.positions)

    def _token_types(self, token_type_ids: object, ids: torch.Tensor) -> torch.Tensor | None:
        if token_type_ids is None:
            return None
        if self.cfg.n_token_types == 0:
            raise ValueError("token_type_ids given, but the model has no token-type table "
                             "(n_token_types=0)")
        types = check_ids("token_type_ids", token_type_ids, self.cfg.n_token_types, None)
        if types.shape != ids.shape:
            raise ValueError(f"token_type_ids must have the shape of ids {tuple(ids.shape)}, "
                             f"got {tuple(types.shape)}")
        return types

    # What export, size estimates and distributed wrapping read (addnorm.family.ModelFamily).
    layer_classes = (EncoderLayer,)
    export_parts = {"forward": ExportPart("forward", "hidden")}

    def example_inputs(
        self, part: str, *, batch: int, length: int, generator: torch.Generator
    ) -> dict[str, torch.Tensor]:
        """ids and padding_mask (B, L): an unpadded, a right- and a left-padded row; with a
        token-type table, token_type_ids (B, L) too (random types, 0 at padding, as BERT's
        tokenizers write them), so an exported model takes the segments BERT users pass."""
        inputs = ids_example_inputs(self.cfg.vocab_size, self.cfg.pad_id, batch=batch,
                                    length=length, generator=generator)
        if self.cfg.n_token_types:
            padding = inputs["padding_mask"]
            types = torch.randint(0, self.cfg.n_token_types, padding.shape, generator=generator)
            inputs["token_type_ids"] = types.masked_fill(padding, 0)  # (B, L)
        return inputs

    def dynamic_shapes(self) -> DynamicShapes:
        """The batch and the length (at most ``max_len`` with learned positions), shared by
        ids, padding_mask and token_type_ids."""
        shapes = ids_dynamic_shapes(self.cfg)
        return {**shapes, "token_type_ids": shapes["ids"]}


def mean_pool(hidden: torch.Tensor, padding_mask: torch.Tensor | None = None) -> torch.Tensor:
    """The mean of each row's real (not padding) token states: a sentence embedding.

    sentence-transformers' mean pooling: ``sum(h * real) / max(count(real), 1e-9)``, so a row
    that is all padding gives zeros. Follow with ``F.normalize(..., dim=-1)`` for cosine
    similarities as dot products.

    Shapes:
        hidden: (B, L, D); padding_mask: (B, L) bool, True = padding
        returns: (B, D)
    """
    hidden = check_tensor("hidden", hidden, ndim=3, floating=True)
    if padding_mask is None:
        return hidden.mean(dim=1)  # (B, D)
    padding_mask = check_bool_mask(
        "padding_mask (True = padding)", padding_mask, tuple(hidden.shape[:2])
    )
    real = (~padding_mask).unsqueeze(-1).to(hidden.dtype)  # (B, L, 1)
    return (hidden * real).sum(dim=1) / real.sum(dim=1).clamp(min=1e-9)  # (B, D)
