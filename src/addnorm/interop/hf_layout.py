"""How Hugging Face transformers lays out BERT and GPT-2, and where each part goes in addnorm.

What the conversions share, whether they start from a transformers model object
(:func:`~addnorm.interop.hf_models.from_transformers`) or from a folder that
transformers wrote (:func:`~addnorm.interop.hf_folder.from_transformers_folder`):
the config fields as addnorm configs (:func:`bert_config`, :func:`gpt2_config`) and the weights
by name (the rules: :func:`bert_rules`, :func:`gpt2_rules`, applied to tensors by
:func:`rules_in` / :func:`rules_out`, and to a safetensors header by :func:`infos_in`, so a
folder's tensors are checked before their data is read). Nothing here imports transformers.

Weights (addnorm name <- Hugging Face name):

- BERT: ``embed.tokens`` <- ``embeddings.word_embeddings``, ``embed.pos_enc.embedding`` <-
  ``position_embeddings``, ``embed.token_types`` <- ``token_type_embeddings``, ``embed.norm``
  <- ``embeddings.LayerNorm``; per layer ``self_attn.in_proj`` <- the rows of ``query``,
  ``key``, ``value`` stacked ``[W_q; W_k; W_v]``, ``self_attn.out_proj`` <-
  ``attention.output.dense``, ``attn_add_norm.norm`` <- ``attention.output.LayerNorm``,
  ``ff.w1`` <- ``intermediate.dense``, ``ff.w2`` <- ``output.dense``, ``ff_add_norm.norm`` <-
  ``output.LayerNorm``; ``pooler.dense`` <- ``pooler.dense``.
- GPT-2: ``embed.tokens`` <- ``wte``, ``embed.pos_enc.embedding`` <- ``wpe``; per block
  ``attn_add_norm.norm`` <- ``ln_1``, ``self_attn.in_proj`` <- ``attn.c_attn``,
  ``self_attn.out_proj`` <- ``attn.c_proj``, ``ff_add_norm.norm`` <- ``ln_2``, ``ff.w1`` <-
  ``mlp.c_fc``, ``ff.w2`` <- ``mlp.c_proj``; ``blocks.norm`` <- ``ln_f``; ``to_logits`` <-
  ``lm_head`` (tied to ``wte`` unless the checkpoint unties them). GPT-2's ``Conv1D`` stores
  its weight as (in, out), the transpose of ``nn.Linear``'s; ``c_attn``'s output columns are
  ``[q | k | v]``, so its transpose is ``in_proj``'s row layout.

Special ids of GPT-2: it has no padding token, so the model gets ``pad_id=None`` (a checkpoint
that reuses its bos/eos token as the pad token also gets None: that token is real text). A
``bos_token_id`` / ``eos_token_id`` that is None or lies outside the vocabulary (GPT-2's default
50256 in a config of a smaller ``vocab_size``, which transformers runs: such a token is never
generated) becomes None: no start token, no stop token, so generation runs to
``max_new_tokens`` as it does in transformers. A list of eos ids is refused (``LMConfig`` has
one).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from addnorm.transformer.config import LMConfig
from addnorm.transformer.encoder_model import EncoderConfig
from addnorm.utils.files import TensorInfo

__all__ = [
    "ACTIVATIONS_OUT",
    "BERT_DEFAULTS",
    "BERT_NAMES",
    "GPT2_DEFAULTS",
    "GPT2_NAMES",
    "Rule",
    "bert_config",
    "bert_rules",
    "gpt2_config",
    "gpt2_rules",
    "infos_in",
    "refuse",
    "rules_in",
    "rules_out",
]

# (addnorm name, Hugging Face names, how): "same" copies, "conv1d" transposes a GPT-2 Conv1D
# weight, "rows" stacks the Hugging Face tensors along dim 0 (q, k, v into in_proj).
Rule = tuple[str, tuple[str, ...], str]

_ACTIVATIONS_IN = {
    "relu": "relu",
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
}
ACTIVATIONS_OUT = {"relu": "relu", "gelu": "gelu", "gelu_tanh": "gelu_new"}

# The defaults of BertConfig and GPT2Config, for config.json files that leave fields out.
BERT_DEFAULTS: dict[str, Any] = {
    "hidden_act": "gelu", "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1,
    "max_position_embeddings": 512, "type_vocab_size": 2, "layer_norm_eps": 1e-12,
    "pad_token_id": 0, "position_embedding_type": "absolute", "vocab_size": 30522,
    "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
    "intermediate_size": 3072,
}
GPT2_DEFAULTS: dict[str, Any] = {
    "vocab_size": 50257, "n_positions": 1024, "n_embd": 768, "n_layer": 12, "n_head": 12,
    "n_inner": None, "activation_function": "gelu_new", "resid_pdrop": 0.1, "embd_pdrop": 0.1,
    "attn_pdrop": 0.1, "layer_norm_epsilon": 1e-5, "scale_attn_weights": True,
    "scale_attn_by_inverse_layer_idx": False, "bos_token_id": 50256, "eos_token_id": 50256,
}
# addnorm's config fields as the Hugging Face configs spell them (for messages).
BERT_NAMES = {
    "vocab_size": "vocab_size", "d_model": "hidden_size", "n_heads": "num_attention_heads",
    "n_layers": "num_hidden_layers", "d_ff": "intermediate_size",
    "max_len": "max_position_embeddings", "n_token_types": "type_vocab_size",
}
GPT2_NAMES = {
    "vocab_size": "vocab_size", "d_model": "n_embd", "n_heads": "n_head", "n_layers": "n_layer",
    "d_ff": "n_inner", "max_len": "n_positions",
}


# ------------------------------------------------------------------------------ weights


def _affine(ours: str, theirs: str) -> list[Rule]:
    return [(f"{ours}.{p}", (f"{theirs}.{p}",), "same") for p in ("weight", "bias")]


def bert_rules(n_layers: int, pooler: bool, prefix: str = "") -> list[Rule]:
    """BERT's weights by name; ``prefix`` is ``"bert."`` in a ``BertFor...`` checkpoint."""
    rules = [
        ("embed.tokens.weight", (f"{prefix}embeddings.word_embeddings.weight",), "same"),
        ("embed.pos_enc.embedding.weight",
         (f"{prefix}embeddings.position_embeddings.weight",), "same"),
        ("embed.token_types.weight",
         (f"{prefix}embeddings.token_type_embeddings.weight",), "same"),
        *_affine("embed.norm", f"{prefix}embeddings.LayerNorm"),
    ]
    for i in range(n_layers):
        ours, theirs = f"encoder.layers.{i}.", f"{prefix}encoder.layer.{i}."
        attn = theirs + "attention.self."
        for p in ("weight", "bias"):
            qkv = tuple(f"{attn}{name}.{p}" for name in ("query", "key", "value"))
            rules.append((f"{ours}self_attn.in_proj.{p}", qkv, "rows"))
        rules += _affine(ours + "self_attn.out_proj", theirs + "attention.output.dense")
        rules += _affine(ours + "attn_add_norm.norm", theirs + "attention.output.LayerNorm")
        rules += _affine(ours + "ff.w1", theirs + "intermediate.dense")
        rules += _affine(ours + "ff.w2", theirs + "output.dense")
        rules += _affine(ours + "ff_add_norm.norm", theirs + "output.LayerNorm")
    return rules + (_affine("pooler.dense", f"{prefix}pooler.dense") if pooler else [])


def gpt2_rules(n_layers: int, prefix: str) -> list[Rule]:
    """GPT-2's body by name; ``prefix`` is ``"transformer."`` in a ``GPT2LMHeadModel``."""
    rules = [
        ("embed.tokens.weight", (f"{prefix}wte.weight",), "same"),
        ("embed.pos_enc.embedding.weight", (f"{prefix}wpe.weight",), "same"),
        *_affine("blocks.norm", f"{prefix}ln_f"),
    ]
    for i in range(n_layers):
        ours, theirs = f"blocks.layers.{i}.", f"{prefix}h.{i}."
        for our_part, their_part in (("self_attn.in_proj", "attn.c_attn"),
                                     ("self_attn.out_proj", "attn.c_proj"),
                                     ("ff.w1", "mlp.c_fc"), ("ff.w2", "mlp.c_proj")):
            rules.append((f"{ours}{our_part}.weight", (f"{theirs}{their_part}.weight",), "conv1d"))
            rules.append((f"{ours}{our_part}.bias", (f"{theirs}{their_part}.bias",), "same"))
        rules += _affine(ours + "attn_add_norm.norm", theirs + "ln_1")
        rules += _affine(ours + "ff_add_norm.norm", theirs + "ln_2")
    return rules


def rules_in(theirs: Mapping[str, torch.Tensor], rules: list[Rule]) -> dict[str, torch.Tensor]:
    """addnorm's tensors from Hugging Face's, by the rules."""
    ours = {}
    for name, sources, how in rules:
        tensors = [theirs[source] for source in sources]
        if how == "rows":
            ours[name] = torch.cat(tensors, dim=0)
        else:
            ours[name] = tensors[0].t() if how == "conv1d" else tensors[0]
    return ours


def rules_out(ours: Mapping[str, torch.Tensor], rules: list[Rule]) -> dict[str, torch.Tensor]:
    """Hugging Face's tensors from addnorm's, by the rules run backwards."""
    theirs: dict[str, torch.Tensor] = {}
    for name, targets, how in rules:
        tensor = ours[name]
        if how == "rows":
            parts = tensor.chunk(len(targets), dim=0)
        else:
            parts = (tensor.t() if how == "conv1d" else tensor,)
        theirs.update(zip(targets, parts, strict=True))
    return theirs


def infos_in(saved: Mapping[str, TensorInfo], rules: list[Rule]) -> dict[str, TensorInfo]:
    """What :func:`rules_in` would make of tensors of these dtypes and shapes (a safetensors
    header: no data read), for checking them against the model before loading.

    Raises:
        ValueError: naming the Hugging Face tensors the rules need and ``saved`` lacks, and
            the q, k, v tensors that cannot be stacked (different dtypes or widths).
    """
    ours, absent, unstackable = {}, [], []
    for name, sources, how in rules:
        infos = [saved.get(source) for source in sources]
        present = [info for info in infos if info is not None]
        absent += [source for source, info in zip(sources, infos, strict=True) if info is None]
        if len(present) < len(infos):
            continue
        first = present[0]
        if how == "rows":
            if not first.shape or any(
                info.dtype != first.dtype or info.shape[1:] != first.shape[1:]
                for info in present
            ):
                pairs = zip(sources, present, strict=True)
                unstackable.append(", ".join(f"{s} {i.dtype} {i.shape}" for s, i in pairs))
                continue
            rows = sum(info.shape[0] for info in present)
            ours[name] = TensorInfo(first.dtype, (rows, *first.shape[1:]))
        elif how == "conv1d" and len(first.shape) == 2:
            ours[name] = TensorInfo(first.dtype, first.shape[::-1])
        else:  # a conv1d weight of another rank stays as it is: check_fits names its shape
            ours[name] = first
    problems = []
    if absent:
        problems.append(f"lacks the tensors {_listed(absent)}")
    if unstackable:
        problems.append(f"holds query/key/value tensors that cannot be stacked: {unstackable}")
    if problems:
        raise ValueError("; ".join(problems))
    return ours


def _listed(items: list[str], limit: int = 20) -> str:
    if len(items) <= limit:
        return str(items)
    return f"{items[:limit]} and {len(items) - limit} more"


# ------------------------------------------------------------------------------ configs


def _same(where: str, values: dict[str, Any], problems: list[str]) -> Any:
    """The one value of ``values``, or a problem naming them all (the first value returned)."""
    first = next(iter(values.values()))
    if any(value != first for value in values.values()):
        listing = ", ".join(f"{k}={v!r}" for k, v in values.items())
        problems.append(f"{where} differ ({listing}); addnorm has one")
    return first


def _activation_in(name: object, problems: list[str]) -> str:
    if not isinstance(name, str) or name not in _ACTIVATIONS_IN:
        problems.append(f"activation {name!r} (supported: {', '.join(_ACTIVATIONS_IN)})")
        return "gelu"
    return _ACTIVATIONS_IN[name]


def refuse(what: str, problems: list[str]) -> None:
    """Raise one ValueError listing every problem (none: nothing to refuse)."""
    if problems:
        raise ValueError(f"cannot convert {what}: " + "; ".join(problems))


def bert_config(hf: Any, pooler: bool, what: str) -> EncoderConfig:
    """The EncoderConfig of a BERT config (``BertConfig``, or ``config.json``'s fields over
    :data:`BERT_DEFAULTS` as attributes). ValueError lists what cannot be converted; a
    field of the wrong type raises TypeError or ValueError (from ``EncoderConfig``)."""
    problems: list[str] = []
    position_kind = getattr(hf, "position_embedding_type", "absolute")
    if position_kind != "absolute":
        problems.append(f"position_embedding_type {position_kind!r} (only 'absolute')")
    if getattr(hf, "is_decoder", False) or getattr(hf, "add_cross_attention", False):
        problems.append("is_decoder / add_cross_attention (a BERT decoder)")
    dropout = _same("dropout probabilities", {
        "hidden_dropout_prob": hf.hidden_dropout_prob,
        "attention_probs_dropout_prob": hf.attention_probs_dropout_prob,
    }, problems)
    activation = _activation_in(hf.hidden_act, problems)
    refuse(what, problems)
    return EncoderConfig(
        vocab_size=hf.vocab_size, d_model=hf.hidden_size, n_heads=hf.num_attention_heads,
        n_layers=hf.num_hidden_layers, d_ff=hf.intermediate_size,
        dropout=_number("hidden_dropout_prob", dropout), activation=activation,
        norm_position="post", norm_eps=_number("layer_norm_eps", hf.layer_norm_eps),
        position_encoding="learned", max_len=hf.max_position_embeddings, embed_scale="none",
        n_token_types=hf.type_vocab_size, embed_norm=True, pooler=pooler,
        pad_id=hf.pad_token_id,
    )


def gpt2_config(hf: Any, tied: bool, what: str) -> LMConfig:
    """The LMConfig of a GPT-2 config (``GPT2Config``, or ``config.json``'s fields over
    :data:`GPT2_DEFAULTS` as attributes); ``tied``: the head is the token table. ValueError
    lists what cannot be converted (a field of the wrong type: TypeError or ValueError)."""
    problems: list[str] = []
    if not hf.scale_attn_weights:
        problems.append("scale_attn_weights=False (addnorm scales by 1/sqrt(d_head))")
    if hf.scale_attn_by_inverse_layer_idx:
        problems.append("scale_attn_by_inverse_layer_idx=True")
    if getattr(hf, "add_cross_attention", False):
        problems.append("add_cross_attention=True")
    dropout = _same("dropout probabilities", {
        "resid_pdrop": hf.resid_pdrop, "embd_pdrop": hf.embd_pdrop, "attn_pdrop": hf.attn_pdrop,
    }, problems)
    activation = _activation_in(hf.activation_function, problems)
    pad_id, bos_id, eos_id = _gpt2_special_ids(hf, problems)
    refuse(what, problems)
    return LMConfig(
        vocab_size=hf.vocab_size, d_model=hf.n_embd, n_heads=hf.n_head, n_layers=hf.n_layer,
        d_ff=_times(4, hf.n_embd) if hf.n_inner is None else hf.n_inner,
        dropout=_number("resid_pdrop", dropout), activation=activation, norm="layer",
        norm_position="pre", norm_eps=_number("layer_norm_epsilon", hf.layer_norm_epsilon),
        bias=True, final_norm=True,
        position_encoding="learned", max_len=hf.n_positions, embed_scale="none",
        tie_output=tied, pad_id=pad_id, bos_id=bos_id, eos_id=eos_id,
    )


def _gpt2_special_ids(hf: Any, problems: list[str]) -> tuple[int | None, int | None, int | None]:
    """(pad_id, bos_id, eos_id): each None when absent or outside the vocabulary (see the
    module docstring); a pad id that is the bos or eos token becomes None as well."""
    vocab_size = hf.vocab_size
    ids: dict[str, int | None] = {}
    for name in ("pad_token_id", "bos_token_id", "eos_token_id"):
        value = getattr(hf, name, None)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            problems.append(f"{name}={value!r} (TransformerLM takes one int or None)")
            value = None
        in_vocab = isinstance(vocab_size, int) and value is not None and 0 <= value < vocab_size
        ids[name] = value if in_vocab else None
    bos, eos, pad = ids["bos_token_id"], ids["eos_token_id"], ids["pad_token_id"]
    return (None if pad in (bos, eos) else pad), bos, eos


def _number(name: str, value: object) -> float:
    """A JSON number as a float; TypeError naming ``name`` for anything else (a string, a
    list, a bool)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a number, got {value!r}")
    return float(value)


def _times(factor: int, value: object) -> Any:
    """``factor * value`` for an int (GPT-2's default d_ff); anything else as it is, for
    LMConfig to refuse by name."""
    return factor * value if isinstance(value, int) and not isinstance(value, bool) else value
