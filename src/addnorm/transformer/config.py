"""Frozen, validated configurations of the two models, and the named presets.

Variants come from ``dataclasses.replace(cfg, ...)`` (validated again); checkpoints store a
config as JSON through ``to_dict()`` / ``from_dict()``. The presets, one typed dict per model:
``TRANSFORMER_PRESETS`` (the paper's base model and small CPU-sized ones) and ``LM_PRESETS``;
``PRESETS`` holds both by name, each entry typed as its own config (a ``TypedDict``).

Each model config tells its model's size without building it (:class:`addnorm.family.FamilyConfig`,
for loading and the estimates before training): ``count_parameters()`` (within 2%: every bias
and norm vector is counted whether the config has it or not, a gated feed-forward's second
bias is not), ``count_buffers()`` (the position tables, exactly) and ``activation_shape()``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, TypedDict

from addnorm.config_base import ConfigBase
from addnorm.family import ActivationShape
from addnorm.feedforward import ACTIVATIONS, GATED_ACTIVATIONS
from addnorm.norms import NORM_KINDS
from addnorm.packing import check_unpad
from addnorm.residual import NORM_POSITIONS
from addnorm.utils.checks import check_bool, check_choice, check_float, check_int, check_probability

__all__ = [
    "EMBED_SCALES",
    "LM_PRESETS",
    "POSITION_ENCODINGS",
    "PRESETS",
    "TRANSFORMER_PRESETS",
    "LMConfig",
    "LayerConfig",
    "Presets",
    "TransformerConfig",
]

POSITION_ENCODINGS = ("sinusoidal", "learned", "rotary", "none")
# The factor on the token embeddings: the paper's sqrt(d_model) (section 3.4), or none (GPT-2,
# BERT: their tables are trained at the scale of the position table).
EMBED_SCALES = ("sqrt_d_model", "none")
EmbedScale = Literal["sqrt_d_model", "none"]


@dataclass(frozen=True)
class LayerConfig(ConfigBase):
    """The settings of one encoder or decoder layer, handed to the stacks and layers.

    The models build it from their own config (:meth:`TransformerConfig.layer_config`,
    :meth:`LMConfig.layer_config`); build one directly to use the stacks or layers alone.

    Attributes:
        d_model, n_heads, d_ff: widths D, H and F (D divisible by H).
        dropout: the paper's P_drop, applied where torch.nn applies it: on the attention
            weights, on each sublayer's output (inside Add & Norm) and inside the FFN.
        activation: the FFN's (``"relu"``, ``"gelu"``, ``"gelu_tanh"``, ``"swiglu"``).
        norm: norm kind (``"layer"``, ``"batch"``, ``"rms"``, ``"group"``).
        norm_position: ``"post"`` (the paper) or ``"pre"``.
        norm_eps: the norms' epsilon.
        bias: biases of the linear layers and of LayerNorm (as in torch.nn).
    """

    d_model: int
    n_heads: int
    d_ff: int
    dropout: float = 0.0
    activation: str = "relu"
    norm: str = "layer"
    norm_position: str = "post"
    norm_eps: float = 1e-5
    bias: bool = True

    def __post_init__(self) -> None:
        _check_layer(self)

    @property
    def d_head(self) -> int:
        """Dh = D / H, the width of one attention head."""
        return self.d_model // self.n_heads


def _check_layer(cfg: LayerConfig | _ModelConfig) -> None:
    """The per-layer settings every config shares: widths, heads, dropout, choices."""
    check_int("d_model", cfg.d_model, min_value=1)
    check_int("n_heads", cfg.n_heads, min_value=1)
    if cfg.d_model % cfg.n_heads:
        raise ValueError(f"d_model ({cfg.d_model}) must be divisible by n_heads ({cfg.n_heads})")
    check_int("d_ff", cfg.d_ff, min_value=1)
    check_probability("dropout", cfg.dropout)
    check_choice("activation", cfg.activation, tuple(ACTIVATIONS))
    check_choice("norm", cfg.norm, NORM_KINDS)
    check_choice("norm_position", cfg.norm_position, NORM_POSITIONS)
    check_float("norm_eps", cfg.norm_eps, min_value=0.0)
    check_bool("bias", cfg.bias)


class _ModelConfig(ConfigBase):
    """What the whole-model configs share: the per-layer record they hand to the stacks, and
    the sizes of the parts every one of them has."""

    d_model: int
    n_heads: int
    d_ff: int
    dropout: float
    activation: str
    norm: str
    norm_position: str
    norm_eps: float
    bias: bool
    position_encoding: str
    max_len: int

    def _sublayer_parameters(self) -> tuple[int, int, int]:
        """Parameters of one attention, one feed-forward and one norm, every bias and norm
        vector counted (a gated feed-forward's ``w3`` bias left out)."""
        d = self.d_model
        attention = 4 * d * d + 4 * d  # in_proj (D -> 3D) and out_proj, with their biases
        width = 3 if self.activation in GATED_ACTIVATIONS else 2
        feedforward = width * d * self.d_ff + self.d_ff + d
        return attention, feedforward, 2 * d

    def _learned_positions(self) -> int:
        """Parameters of one learned position table (0 for the other codes)."""
        return self.max_len * self.d_model if self.position_encoding == "learned" else 0

    def _position_buffers(self, n_embedders: int) -> int:
        """Numbers of the computed position tables: a sinusoid of ``max_len`` rows per
        embedder, or the one rotary cos/sin table of the model."""
        if self.position_encoding == "sinusoidal":
            return n_embedders * self.max_len * self.d_model
        if self.position_encoding == "rotary":
            return 2 * self.max_len * (self.d_model // self.n_heads)
        return 0

    def layer_config(self) -> LayerConfig:
        """The settings every layer of the model's stacks is built with."""
        return LayerConfig(
            d_model=self.d_model, n_heads=self.n_heads, d_ff=self.d_ff, dropout=self.dropout,
            activation=self.activation, norm=self.norm, norm_position=self.norm_position,
            norm_eps=self.norm_eps, bias=self.bias,
        )


def _check_generating_config(cfg: TransformerConfig | LMConfig) -> None:
    """Checks shared by both generating configs: the layer settings, causality (no GroupNorm),
    the model's edges and the tied output."""
    _check_layer(cfg)
    if cfg.norm == "group":
        raise ValueError(
            f"norm='group' is refused by {type(cfg).__name__}: GroupNorm's statistics span "
            "positions, so a causal decoder would see the future (use 'layer' or 'rms'; "
            "addnorm.norms.GroupNorm stays available for non-causal stacks)"
        )
    _check_model_edges(cfg)
    check_bool("tie_output", cfg.tie_output)


def _check_model_edges(cfg: Any) -> None:
    """Checks every whole-model config shares (``EncoderConfig`` too), of the parts around its
    layers: the position code and its table, the embedding scale, the final norm."""
    check_choice("position_encoding", cfg.position_encoding, POSITION_ENCODINGS)
    check_choice("embed_scale", cfg.embed_scale, EMBED_SCALES)
    check_float("position_base", cfg.position_base, min_value=1.0, min_inclusive=False)
    check_int("max_len", cfg.max_len, min_value=1)
    d_head = cfg.d_model // cfg.n_heads
    if cfg.position_encoding == "rotary" and d_head % 2:
        raise ValueError(
            f"position_encoding='rotary' needs an even d_head; d_model ({cfg.d_model}) / n_heads "
            f"({cfg.n_heads}) = {d_head}"
        )
    if cfg.final_norm is not None and not isinstance(cfg.final_norm, bool):
        raise TypeError(f"final_norm must be a bool or None, got {cfg.final_norm!r}")


def _check_token_id(name: str, value: object, vocab_name: str, vocab_size: int) -> None:
    check_int(name, value, min_value=0)
    if value >= vocab_size:  # type: ignore[operator]
        raise ValueError(f"{name} ({value}) must be < {vocab_name} ({vocab_size})")


_WHY_DISTINCT = {
    ("pad_id", "bos_id"): "padding is masked out, so a start token equal to it would be ignored",
    ("pad_id", "eos_id"): "padding is masked out, so a stop token equal to it would be ignored",
    ("bos_id", "eos_id"): "generation never emits bos_id, so an equal eos_id could never stop it",
}


def _check_distinct_ids(cfg: TransformerConfig | LMConfig, pairs: list[tuple[str, str]]) -> None:
    """Each pair of special token ids must hold two different ids (reasons above); None (no
    such token, in an LMConfig) is no id."""
    for first, second in pairs:
        a, b = getattr(cfg, first), getattr(cfg, second)
        if a is not None and a == b:
            why = _WHY_DISTINCT[first, second]
            raise ValueError(f"{first} ({a}) must differ from {second} ({b}): {why}")


@dataclass(frozen=True)
class TransformerConfig(_ModelConfig):
    """The encoder-decoder Transformer; the defaults are the paper's base model.

    Attributes:
        src_vocab_size, tgt_vocab_size: V of the source and target vocabularies.
        n_encoder_layers, n_decoder_layers: N of each stack.
        d_model, n_heads, d_ff, dropout, activation, norm_position, norm_eps, bias: as in
            :class:`LayerConfig` (dropout also on the embeddings + positions).
        norm: as in :class:`LayerConfig`, but ``"group"`` is refused: GroupNorm's statistics
            span positions, so the causal decoder would see the future (one field serves both
            stacks). ``"batch"`` in train mode mixes positions too (its batch statistics cover
            later tokens; eval mode is causal): allowed for the seed's BatchNorm experiments.
        final_norm: norm after each stack; None = only for pre-LN.
        position_encoding: ``"sinusoidal"`` (the paper), ``"learned"``, ``"rotary"`` or
            ``"none"``. (Not to be confused with ``norm_position``, post or pre.)
        position_base: base of the sinusoids / rotary frequencies.
        max_len: rows of a learned position table (longer sequences are refused).
        embed_scale: factor on the token embeddings: ``"sqrt_d_model"`` (the paper's
            ``E[ids] * sqrt(D)``) or ``"none"``.
        share_embeddings: one embedding table for source and target (equal vocab sizes).
        tie_output: the output projection reuses the target embedding (the paper).
        pad_id, bos_id, eos_id: special token ids; ``pad_id`` in both vocabularies,
            ``bos_id``/``eos_id`` in the target one. All three must differ: padding is
            masked out, and generation never emits ``pad_id`` or ``bos_id``.
        unpad: the encoder runs on the real source tokens only
            (:class:`~addnorm.transformer.stacks.Encoder`); its output is zero at padding,
            which the decoder never reads.
    """

    src_vocab_size: int = 37000
    tgt_vocab_size: int = 37000
    d_model: int = 512
    n_heads: int = 8
    n_encoder_layers: int = 6
    n_decoder_layers: int = 6
    d_ff: int = 2048
    dropout: float = 0.1
    activation: str = "relu"
    norm: str = "layer"
    norm_position: str = "post"
    norm_eps: float = 1e-5
    bias: bool = True
    final_norm: bool | None = None
    position_encoding: str = "sinusoidal"
    position_base: float = 10000.0
    max_len: int = 512
    embed_scale: EmbedScale = "sqrt_d_model"
    share_embeddings: bool = True
    tie_output: bool = True
    pad_id: int = 0
    bos_id: int = 1
    eos_id: int = 2
    unpad: bool = False

    def __post_init__(self) -> None:
        _check_generating_config(self)
        check_unpad(self.unpad, self.norm)  # group norm is refused above anyway
        check_int("src_vocab_size", self.src_vocab_size, min_value=1)
        check_int("tgt_vocab_size", self.tgt_vocab_size, min_value=1)
        check_int("n_encoder_layers", self.n_encoder_layers, min_value=1)
        check_int("n_decoder_layers", self.n_decoder_layers, min_value=1)
        check_bool("share_embeddings", self.share_embeddings)
        if self.share_embeddings and self.src_vocab_size != self.tgt_vocab_size:
            raise ValueError(
                f"share_embeddings needs equal vocab sizes, got src_vocab_size "
                f"({self.src_vocab_size}) and tgt_vocab_size ({self.tgt_vocab_size})"
            )
        _check_token_id("pad_id", self.pad_id, "src_vocab_size", self.src_vocab_size)
        for name in ("pad_id", "bos_id", "eos_id"):
            _check_token_id(name, getattr(self, name), "tgt_vocab_size", self.tgt_vocab_size)
        _check_distinct_ids(
            self, [("pad_id", "bos_id"), ("pad_id", "eos_id"), ("bos_id", "eos_id")]
        )

    def count_parameters(self) -> int:
        """The parameters of ``Transformer(self)``, without building it (within 2%)."""
        attention, feedforward, norm = self._sublayer_parameters()
        encoder = self.n_encoder_layers * (attention + feedforward + 2 * norm) + norm
        decoder = self.n_decoder_layers * (2 * attention + feedforward + 3 * norm) + norm
        d = self.d_model
        tables = self.tgt_vocab_size * d + (0 if self.share_embeddings else self.src_vocab_size * d)
        output = 0 if self.tie_output else self.tgt_vocab_size * (d + 1)
        return tables + 2 * self._learned_positions() + encoder + decoder + output

    def count_buffers(self) -> int:
        """The numbers of its computed position tables (a sinusoid per stack's embedder)."""
        return self._position_buffers(n_embedders=2)

    def activation_shape(self) -> ActivationShape:
        """Both stacks' layers, their widths, and the target vocabulary's logits."""
        return ActivationShape(
            n_layers=self.n_encoder_layers + self.n_decoder_layers, d_model=self.d_model,
            d_ff=self.d_ff, n_heads=self.n_heads, d_output=self.tgt_vocab_size,
        )


@dataclass(frozen=True)
class LMConfig(_ModelConfig):
    """A decoder-only language model: causal self-attention + FFN blocks, pre-LN by default.

    Attributes as in :class:`TransformerConfig` (its ``norm`` rules included), with one
    vocabulary of ``vocab_size`` ids and ``n_layers`` decoder blocks; ``tie_output`` ties the
    output projection to the token embedding. ``pad_id`` must differ from ``bos_id`` and
    ``eos_id``; ``bos_id == eos_id`` is allowed (GPT-2's one ``<|endoftext|>`` both starts and
    ends documents; generation only refuses to emit ``pad_id``).

    ``pad_id=None`` declares that the vocabulary has no padding token (GPT-2): every id is a
    real token, and padding is given only through ``padding_mask``. ``bos_id=None`` /
    ``eos_id=None`` likewise declare no start / stop token (a Hugging Face GPT-2 config whose
    ids lie outside its vocabulary, which transformers runs): generation then stops only at
    ``max_new_tokens`` or a ``stop_fn``. ``embed_scale="none"`` with
    ``position_encoding="learned"`` is GPT-2's input layer, ``E[ids] + P[positions]``.

    Attributes:
        vocab_size: V, the one vocabulary.
        n_layers: N, the decoder blocks.
    """

    vocab_size: int = 256
    d_model: int = 128
    n_heads: int = 4
    n_layers: int = 4
    d_ff: int = 512
    dropout: float = 0.1
    activation: str = "gelu"
    norm: str = "layer"
    norm_position: str = "pre"
    norm_eps: float = 1e-5
    bias: bool = True
    final_norm: bool | None = None
    position_encoding: str = "sinusoidal"
    position_base: float = 10000.0
    max_len: int = 512
    embed_scale: EmbedScale = "sqrt_d_model"
    tie_output: bool = True
    pad_id: int | None = 0
    bos_id: int | None = 1
    eos_id: int | None = 2

    def __post_init__(self) -> None:
        _check_generating_config(self)
        check_int("vocab_size", self.vocab_size, min_value=1)
        check_int("n_layers", self.n_layers, min_value=1)
        for name in ("pad_id", "bos_id", "eos_id"):  # None: no such token
            if getattr(self, name) is not None:
                _check_token_id(name, getattr(self, name), "vocab_size", self.vocab_size)
        _check_distinct_ids(self, [("pad_id", "bos_id"), ("pad_id", "eos_id")])

    def count_parameters(self) -> int:
        """The parameters of ``TransformerLM(self)``, without building it (within 2%)."""
        attention, feedforward, norm = self._sublayer_parameters()
        body = self.n_layers * (attention + feedforward + 2 * norm) + norm
        output = 0 if self.tie_output else self.vocab_size * (self.d_model + 1)
        return self.vocab_size * self.d_model + self._learned_positions() + body + output

    def count_buffers(self) -> int:
        """The numbers of ``TransformerLM(self)``'s computed position table."""
        return self._position_buffers(n_embedders=1)

    def activation_shape(self) -> ActivationShape:
        """The layers, their widths, and the vocabulary's logits."""
        return ActivationShape(
            n_layers=self.n_layers, d_model=self.d_model, d_ff=self.d_ff,
            n_heads=self.n_heads, d_output=self.vocab_size,
        )


TRANSFORMER_PRESETS: dict[str, TransformerConfig] = {
    # Vaswani et al. (2017), Table 3 "base": N=6, d_model=512, h=8, d_ff=2048, P_drop=0.1,
    # post-LN, shared source/target/output embeddings (their 37000-token BPE vocabulary).
    "base": TransformerConfig(),
    # CPU-sized encoder-decoders; vocab sizes are placeholders for the tokenizer's
    # (``dataclasses.replace(cfg, src_vocab_size=..., tgt_vocab_size=...)``).
    "tiny": TransformerConfig(
        src_vocab_size=128, tgt_vocab_size=128, d_model=64, n_heads=4, n_encoder_layers=2,
        n_decoder_layers=2, d_ff=256, max_len=256,
    ),
    "small": TransformerConfig(
        src_vocab_size=256, tgt_vocab_size=256, d_model=128, n_heads=4, n_encoder_layers=3,
        n_decoder_layers=3, d_ff=512, max_len=256,
    ),
}
LM_PRESETS: dict[str, LMConfig] = {
    # CPU-sized decoder-only language models (pre-LN, final norm).
    "lm-tiny": LMConfig(vocab_size=128, d_model=64, n_heads=4, n_layers=2, d_ff=256),
    "lm-small": LMConfig(vocab_size=256, d_model=128, n_heads=4, n_layers=4, d_ff=512),
}
# Both families' presets by name (the names are distinct), each typed as its own config, so
# ``addnorm.PRESETS["tiny"]`` is a TransformerConfig to a type checker, without an
# ``isinstance``; a name in a variable is looked up in its family's dict (``LM_PRESETS[name]``).
# tests/test_presets.py holds PRESETS to the two dicts (a preset added there belongs here).
Presets = TypedDict("Presets", {
    "base": TransformerConfig, "tiny": TransformerConfig, "small": TransformerConfig,
    "lm-tiny": LMConfig, "lm-small": LMConfig,
})
PRESETS: Presets = {
    "base": TRANSFORMER_PRESETS["base"], "tiny": TRANSFORMER_PRESETS["tiny"],
    "small": TRANSFORMER_PRESETS["small"],
    "lm-tiny": LM_PRESETS["lm-tiny"], "lm-small": LM_PRESETS["lm-small"],
}
