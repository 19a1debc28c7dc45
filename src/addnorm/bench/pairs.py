"""The GPU suite's models, each in addnorm and in its reference library with the same weights.

- GPT-2: Hugging Face's ``GPT2LMHeadModel`` (sdpa attention, no dropout, its own random
  initialisation) and the ``TransformerLM`` that ``addnorm.interop.from_transformers`` makes
  of it.
- BERT: an ``EncoderModel`` (random initialisation) and the ``BertModel`` that
  ``addnorm.interop.to_transformers`` makes of it (sdpa attention).
- DiT: a ``DiT`` in diffusers' conventions whose every weight is random, and the
  ``DiTTransformer2DModel`` that ``addnorm.interop.to_diffusers`` makes of it.

Each pair is built on the CPU, in float32, and moved to the device.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

from addnorm.dit.config import DiTConfig
from addnorm.dit.model import DiT
from addnorm.interop.hf_models import from_transformers, to_transformers
from addnorm.transformer.encoder_model import EncoderConfig, EncoderModel
from addnorm.transformer.lm import TransformerLM

__all__ = ["bert_pair", "dit_pair", "gpt2_pair", "randomize", "use_sdpa"]


def use_sdpa(model: Any) -> str:
    """Switch a transformers model to its sdpa attention; returns the implementation it uses."""
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation("sdpa")
    else:  # transformers before set_attn_implementation
        model.config._attn_implementation = "sdpa"
    return str(model.config._attn_implementation)


def gpt2_pair(transformers: Any, widths: dict[str, int], n_positions: int,
              device: torch.device) -> tuple[TransformerLM, nn.Module]:
    """(addnorm, Hugging Face) GPT-2 of these widths (``n_layer``, ``n_embd``, ``n_head``,
    ``vocab_size``), same weights, in eval mode; like GPT-2, the last id starts and ends
    texts, and generation runs to ``max_new_tokens`` (no stop token)."""
    last = widths["vocab_size"] - 1
    config = transformers.GPT2Config(
        **widths, n_positions=n_positions, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        bos_token_id=last, eos_token_id=last, pad_token_id=None,
    )
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(config).eval()
    use_sdpa(hf)
    hf.generation_config.eos_token_id = None  # decode all the way, the same work as addnorm
    hf.generation_config.bos_token_id = None
    ours = from_transformers(hf)
    assert isinstance(ours, TransformerLM)
    return ours.to(device).eval(), hf.to(device)


def bert_pair(cfg: EncoderConfig, device: torch.device
              ) -> tuple[EncoderModel, EncoderModel, nn.Module]:
    """(addnorm padded, addnorm with ``unpad=True``, Hugging Face ``BertModel``), the same
    random weights, in eval mode."""
    torch.manual_seed(0)
    padded = EncoderModel(dataclasses.replace(cfg, unpad=False)).eval()
    unpadded = EncoderModel(dataclasses.replace(cfg, unpad=True)).eval()
    unpadded.load_state_dict(padded.state_dict())
    bert = to_transformers(padded).eval()
    use_sdpa(bert)
    return padded.to(device), unpadded.to(device), bert.to(device)


def randomize(model: nn.Module, *, seed: int = 0, scale: float = 0.02) -> nn.Module:
    """Add N(0, scale^2) noise to every trainable weight (a fresh DiT's adaLN-Zero and final
    layers are zero, so it outputs exactly zero and any comparison would pass)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(torch.randn(p.shape, generator=generator, dtype=p.dtype) * scale)
    return model


def dit_pair(cfg: DiTConfig, device: torch.device) -> tuple[DiT, nn.Module]:
    """(addnorm, diffusers) DiT of ``cfg`` in diffusers' variant (timestep shift 1), the same
    random weights, in eval mode."""
    from addnorm.interop.diffusers import to_diffusers

    torch.manual_seed(0)
    ours = DiT(dataclasses.replace(cfg, timestep_downscale_freq_shift=1.0))
    randomize(ours).eval()
    theirs = to_diffusers(ours).eval()
    return ours.to(device), theirs.to(device)
