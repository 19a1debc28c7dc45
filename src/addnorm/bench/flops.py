"""How the GPU suite counts floating-point operations: matrix products only, 2 per
multiply-add, the work a model needs rather than what an implementation happens to do.

- A forward pass costs ``2 N`` per token, N the weights of the matrix products that run once
  per token (every ``nn.Linear`` and the patch convolution; embedding lookups cost nothing),
  plus attention, ``4 L D T`` per token (Q K^T and A V over T keys, in L layers of width D).
  Causal attention is counted over every key, as nanoGPT and PaLM count it.
- A training step costs three forwards (the backward computes two products per forward
  product): ``6 N`` per token plus ``12 L D T`` per token.
- DiT: the adaLN modulations and the timestep MLP run once per image, not per token
  (``2 N_image`` per image).
- Padded batches (BERT): the real tokens' work only (each row's own length), so that padded
  and unpadded implementations are credited with the same useful work.
- Greedy decoding: the prompt's forward, then one token per step attending to the tokens
  before it.

``tests/bench`` checks these formulas against ``torch.utils.flop_counter.FlopCounterMode`` on
small models with the math attention kernel (whose products the counter sees).
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from addnorm.dit.model import DiT

__all__ = [
    "decoding_flops",
    "dit_flops",
    "encoder_flops",
    "lm_flops",
    "matmul_weights",
]

# DiT modules run on the conditioning vector c, once per image (addnorm.dit's names).
PER_IMAGE = ("timestep_embed", "adaLN_modulation", "block_embeds")


def matmul_weights(model: nn.Module, *, per_image: bool = False) -> int:
    """Weights of the model's matrix products: ``nn.Linear`` and ``nn.Conv2d`` weights, each
    shared tensor once, the pooler left out; with ``per_image``, only those of the modules
    named in :data:`PER_IMAGE`, else all others."""
    seen: set[int] = set()
    total = 0
    for name, module in model.named_modules():
        if not isinstance(module, nn.Linear | nn.Conv2d) or name.startswith("pooler"):
            continue
        if any(part in name for part in PER_IMAGE) != per_image:
            continue
        if module.weight.data_ptr() not in seen:
            seen.add(module.weight.data_ptr())
            total += module.weight.numel()
    return total


def _attention(n_layers: int, d_model: int, keys: float) -> float:
    """Forward FLOPs of attention for one query token over ``keys`` keys, all layers."""
    return 4.0 * n_layers * d_model * keys


def lm_flops(weights: int, n_layers: int, d_model: int, batch: int, length: int, *,
             training: bool) -> float:
    """A forward (or a training step) of a Transformer over ``batch`` rows of ``length``."""
    tokens = batch * length
    forward = tokens * (2.0 * weights + _attention(n_layers, d_model, length))
    return 3 * forward if training else forward


def encoder_flops(weights: int, n_layers: int, d_model: int, lengths: Sequence[int]) -> float:
    """A forward over rows of these real lengths (padding not counted)."""
    return sum(n * (2.0 * weights + _attention(n_layers, d_model, n)) for n in lengths)


def decoding_flops(weights: int, n_layers: int, d_model: int, batch: int, prompt: int,
                   new: int) -> float:
    """Greedy generation of ``new`` tokens: the prompt's forward gives the first, then
    ``new - 1`` steps of one token each over the tokens before it."""
    prefill = lm_flops(weights, n_layers, d_model, 1, prompt, training=False)
    steps = sum(2.0 * weights + _attention(n_layers, d_model, keys)
                for keys in range(prompt + 1, prompt + new))
    return batch * (prefill + steps)


def dit_flops(model: DiT, batch: int, *, training: bool) -> float:
    """A DiT forward (or training step) of ``batch`` images."""
    cfg = model.cfg
    tokens = (cfg.input_size // cfg.patch_size) ** 2
    per_token = matmul_weights(model)
    per_image = matmul_weights(model, per_image=True)
    forward = batch * (tokens * (2.0 * per_token + _attention(cfg.n_layers, cfg.d_model, tokens))
                       + 2.0 * per_image)
    return 3 * forward if training else forward
