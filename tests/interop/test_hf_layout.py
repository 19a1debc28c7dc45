"""The Hugging Face layouts of BERT and GPT-2, without transformers.

Provenance: identities. The rules name exactly the tensors of the addnorm model a config
builds (so every weight is copied and none is invented); running them backwards and forwards
gives back every tensor exactly; the header-only path (infos_in) predicts the dtypes and
shapes that rules_in makes of the same tensors. The configs read the transformers defaults
(BERT_DEFAULTS, GPT2_DEFAULTS), and what addnorm cannot express is refused in one ValueError.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from addnorm import EncoderModel, TransformerLM
from addnorm.interop.hf_layout import (
    BERT_DEFAULTS,
    GPT2_DEFAULTS,
    bert_config,
    bert_rules,
    gpt2_config,
    gpt2_rules,
    infos_in,
    rules_in,
    rules_out,
)
from addnorm.utils.files import TensorInfo

SMALL = {"vocab_size": 50, "hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
         "intermediate_size": 24, "max_position_embeddings": 20}
SMALL_GPT2 = {"vocab_size": 50, "n_embd": 16, "n_layer": 2, "n_head": 2, "n_positions": 20,
              "bos_token_id": 49, "eos_token_id": 49}


def bert_fields(**changes):
    return SimpleNamespace(**(BERT_DEFAULTS | SMALL | changes))


def gpt2_fields(**changes):
    return SimpleNamespace(**(GPT2_DEFAULTS | SMALL_GPT2 | {"add_cross_attention": False}
                              | changes))


def random_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {k: torch.randn(v.shape, generator=g) for k, v in model.state_dict().items()}


def infos(tensors: dict[str, torch.Tensor]) -> dict[str, TensorInfo]:
    return {k: TensorInfo(v.dtype, tuple(v.shape))
            for k, v in tensors.items()}


@pytest.mark.parametrize("pooler", [True, False])
@pytest.mark.parametrize("prefix", ["", "bert."])
def test_bert_rules_cover_the_encoder_and_round_trip_exactly(pooler, prefix):
    cfg = bert_config(bert_fields(), pooler, "BERT")
    model = EncoderModel(cfg)
    rules = bert_rules(cfg.n_layers, pooler, prefix)
    assert {name for name, _, _ in rules} == set(model.state_dict())
    ours = random_state(model)
    theirs = rules_out(ours, rules)
    assert all(name.startswith(prefix) for name in theirs)
    q = theirs[f"{prefix}encoder.layer.0.attention.self.query.weight"]
    assert q.shape == (16, 16)  # in_proj's first third: W_q
    assert torch.equal(q, ours["encoder.layers.0.self_attn.in_proj.weight"][:16])
    back = rules_in(theirs, rules)
    assert back.keys() == ours.keys()
    assert all(torch.equal(back[k], ours[k]) for k in ours)
    model.load_state_dict(back)  # the shapes are the model's


@pytest.mark.parametrize("tied", [True, False])
def test_gpt2_rules_cover_the_lm_transpose_conv1d_and_round_trip_exactly(tied):
    cfg = gpt2_config(gpt2_fields(), tied, "GPT-2")
    model = TransformerLM(cfg)
    head = [] if tied else [("to_logits.weight", ("lm_head.weight",), "same")]
    rules = gpt2_rules(cfg.n_layers, "transformer.") + head
    own = set(model.state_dict()) - ({"to_logits.weight"} if tied else set())
    assert {name for name, _, _ in rules} == own
    ours = {k: v for k, v in random_state(model).items() if k in own}
    theirs = rules_out(ours, rules)
    c_fc = theirs["transformer.h.1.mlp.c_fc.weight"]
    assert torch.equal(c_fc, ours["blocks.layers.1.ff.w1.weight"].t())  # Conv1D: (in, out)
    back = rules_in(theirs, rules)
    assert all(torch.equal(back[k], ours[k]) for k in ours) and back.keys() == ours.keys()


def test_infos_in_predicts_what_rules_in_makes_and_names_what_is_missing_or_unstackable():
    cfg = bert_config(bert_fields(), True, "BERT")
    rules = bert_rules(cfg.n_layers, True)
    theirs = rules_out(random_state(EncoderModel(cfg)), rules)
    assert infos_in(infos(theirs), rules) == infos(rules_in(theirs, rules))
    gpt = gpt2_config(gpt2_fields(), True, "GPT-2")
    g_rules = gpt2_rules(gpt.n_layers, "")
    g_theirs = rules_out({k: v for k, v in random_state(TransformerLM(gpt)).items()
                          if k != "to_logits.weight"}, g_rules)
    assert infos_in(infos(g_theirs), g_rules) == infos(rules_in(g_theirs, g_rules))
    missing = dict(infos(theirs))
    del missing["pooler.dense.bias"]
    with pytest.raises(ValueError, match=r"lacks the tensors \['pooler.dense.bias'\]"):
        infos_in(missing, rules)
    odd = dict(infos(theirs))
    odd["encoder.layer.0.attention.self.key.weight"] = TensorInfo(torch.float16, (16, 16))
    with pytest.raises(ValueError, match="query/key/value tensors that cannot be stacked"):
        infos_in(odd, rules)


def test_the_configs_read_the_fields_and_refuse_what_addnorm_cannot_express_at_once():
    cfg = bert_config(bert_fields(), False, "BERT")
    assert (cfg.d_model, cfg.n_layers, cfg.d_ff, cfg.max_len, cfg.norm_eps) == (
        16, 2, 24, 20, 1e-12)
    assert (cfg.norm_position, cfg.position_encoding, cfg.pooler) == ("post", "learned", False)
    with pytest.raises(ValueError, match=r"cannot convert BERT: position_embedding_type "
                                         r"'relative_key'.*; dropout probabilities differ"):
        bert_config(bert_fields(position_embedding_type="relative_key",
                                hidden_dropout_prob=0.2), False, "BERT")
    lm = gpt2_config(gpt2_fields(), True, "GPT-2")
    assert (lm.d_ff, lm.norm_position, lm.tie_output) == (64, "pre", True)  # n_inner None: 4 D
    assert (lm.pad_id, lm.bos_id, lm.eos_id) == (None, 49, 49)  # GPT-2 has no pad token
    assert gpt2_config(gpt2_fields(eos_token_id=50256), True, "GPT-2").eos_id is None
    with pytest.raises(ValueError, match=r"cannot convert GPT-2: scale_attn_weights=False .*; "
                                         r"activation 'swish' \(supported: "):
        gpt2_config(gpt2_fields(scale_attn_weights=False, activation_function="swish"), True,
                    "GPT-2")
