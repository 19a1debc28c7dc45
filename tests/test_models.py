"""Transformer and TransformerLM: oracles are invariants (cached == uncached, padding
invariance, causality), full recomputation for greedy decoding, and the paper's embedding
formula checked against the encodings module."""

from __future__ import annotations

import math

import pytest
import torch

from addnorm.cache import DecodingCache
from addnorm.config import LMConfig, TransformerConfig
from addnorm.encodings import sinusoidal_encoding
from addnorm.models import Transformer, TransformerLM

V, PAD, BOS, EOS = 23, 0, 1, 2
F64 = torch.float64
POSITIONS = ["sinusoidal", "learned", "rotary", "none"]


def transformer(positions: str = "sinusoidal", **changes) -> Transformer:
    torch.manual_seed(0)
    cfg = TransformerConfig(
        src_vocab_size=V, tgt_vocab_size=V, d_model=32, n_heads=4, n_encoder_layers=2,
        n_decoder_layers=2, d_ff=64, dropout=0.0, positions=positions, max_len=16, **changes,
    )
    return Transformer(cfg).to(F64).eval()


def language_model(positions: str = "sinusoidal", **changes) -> TransformerLM:
    torch.manual_seed(0)
    cfg = LMConfig(
        vocab_size=V, d_model=32, n_heads=4, n_layers=2, d_ff=64, dropout=0.0,
        positions=positions, max_len=16, **changes,
    )
    return TransformerLM(cfg).to(F64).eval()


def ids(*shape: int, seed: int = 1) -> torch.Tensor:
    """Random real tokens (never pad, bos or eos)."""
    return torch.randint(3, V, shape, generator=torch.Generator().manual_seed(seed))


SOURCE = torch.tensor([[5, 6, 7, 8, 9], [10, 11, 12, PAD, PAD]])  # right-padded
PROMPT = torch.tensor([[5, 6, 7, 8], [PAD, PAD, 9, 10]])  # left-padded


@pytest.mark.parametrize("positions", POSITIONS)
@torch.no_grad()
def test_transformer_cached_steps_give_the_logits_of_full_recomputation(positions):
    model = transformer(positions)
    tokens = ids(2, 4)
    cache, first = model.start(SOURCE, max_new_tokens=5)
    steps = [first] + [model.step(tokens[:, i : i + 1], cache) for i in range(4)]
    target = torch.cat([torch.full((2, 1), BOS), tokens], dim=1)
    torch.testing.assert_close(torch.stack(steps, 1), model(SOURCE, target), atol=1e-10, rtol=0)


@pytest.mark.parametrize("positions", POSITIONS)
@torch.no_grad()
def test_lm_cached_steps_give_the_logits_of_full_recomputation(positions):
    model = language_model(positions)
    tokens = ids(2, 4)
    cache, first = model.start(PROMPT, max_new_tokens=5)
    steps = [first] + [model.step(tokens[:, i : i + 1], cache) for i in range(4)]
    full = model(torch.cat([PROMPT, tokens], dim=1))[:, 3:]
    torch.testing.assert_close(torch.stack(steps, 1), full, atol=1e-10, rtol=0)
    assert cache.length == 8


@torch.no_grad()
def test_transformer_padded_row_gives_its_logits_alone():
    model = transformer("learned").float()
    target = torch.tensor([[BOS, 3, 4, 5], [BOS, 6, PAD, PAD]])
    batched = model(SOURCE, target)
    alone = model(SOURCE[1:, :3], target[1:, :2])
    torch.testing.assert_close(batched[1, :2], alone[0], atol=1e-5, rtol=0)


@pytest.mark.parametrize("positions", ["sinusoidal", "rotary"])
@torch.no_grad()
def test_lm_left_and_right_padded_rows_give_their_logits_alone(positions):
    model = language_model(positions).float()
    row = torch.tensor([[7, 8, 9]])
    alone = model(row)[0]
    left = model(torch.tensor([[5, 6, 7, 8, 9], [PAD, PAD, 7, 8, 9]]))[1, 2:]
    right = model(torch.tensor([[5, 6, 7, 8, 9], [7, 8, 9, PAD, PAD]]))[1, :3]
    torch.testing.assert_close(left, alone, atol=1e-5, rtol=0)
    torch.testing.assert_close(right, alone, atol=1e-5, rtol=0)


@pytest.mark.parametrize("strategy", ["greedy", "beam"])
@torch.no_grad()
def test_lm_batched_generation_equals_each_prompt_alone(strategy):
    model = language_model("rotary")
    kw = dict(max_new_tokens=5, strategy=strategy, num_beams=3, eos_id=None)
    batched = model.generate(PROMPT, **kw)
    alone = torch.cat([model.generate(PROMPT[:1], **kw), model.generate(PROMPT[1:, 2:], **kw)])
    assert torch.equal(batched, alone)


@pytest.mark.parametrize("strategy", ["greedy", "beam"])
@torch.no_grad()
def test_transformer_batched_generation_equals_each_source_alone(strategy):
    model = transformer()
    kw = dict(max_new_tokens=5, strategy=strategy, num_beams=3, eos_id=None)
    batched = model.generate(SOURCE, **kw)
    alone = torch.cat([model.generate(SOURCE[:1], **kw), model.generate(SOURCE[1:, :3], **kw)])
    assert torch.equal(batched, alone)


@torch.no_grad()
def test_greedy_generation_is_the_argmax_of_full_recomputation():
    """Greedy decoding by definition: append argmax of the last position's logits."""
    model = transformer("rotary")
    generated = model.generate(SOURCE, max_new_tokens=4, eos_id=None)
    target = torch.full((2, 1), BOS)
    for _ in range(4):
        target = torch.cat([target, model(SOURCE, target)[:, -1].argmax(-1, keepdim=True)], 1)
    assert torch.equal(generated, target[:, 1:])


@torch.no_grad()
def test_lm_changing_future_tokens_leaves_earlier_logits_unchanged():
    model = language_model()
    sequence = ids(2, 6)
    changed = sequence.clone()
    changed[:, 4:] = ids(2, 2, seed=7)
    torch.testing.assert_close(model(sequence)[:, :4], model(changed)[:, :4], atol=0, rtol=0)


@torch.no_grad()
def test_embedding_is_scaled_tokens_plus_sinusoidal_positions():
    """Paper, sections 3.4-3.5: E[ids] * sqrt(d_model) + PE(pos)."""
    model = transformer()
    tokens = ids(2, 5)
    positions = torch.arange(5).expand(2, 5)
    expected = model.src_embed.tokens.weight[tokens] * math.sqrt(32) + sinusoidal_encoding(
        torch.arange(5), 32, dtype=F64
    )
    torch.testing.assert_close(model.src_embed(tokens, positions), expected, atol=1e-6, rtol=0)


def test_embedding_sharing_and_output_tying_follow_the_config():
    shared = transformer()
    assert shared.src_embed.tokens is shared.tgt_embed.tokens
    assert shared.to_logits.weight is shared.tgt_embed.tokens.weight
    separate = transformer(share_embeddings=False, tie_output=False)
    assert separate.src_embed.tokens is not separate.tgt_embed.tokens
    assert not torch.equal(separate.to_logits.weight, separate.tgt_embed.tokens.weight)
    lm = language_model()
    assert lm.to_logits.weight is lm.embed.tokens.weight


@torch.no_grad()
def test_all_padding_source_row_gives_finite_logits():
    model = transformer()
    source = torch.tensor([[PAD] * 4, [5, 6, PAD, PAD]])
    logits = model(source, torch.tensor([[BOS, 3], [BOS, 4]]))
    assert torch.isfinite(logits).all()
    assert torch.isfinite(model.generate(source, max_new_tokens=2)).all()


@torch.no_grad()
def test_cache_reorder_follows_the_index_for_every_stored_tensor():
    model = transformer()
    cache, _ = model.start(SOURCE, max_new_tokens=3)
    index = torch.tensor([1, 0, 1])
    cache.reorder(index)
    assert torch.equal(cache.memory_padding_mask, (SOURCE == PAD)[index])
    reordered = model.step(torch.full((3, 1), 4), cache)
    fresh, _ = model.start(SOURCE[index], max_new_tokens=3)
    torch.testing.assert_close(reordered, model.step(torch.full((3, 1), 4), fresh), atol=1e-12,
                               rtol=0)


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda t, m: t(torch.tensor([[3, V]]), torch.tensor([[BOS]])), ValueError,
         r"src_ids contains id 23 outside the vocabulary \[0, 23\)"),
        (lambda t, m: t(torch.tensor([[3]]), torch.tensor([[-1]])), ValueError,
         r"tgt_ids contains id -1 outside the vocabulary"),
        (lambda t, m: t(torch.tensor([[3.0]]), torch.tensor([[BOS]])), TypeError,
         r"src_ids must be an integer tensor"),
        (lambda t, m: t(torch.tensor([[3]]), torch.tensor([[BOS], [BOS]])), ValueError,
         r"src_ids batch size \(1\) must equal tgt_ids batch size \(2\)"),
        (lambda t, m: t(torch.tensor([[3, 4]]), torch.tensor([[BOS]]),
                        src_padding_mask=torch.tensor([[False]])), ValueError,
         r"src_padding_mask .* must have shape \(1, 2\)"),
        (lambda t, m: m(ids(1, 17)), ValueError,
         r"ids length \(17\) exceeds max_len \(16\) of the learned position table"),
        (lambda t, m: m.generate(PROMPT, max_new_tokens=14), ValueError,
         r"prompt length \(4\) \+ max_new_tokens \(14\) - 1 exceeds max_len \(16\)"),
        (lambda t, m: m.generate(torch.tensor([[5, PAD]])), ValueError,
         r"padding_mask must be left padding"),
        (lambda t, m: m.step(torch.tensor([[4]]), "cache"), TypeError, r"DecodingCache"),
        (lambda t, m: t.generate(SOURCE, strategy="sampling"), ValueError, r"strategy"),
        (lambda t, m: Transformer(LMConfig()), TypeError, r"cfg must be a TransformerConfig"),
    ],
)
def test_bad_inputs_raise_naming_the_values(call, error, match):
    with pytest.raises(error, match=match):
        call(transformer(), language_model("learned"))


def test_step_beyond_the_preallocated_length_raises():
    model = language_model()
    cache, _ = model.start(PROMPT, max_new_tokens=1)
    assert isinstance(cache, DecodingCache)
    model.step(torch.full((2, 1), 4), cache)
    with pytest.raises(ValueError, match=r"length \(5\) \+ new tokens \(1\) exceeds max_len \(5\)"):
        model.step(torch.full((2, 1), 4), cache)
