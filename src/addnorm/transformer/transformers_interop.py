"""Hugging Face ``transformers`` models in and out: BERT and GPT-2, weights included.

    transformers                       addnorm
    BertModel                      <-> EncoderModel      (post-LN, token types, embedding norm)
    GPT2LMHeadModel, GPT2Model      -> TransformerLM     (pre-LN, final norm, learned positions)
    GPT2LMHeadModel                <-  TransformerLM

``transformers`` is an optional dependency (the ``transformers`` extra): it is imported inside
these functions only. The result is on the source's device and dtype, in its train/eval mode.
:func:`load_bert` reads a BERT checkpoint directory (``config.json`` and ``model.safetensors``,
the Hugging Face layout) without transformers at all.

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

Conventions: GPT-2 has no padding token, so the model gets ``pad_id=None`` (a checkpoint that
reuses its bos/eos token as the pad token also gets None: that token is real text);
``embed_scale="none"`` (no ``sqrt(D)``); ``gelu_new`` is ``activation="gelu_tanh"``. Hugging
Face's ``attention_mask`` (1 = attend) is the negation of ``padding_mask``. Positions: Hugging
Face counts every slot (``arange(L)``), addnorm each row's real tokens, so outputs agree on
unpadded and right-padded rows.

Not convertible (``ValueError`` listing every reason): from transformers, relative position
embeddings, decoders / cross-attention in BERT, GPT-2 with ``scale_attn_weights=False`` or
``scale_attn_by_inverse_layer_idx=True``, activations other than relu, gelu and the tanh gelus,
dropout probabilities that differ between places, a missing bos or eos id; to transformers,
anything the target architecture cannot express (rotary or sinusoidal positions, the
``sqrt(D)`` scale, other norms or norm placement, ``swiglu``, no biases, ...).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

from addnorm.transformer.config import LMConfig
from addnorm.transformer.encoder_model import EncoderConfig, EncoderModel
from addnorm.transformer.lm import TransformerLM

__all__ = ["from_transformers", "load_bert", "to_transformers"]

# (addnorm name, Hugging Face names, how): "same" copies, "conv1d" transposes a GPT-2 Conv1D
# weight, "rows" stacks the Hugging Face tensors along dim 0 (q, k, v into in_proj).
Rule = tuple[str, tuple[str, ...], str]

_ACTIVATIONS_IN = {
    "relu": "relu",
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
}
_ACTIVATIONS_OUT = {"relu": "relu", "gelu": "gelu", "gelu_tanh": "gelu_new"}


def from_transformers(model: nn.Module) -> EncoderModel | TransformerLM:
    """The addnorm model holding a Hugging Face model's weights, giving its outputs.

    ``BertModel`` -> :class:`EncoderModel`; ``GPT2LMHeadModel`` / ``GPT2Model`` ->
    :class:`TransformerLM` (a ``GPT2Model`` has no head: the logits use the tied table, as
    GPT-2's head does). See the module docstring for the details and what is refused.
    """
    from transformers import BertModel, GPT2LMHeadModel, GPT2Model

    if isinstance(model, BertModel):
        return _bert_in(model)
    if isinstance(model, GPT2LMHeadModel):
        return _gpt2_in(model.transformer, model.lm_head.weight)
    if isinstance(model, GPT2Model):
        return _gpt2_in(model, None)
    raise TypeError(
        f"from_transformers cannot convert {type(model).__name__}; supported: BertModel, "
        "GPT2LMHeadModel, GPT2Model"
    )


def to_transformers(model: nn.Module) -> nn.Module:
    """The Hugging Face model holding an addnorm model's weights, giving its outputs.

    :class:`EncoderModel` -> ``BertModel`` (with a pooler when ``cfg.pooler``);
    :class:`TransformerLM` -> ``GPT2LMHeadModel``. A config the target cannot express raises
    a ``ValueError`` listing every reason.
    """
    if isinstance(model, EncoderModel):
        return _bert_out(model)
    if isinstance(model, TransformerLM):
        return _gpt2_out(model)
    raise TypeError(
        f"to_transformers cannot convert {type(model).__name__}; supported: EncoderModel, "
        "TransformerLM"
    )


# ------------------------------------------------------------------------------ weights


def _affine(ours: str, theirs: str) -> list[Rule]:
    return [(f"{ours}.{p}", (f"{theirs}.{p}",), "same") for p in ("weight", "bias")]


def _bert_rules(n_layers: int, pooler: bool) -> list[Rule]:
    rules = [
        ("embed.tokens.weight", ("embeddings.word_embeddings.weight",), "same"),
        ("embed.pos_enc.embedding.weight", ("embeddings.position_embeddings.weight",), "same"),
        ("embed.token_types.weight", ("embeddings.token_type_embeddings.weight",), "same"),
        *_affine("embed.norm", "embeddings.LayerNorm"),
    ]
    for i in range(n_layers):
        ours, theirs = f"encoder.layers.{i}.", f"encoder.layer.{i}."
        attn = theirs + "attention.self."
        for p in ("weight", "bias"):
            qkv = tuple(f"{attn}{name}.{p}" for name in ("query", "key", "value"))
            rules.append((f"{ours}self_attn.in_proj.{p}", qkv, "rows"))
        rules += _affine(ours + "self_attn.out_proj", theirs + "attention.output.dense")
        rules += _affine(ours + "attn_add_norm.norm", theirs + "attention.output.LayerNorm")
        rules += _affine(ours + "ff.w1", theirs + "intermediate.dense")
        rules += _affine(ours + "ff.w2", theirs + "output.dense")
        rules += _affine(ours + "ff_add_norm.norm", theirs + "output.LayerNorm")
    return rules + (_affine("pooler.dense", "pooler.dense") if pooler else [])


def _gpt2_rules(n_layers: int, prefix: str) -> list[Rule]:
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


def _rules_in(theirs: Mapping[str, torch.Tensor], rules: list[Rule]) -> dict[str, torch.Tensor]:
    """addnorm's tensors from Hugging Face's, by the rules."""
    ours = {}
    for name, sources, how in rules:
        tensors = [theirs[source] for source in sources]
        if how == "rows":
            ours[name] = torch.cat(tensors, dim=0)
        else:
            ours[name] = tensors[0].t() if how == "conv1d" else tensors[0]
    return ours


def _rules_out(ours: Mapping[str, torch.Tensor], rules: list[Rule]) -> dict[str, torch.Tensor]:
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


def _load(
    target: nn.Module, tensors: dict[str, torch.Tensor], source: nn.Module | None
) -> nn.Module:
    """Copy ``tensors`` into every parameter of ``target``; then the source's device, dtype and
    train/eval mode (no source: float32 on the CPU, eval mode)."""
    if source is not None:
        reference = next(source.parameters())
        target.to(device=reference.device, dtype=reference.dtype)
    params = dict(target.named_parameters(remove_duplicate=False))
    missing = sorted(set(params) - set(tensors))
    unknown = sorted(set(tensors) - set(target.state_dict()))
    if missing or unknown:  # the rules cover every parameter; a new library version may not
        raise ValueError(
            f"cannot map the weights of {type(target).__name__}: no value for {missing}, no "
            f"place for {unknown}"
        )
    with torch.no_grad():
        for name, tensor in tensors.items():
            if name in params:
                params[name].copy_(tensor)
    return target.train(source is not None and source.training)


# --------------------------------------------------------------------------------- BERT


def _same(where: str, values: dict[str, Any], problems: list[str]) -> Any:
    """The one value of ``values``, or a problem naming them all (the first value returned)."""
    if len(set(values.values())) > 1:
        listing = ", ".join(f"{k}={v!r}" for k, v in values.items())
        problems.append(f"{where} differ ({listing}); addnorm has one")
    return next(iter(values.values()))


def _activation_in(name: object, problems: list[str]) -> str:
    if not isinstance(name, str) or name not in _ACTIVATIONS_IN:
        problems.append(f"activation {name!r} (supported: {', '.join(_ACTIVATIONS_IN)})")
        return "gelu"
    return _ACTIVATIONS_IN[name]


def _refuse(what: str, problems: list[str]) -> None:
    if problems:
        raise ValueError(f"cannot convert {what}: " + "; ".join(problems))


def _bert_in(model: nn.Module) -> EncoderModel:
    pooler = getattr(model, "pooler", None) is not None
    cfg = _bert_config(model.config, pooler, type(model).__name__)
    tensors = _rules_in(model.state_dict(), _bert_rules(cfg.n_layers, pooler))
    return _load(EncoderModel(cfg), tensors, model)  # type: ignore[return-value]


def _bert_config(hf: Any, pooler: bool, what: str) -> EncoderConfig:
    """The EncoderConfig of a BERT config (``BertConfig`` or ``config.json``'s fields)."""
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
    _refuse(what, problems)
    return EncoderConfig(
        vocab_size=hf.vocab_size, d_model=hf.hidden_size, n_heads=hf.num_attention_heads,
        n_layers=hf.num_hidden_layers, d_ff=hf.intermediate_size, dropout=float(dropout),
        activation=activation, norm_position="post", norm_eps=float(hf.layer_norm_eps),
        position_encoding="learned", max_len=hf.max_position_embeddings, embed_scale="none",
        n_token_types=hf.type_vocab_size, embed_norm=True, pooler=pooler,
        pad_id=hf.pad_token_id,
    )


# BertConfig's defaults, for config.json files that leave fields out.
_BERT_DEFAULTS = {
    "hidden_act": "gelu", "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1,
    "max_position_embeddings": 512, "type_vocab_size": 2, "layer_norm_eps": 1e-12,
    "pad_token_id": 0, "position_embedding_type": "absolute",
}


def load_bert(directory: str | Path, *, unpad: bool = False) -> EncoderModel:
    """A BERT checkpoint directory as an :class:`EncoderModel` in eval mode, float32, CPU.

    ``unpad=True`` builds it with :attr:`EncoderConfig.unpad` (faster on padded batches; the
    hidden states are then zero at padding).

    Reads ``config.json`` (``model_type`` "bert") and ``model.safetensors`` (keys as in
    ``BertModel``, or under ``bert.``; heads such as ``cls.*`` are left out) with safetensors
    alone: no transformers needed. A pooler is built when the file has one. A missing file
    raises ``FileNotFoundError``; a config or tensor that does not fit, ``ValueError``.
    """
    from safetensors.torch import load_file

    directory = Path(directory)
    config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    if not isinstance(config, dict) or config.get("model_type") != "bert":
        got = config.get("model_type") if isinstance(config, dict) else config
        raise ValueError(f"{directory / 'config.json'}: model_type must be 'bert', got {got!r}")
    missing = [k for k in ("vocab_size", "hidden_size", "num_attention_heads",
                           "num_hidden_layers", "intermediate_size") if k not in config]
    if missing:
        raise ValueError(f"{directory / 'config.json'} lacks {missing}")
    weights = directory / "model.safetensors"
    tensors = {k.removeprefix("bert."): v for k, v in load_file(weights).items()}
    pooler = "pooler.dense.weight" in tensors
    cfg = _bert_config(SimpleNamespace(**(_BERT_DEFAULTS | config)), pooler, str(directory))
    cfg = dataclasses.replace(cfg, unpad=unpad)
    rules = _bert_rules(cfg.n_layers, pooler)
    absent = sorted({name for _, names, _ in rules for name in names} - set(tensors))
    if absent:
        raise ValueError(f"{weights} lacks the tensors {absent}")
    return _load(EncoderModel(cfg), _rules_in(tensors, rules), None)  # type: ignore[return-value]


def _bert_out(model: EncoderModel) -> nn.Module:
    from transformers import BertConfig, BertModel

    cfg = model.cfg
    problems = _common_out_problems(cfg, norm_position="post")
    if cfg.final_norm:
        problems.append("final_norm=True (BERT has no norm after a post-LN stack)")
    if not cfg.embed_norm:
        problems.append("embed_norm=False (BERT normalises its embeddings)")
    if cfg.n_token_types == 0:
        problems.append("n_token_types=0 (BERT has a token-type table)")
    _refuse("EncoderModel to BertModel", problems)
    hf = BertConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, num_hidden_layers=cfg.n_layers,
        num_attention_heads=cfg.n_heads, intermediate_size=cfg.d_ff,
        hidden_act=_ACTIVATIONS_OUT[cfg.activation], hidden_dropout_prob=cfg.dropout,
        attention_probs_dropout_prob=cfg.dropout, max_position_embeddings=cfg.max_len,
        type_vocab_size=cfg.n_token_types, layer_norm_eps=cfg.norm_eps, pad_token_id=cfg.pad_id,
    )
    target = BertModel(hf, add_pooling_layer=cfg.pooler)
    tensors = _rules_out(model.state_dict(), _bert_rules(cfg.n_layers, cfg.pooler))
    return _load(target, tensors, model)


def _common_out_problems(cfg: EncoderConfig | LMConfig, *, norm_position: str) -> list[str]:
    """What BERT and GPT-2 share and addnorm may not have: the settings to check."""
    problems = []
    if cfg.position_encoding != "learned":
        problems.append(f"position_encoding={cfg.position_encoding!r} (only 'learned')")
    if cfg.embed_scale != "none":
        problems.append(f"embed_scale={cfg.embed_scale!r} (only 'none')")
    if cfg.norm != "layer":
        problems.append(f"norm={cfg.norm!r} (only 'layer')")
    if cfg.norm_position != norm_position:
        problems.append(f"norm_position={cfg.norm_position!r} (only {norm_position!r})")
    if cfg.activation not in _ACTIVATIONS_OUT:
        problems.append(f"activation={cfg.activation!r} (supported: relu, gelu, gelu_tanh)")
    if not cfg.bias:
        problems.append("bias=False")
    return problems


# -------------------------------------------------------------------------------- GPT-2


def _gpt2_special_ids(hf: Any, problems: list[str]) -> tuple[int | None, int, int]:
    """(pad_id, bos_id, eos_id); a pad id that is the bos or eos token becomes None."""
    ids = {}
    for name in ("bos_token_id", "eos_token_id"):
        value = getattr(hf, name, None)
        if not isinstance(value, int):
            problems.append(f"{name}={value!r} (TransformerLM needs one int)")
        ids[name] = value if isinstance(value, int) else 0
    bos, eos = ids["bos_token_id"], ids["eos_token_id"]
    pad = getattr(hf, "pad_token_id", None)
    return (None if pad in (None, bos, eos) else pad), bos, eos


def _gpt2_in(body: Any, head: torch.Tensor | None) -> TransformerLM:
    hf = body.config
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
    _refuse("GPT-2", problems)
    table = body.wte.weight
    tied = head is None or head is table or head.data_ptr() == table.data_ptr()
    cfg = LMConfig(
        vocab_size=hf.vocab_size, d_model=hf.n_embd, n_heads=hf.n_head, n_layers=hf.n_layer,
        d_ff=hf.n_inner or 4 * hf.n_embd, dropout=float(dropout), activation=activation,
        norm="layer", norm_position="pre", norm_eps=float(hf.layer_norm_epsilon), bias=True,
        final_norm=True, position_encoding="learned", max_len=hf.n_positions,
        embed_scale="none", tie_output=tied, pad_id=pad_id, bos_id=bos_id, eos_id=eos_id,
    )
    tensors = _rules_in(body.state_dict(), _gpt2_rules(cfg.n_layers, ""))
    tensors["to_logits.weight"] = table if tied or head is None else head
    return _load(TransformerLM(cfg), tensors, body)  # type: ignore[return-value]


def _gpt2_out(model: TransformerLM) -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = model.cfg
    problems = _common_out_problems(cfg, norm_position="pre")
    if cfg.final_norm is False:
        problems.append("final_norm=False (GPT-2 ends in ln_f)")
    _refuse("TransformerLM to GPT2LMHeadModel", problems)
    hf = GPT2Config(
        vocab_size=cfg.vocab_size, n_positions=cfg.max_len, n_embd=cfg.d_model,
        n_layer=cfg.n_layers, n_head=cfg.n_heads, n_inner=cfg.d_ff,
        activation_function=_ACTIVATIONS_OUT[cfg.activation], resid_pdrop=cfg.dropout,
        embd_pdrop=cfg.dropout, attn_pdrop=cfg.dropout, layer_norm_epsilon=cfg.norm_eps,
        bos_token_id=cfg.bos_id, eos_token_id=cfg.eos_id, pad_token_id=cfg.pad_id,
        tie_word_embeddings=cfg.tie_output,
    )
    target = GPT2LMHeadModel(hf)
    ours = model.state_dict()
    tensors = _rules_out(ours, _gpt2_rules(cfg.n_layers, "transformer."))
    tensors["lm_head.weight"] = ours["to_logits.weight"]
    return _load(target, tensors, model)
