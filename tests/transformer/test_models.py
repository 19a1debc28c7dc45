"""Transformer and TransformerLM generating, their shared tables and their argument checks:
oracles are invariants (batched == alone, cached == uncached), full recomputation for greedy
decoding. (Each model's forward: test_lm.py, test_encoder_decoder.py; the embedding:
test_embedding.py.)"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from tiny_transformers import (
    BOS,
    EOS,
    F64,
    PAD,
    PROMPT,
    SOURCE,
    V,
    ids,
    language_model,
    transformer,
)
from tolerances import FLOAT64_EXACT
from torch import nn

from addnorm.generation.config import GenerationConfig
from addnorm.transformer import Transformer
from addnorm.transformer.config import LMConfig


@pytest.mark.parametrize("strategy", ["greedy", "beam"])
@torch.no_grad()
def test_lm_batched_generation_equals_each_prompt_alone(strategy):
    model = language_model("rotary")
    kw = dict(max_new_tokens=5, strategy=strategy, num_beams=3, eos_id=None)
    config = gen(model, **kw)
    batched = model.generate(PROMPT, config)
    alone = torch.cat([model.generate(PROMPT[:1], config), model.generate(PROMPT[1:, 2:], config)])
    assert torch.equal(batched, alone)


@pytest.mark.parametrize("strategy", ["greedy", "beam"])
@torch.no_grad()
def test_transformer_batched_generation_equals_each_source_alone(strategy):
    model = transformer()
    kw = dict(max_new_tokens=5, strategy=strategy, num_beams=3, eos_id=None)
    config = gen(model, **kw)
    batched = model.generate(SOURCE, config)
    alone = torch.cat([model.generate(SOURCE[:1], config), model.generate(SOURCE[1:, :3], config)])
    assert torch.equal(batched, alone)


@torch.no_grad()
def test_greedy_generation_is_the_argmax_of_full_recomputation():
    """Greedy decoding by definition: append argmax of the last position's logits."""
    model = transformer("rotary")
    generated = model.generate(SOURCE, gen(model, max_new_tokens=4, eos_id=None))
    target = torch.full((2, 1), BOS)
    for _ in range(4):
        target = torch.cat([target, model(SOURCE, target)[:, -1].argmax(-1, keepdim=True)], 1)
    assert torch.equal(generated, target[:, 1:])


def gen(model, **changes) -> GenerationConfig:
    """The model's own generation config with ``changes`` (its eos and pad ids kept)."""
    return replace(model.generation_config, **changes)


@torch.no_grad()
def favouring(model, favoured: list[int]):
    """The model with a +100 output bias on ``favoured``: they win every raw argmax."""
    head = nn.Linear(32, V, dtype=F64)
    head.weight.copy_(model.to_logits.weight)
    head.bias.zero_()
    head.bias[favoured] = 100.0
    model.to_logits = head
    return model


GENERATE = dict(max_new_tokens=5, num_beams=3, eos_id=None)


@pytest.mark.parametrize("strategy", ["greedy", "sample", "beam"])
@torch.no_grad()
def test_lm_never_generates_pad_so_cached_logits_match_recomputation(strategy):
    """A generated pad would be masked out when fed back. Invariants: no pad in the output,
    although pad wins every raw argmax; cached logits == full recomputation of the output."""
    model = favouring(language_model(), [PAD])
    assert (model(PROMPT).argmax(-1) == PAD).all()
    config, generator = gen(model, strategy=strategy, **GENERATE), torch.Generator().manual_seed(0)
    out = model.generate(PROMPT, config, generator=generator)
    assert out.shape == (2, 5) and not (out == PAD).any()
    cache, first = model.start(PROMPT, max_new_tokens=5)
    steps = [first] + [model.step(out[:, i : i + 1], cache) for i in range(4)]
    full = model(torch.cat([PROMPT, out], dim=1))[:, 3:-1]
    torch.testing.assert_close(torch.stack(steps, 1), full, **FLOAT64_EXACT)


@pytest.mark.parametrize("strategy", ["greedy", "sample", "beam"])
@torch.no_grad()
def test_transformer_never_generates_pad_or_bos_so_cached_logits_match_recomputation(strategy):
    """As for the LM, with bos (the decoder's start token) banned as well."""
    model = favouring(transformer(tie_output=False), [PAD, BOS])
    target, banned = torch.full((2, 1), BOS), torch.tensor([PAD, BOS])
    assert torch.isin(model(SOURCE, target).argmax(-1), banned).all()
    config, generator = gen(model, strategy=strategy, **GENERATE), torch.Generator().manual_seed(0)
    out = model.generate(SOURCE, config, generator=generator)
    assert out.shape == (2, 5) and not torch.isin(out, banned).any()
    cache, first = model.start(SOURCE, max_new_tokens=5)
    steps = [first] + [model.step(out[:, i : i + 1], cache) for i in range(4)]
    full = model(SOURCE, torch.cat([target, out[:, :4]], dim=1))
    torch.testing.assert_close(torch.stack(steps, 1), full, **FLOAT64_EXACT)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int16, torch.int32])
@torch.no_grad()
def test_any_integer_dtype_of_ids_gives_the_logits_of_long_ids(dtype):
    """Identity: ids are converted to long before the embedding lookup."""
    model, lm = transformer(), language_model()
    target = torch.cat([torch.full((2, 1), BOS), ids(2, 3)], dim=1)
    expected = model(SOURCE, target)
    torch.testing.assert_close(model(SOURCE.to(dtype), target.to(dtype)), expected, atol=0,
                               rtol=0)
    torch.testing.assert_close(lm(PROMPT.to(dtype)), lm(PROMPT), atol=0, rtol=0)
    cache, _ = lm.start(PROMPT, max_new_tokens=2)
    cache_long, _ = lm.start(PROMPT, max_new_tokens=2)
    token = torch.full((2, 1), 4)
    torch.testing.assert_close(lm.step(token.to(dtype), cache), lm.step(token, cache_long),
                               atol=0, rtol=0)


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
    assert torch.isfinite(model.generate(source, gen(model, max_new_tokens=2))).all()


@torch.no_grad()
def test_cache_reorder_follows_the_index_for_every_stored_tensor():
    model = transformer()
    cache, _ = model.start(SOURCE, max_new_tokens=3)
    index = torch.tensor([1, 0, 1])
    cache.reorder(index)
    assert torch.equal(cache.memory_padding_mask, (SOURCE == PAD)[index])
    reordered = model.step(torch.full((3, 1), 4), cache)
    fresh, _ = model.start(SOURCE[index], max_new_tokens=3)
    expected = model.step(torch.full((3, 1), 4), fresh)
    torch.testing.assert_close(reordered, expected, **FLOAT64_EXACT)


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
        # past its table the model slides its window (generation/window.py); a window wider
        # than the table is refused
        (lambda t, m: m.generate(PROMPT, gen(m, max_new_tokens=14, window=17)), ValueError,
         r"window \(17\) exceeds max_len \(16\) of the model's learned position table"),
        (lambda t, m: m.generate(torch.tensor([[5, PAD]])), ValueError,
         r"padding_mask must be left padding"),
        (lambda t, m: m.step(torch.tensor([[4]]), "cache"), TypeError, r"DecodingCache"),
        (lambda t, m: t.generate(SOURCE, gen(t, strategy="sampling")), ValueError, r"strategy"),
        (lambda t, m: Transformer(LMConfig()), TypeError, r"cfg must be a TransformerConfig"),
        (lambda t, m: m(torch.tensor([[3.0]])), TypeError,
         r"ids must be an integer tensor of token ids, got dtype torch.float32"),
        (lambda t, m: m(torch.tensor([[True]])), TypeError, r"got dtype torch.bool"),
        (lambda t, m: m(torch.zeros(0, 3, dtype=torch.long)), ValueError,
         r"ids must have B >= 1 rows and L >= 1 tokens, got shape \(0, 3\)"),
        (lambda t, m: t(SOURCE, torch.zeros(2, 0, dtype=torch.long)), ValueError,
         r"tgt_ids must have B >= 1 rows and L >= 1 tokens, got shape \(2, 0\)"),
        (lambda t, m: m.generate(PROMPT, gen(m, eos_id=PAD)), ValueError,
         r"eos_id 0 includes pad_id \(0\), which generation never emits"),
        (lambda t, m: t.generate(SOURCE, gen(t, eos_id=(EOS, BOS))), ValueError,
         r"eos_id \(2, 1\) includes bos_id \(1\), which generation never emits"),
        (lambda t, m: m.step(torch.tensor([[4]]), t.start(SOURCE[:1], max_new_tokens=2)[0]),
         ValueError, r"cache holds encoder memory \(a Transformer's cache\)"),
        (lambda t, m: t.step(torch.tensor([[4]]), m.start(PROMPT[:1], max_new_tokens=2)[0]),
         ValueError, r"cache has no encoder memory"),
    ],
)
def test_bad_inputs_raise_naming_the_values(call, error, match):
    with pytest.raises(error, match=match):
        call(transformer(), language_model("learned"))
