"""addnorm.bench.pairs: each benchmarked pair is one model in two implementations with the
same weights. Oracles: the reference libraries' forwards on the same inputs (FLOAT32_MODEL),
and for ``randomize`` the definition (every trainable weight moved, reproducibly by seed)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from tolerances import FLOAT32_MODEL

from addnorm.bench.pairs import bert_pair, dit_pair, gpt2_pair, randomize
from addnorm.dit import DiTConfig
from addnorm.transformer.encoder_model import EncoderConfig

CPU = torch.device("cpu")


def test_randomize_moves_every_trainable_weight_and_repeats_with_its_seed():
    a, b = torch.nn.Linear(4, 3), torch.nn.Linear(4, 3)
    b.load_state_dict(a.state_dict())
    a.bias.requires_grad_(False)
    before = {k: v.clone() for k, v in a.state_dict().items()}
    randomize(a, seed=1)
    assert not torch.equal(a.weight, before["weight"])
    assert torch.equal(a.bias, before["bias"])  # not trainable: left alone
    randomize(b, seed=1)
    assert torch.equal(a.weight, b.weight)


def test_bert_pair_gives_bertmodels_hidden_states_padded_and_unpadded():
    pytest.importorskip("transformers")
    cfg = EncoderConfig(vocab_size=40, d_model=16, n_heads=2, n_layers=2, d_ff=32, max_len=16,
                        norm_position="post", position_encoding="learned", n_token_types=2,
                        embed_norm=True, embed_scale="none", pad_id=0)
    padded, unpadded, bert = bert_pair(cfg, CPU)
    assert not padded.cfg.unpad and unpadded.cfg.unpad
    ids = torch.tensor([[5, 6, 7, 8], [9, 10, 0, 0]])
    real = ids != 0
    with torch.no_grad():
        theirs = bert(input_ids=ids, attention_mask=real.long()).last_hidden_state
        for model in (padded, unpadded):
            torch.testing.assert_close(model(ids)[real], theirs[real], **FLOAT32_MODEL)
    assert not (padded.training or unpadded.training or bert.training)


def test_gpt2_pair_gives_gpt2s_logits_and_dit_pair_diffusers_outputs():
    transformers = pytest.importorskip("transformers")
    widths = {"n_layer": 2, "n_embd": 16, "n_head": 2, "vocab_size": 50}
    ours, hf = gpt2_pair(transformers, widths, 16, CPU)
    ids = torch.tensor([[3, 4, 5, 6]])
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), hf(ids).logits, **FLOAT32_MODEL)
    assert ours.cfg.eos_id == 49 and hf.generation_config.eos_token_id is None
    pytest.importorskip("diffusers")
    cfg = DiTConfig(input_size=8, patch_size=2, in_channels=4, d_model=32, n_layers=2,
                    n_heads=4, n_classes=5, learn_sigma=True)
    dit, theirs = dit_pair(cfg, CPU)
    assert dit.cfg == dataclasses.replace(cfg, timestep_downscale_freq_shift=1.0)
    x, t, y = torch.randn(2, 4, 8, 8), torch.tensor([3.0, 700.0]), torch.tensor([1, 4])
    with torch.no_grad():
        out = dit(x, t, y)
        assert out.abs().max() > 0  # randomized: a fresh DiT's zero layers would output 0
        torch.testing.assert_close(out, theirs(x, timestep=t, class_labels=y).sample,
                                   **FLOAT32_MODEL)
