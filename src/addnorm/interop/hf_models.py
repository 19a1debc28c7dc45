"""Hugging Face ``transformers`` models in and out: BERT and GPT-2, weights included.

    transformers                       addnorm
    BertModel                      <-> EncoderModel      (post-LN, token types, embedding norm)
    GPT2LMHeadModel, GPT2Model      -> TransformerLM     (pre-LN, final norm, learned positions)
    GPT2LMHeadModel                <-  TransformerLM

From model objects, :func:`from_transformers` / :func:`to_transformers`: ``transformers`` is an
optional dependency (the ``transformers`` extra), imported inside them only. The result is on
the source's device and dtype, in its train/eval mode. From a folder that transformers'
``save_pretrained`` wrote, without transformers: :func:`from_transformers_folder` and
:func:`load_bert` (:mod:`addnorm.interop.hf_folder`, named here too).

Which weight goes where, and the conventions (GPT-2's special ids: none for padding, and a
bos/eos id outside the vocabulary becomes None, so generation runs to ``max_new_tokens`` as
in transformers), are in :mod:`addnorm.interop.hf_layout`. Hugging Face's
``attention_mask`` (1 = attend) is the negation of ``padding_mask``. Positions: Hugging Face
counts every slot (``arange(L)``), addnorm each row's real tokens, so outputs agree on
unpadded and right-padded rows.

Not convertible (``ValueError`` listing every reason): from transformers, relative position
embeddings, decoders / cross-attention in BERT, GPT-2 with ``scale_attn_weights=False`` or
``scale_attn_by_inverse_layer_idx=True``, activations other than relu, gelu and the tanh
gelus, dropout probabilities that differ between places, a list of eos ids; to transformers,
anything the target architecture cannot express (rotary or sinusoidal positions, the
``sqrt(D)`` scale, other norms or norm placement, ``swiglu``, no biases, ...).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from addnorm.interop.hf_folder import from_transformers_folder, load_bert
from addnorm.interop.hf_layout import (
    ACTIVATIONS_OUT,
    bert_config,
    bert_rules,
    gpt2_config,
    gpt2_rules,
    refuse,
    rules_in,
    rules_out,
)
from addnorm.transformer.config import LMConfig
from addnorm.transformer.encoder_model import EncoderConfig, EncoderModel
from addnorm.transformer.lm import TransformerLM

__all__ = [
    "from_transformers",
    "from_transformers_folder",
    "load_bert",
    "to_transformers",
]


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
    :class:`TransformerLM` -> ``GPT2LMHeadModel`` (a bos/eos id of None is written as None).
    A config the target cannot express raises a ``ValueError`` listing every reason.
    """
    if isinstance(model, EncoderModel):
        return _bert_out(model)
    if isinstance(model, TransformerLM):
        return _gpt2_out(model)
    raise TypeError(
        f"to_transformers cannot convert {type(model).__name__}; supported: EncoderModel, "
        "TransformerLM"
    )


def _load(
    target: nn.Module, tensors: dict[str, torch.Tensor], source: nn.Module
) -> nn.Module:
    """Copy ``tensors`` into every parameter of ``target``; then the source's device, dtype and
    train/eval mode."""
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
    return target.train(source.training)


# ------------------------------------------------------------------- from model objects


def _bert_in(model: nn.Module) -> EncoderModel:
    pooler = getattr(model, "pooler", None) is not None
    cfg = bert_config(model.config, pooler, type(model).__name__)
    tensors = rules_in(model.state_dict(), bert_rules(cfg.n_layers, pooler))
    return _load(EncoderModel(cfg), tensors, model)  # type: ignore[return-value]


def _gpt2_in(body: Any, head: torch.Tensor | None) -> TransformerLM:
    table = body.wte.weight
    tied = head is None or head is table or head.data_ptr() == table.data_ptr()
    cfg = gpt2_config(body.config, tied, "GPT-2")
    tensors = rules_in(body.state_dict(), gpt2_rules(cfg.n_layers, ""))
    tensors["to_logits.weight"] = table if tied or head is None else head
    return _load(TransformerLM(cfg), tensors, body)  # type: ignore[return-value]


# ---------------------------------------------------------------------- to transformers


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
    refuse("EncoderModel to BertModel", problems)
    hf = BertConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, num_hidden_layers=cfg.n_layers,
        num_attention_heads=cfg.n_heads, intermediate_size=cfg.d_ff,
        hidden_act=ACTIVATIONS_OUT[cfg.activation], hidden_dropout_prob=cfg.dropout,
        attention_probs_dropout_prob=cfg.dropout, max_position_embeddings=cfg.max_len,
        type_vocab_size=cfg.n_token_types, layer_norm_eps=cfg.norm_eps, pad_token_id=cfg.pad_id,
    )
    target = BertModel(hf, add_pooling_layer=cfg.pooler)
    tensors = rules_out(model.state_dict(), bert_rules(cfg.n_layers, cfg.pooler))
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
    if cfg.activation not in ACTIVATIONS_OUT:
        problems.append(f"activation={cfg.activation!r} (supported: relu, gelu, gelu_tanh)")
    if not cfg.bias:
        problems.append("bias=False")
    return problems


def _gpt2_out(model: TransformerLM) -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = model.cfg
    problems = _common_out_problems(cfg, norm_position="pre")
    if cfg.final_norm is False:
        problems.append("final_norm=False (GPT-2 ends in ln_f)")
    refuse("TransformerLM to GPT2LMHeadModel", problems)
    hf = GPT2Config(
        vocab_size=cfg.vocab_size, n_positions=cfg.max_len, n_embd=cfg.d_model,
        n_layer=cfg.n_layers, n_head=cfg.n_heads, n_inner=cfg.d_ff,
        activation_function=ACTIVATIONS_OUT[cfg.activation], resid_pdrop=cfg.dropout,
        embd_pdrop=cfg.dropout, attn_pdrop=cfg.dropout, layer_norm_epsilon=cfg.norm_eps,
        bos_token_id=cfg.bos_id, eos_token_id=cfg.eos_id, pad_token_id=cfg.pad_id,
        tie_word_embeddings=cfg.tie_output,
    )
    target = GPT2LMHeadModel(hf)
    ours = model.state_dict()
    tensors = rules_out(ours, gpt2_rules(cfg.n_layers, "transformer."))
    tensors["lm_head.weight"] = ours["to_logits.weight"]
    return _load(target, tensors, model)
