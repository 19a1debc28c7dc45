"""addnorm.bench.flops: the FLOP formulas are what torch's FlopCounterMode counts."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from addnorm.bench.flops import dit_flops, encoder_flops, lm_flops, matmul_weights


def _counted(fn) -> int:
    """FLOPs torch's counter sees; the math attention kernel, whose products it counts."""
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


def test_lm_formula_is_what_torch_counts_for_a_forward_and_a_training_step():
    pytest.importorskip("transformers")
    import transformers

    from addnorm.bench.gpt2_training import GPT2_TINY, lm_loss
    from addnorm.bench.pairs import gpt2_pair

    ours, _ = gpt2_pair(transformers, GPT2_TINY, 16, torch.device("cpu"))
    ids = torch.randint(0, GPT2_TINY["vocab_size"], (2, 17))
    x, y = ids[:, :-1], ids[:, 1:]
    args = (matmul_weights(ours), GPT2_TINY["n_layer"], GPT2_TINY["n_embd"], 2, 16)
    assert _counted(lambda: lm_loss(ours)(x, y).backward()) == lm_flops(*args, training=True)
    with torch.no_grad():
        assert _counted(lambda: ours(x)) == lm_flops(*args, training=False)


def test_encoder_formula_is_what_torch_counts_without_padding():
    pytest.importorskip("transformers")
    from addnorm.bench.bert_inference import BERT_TINY
    from addnorm.bench.pairs import bert_pair

    padded, _, _ = bert_pair(BERT_TINY, torch.device("cpu"))
    ids = torch.randint(1, BERT_TINY.vocab_size, (3, 12))
    with torch.no_grad():
        counted = _counted(lambda: padded(ids))
    assert counted == encoder_flops(matmul_weights(padded), BERT_TINY.n_layers,
                                    BERT_TINY.d_model, [12, 12, 12])


@pytest.mark.parametrize("training", [False, True])
def test_dit_formula_is_what_torch_counts(training):
    import torch.nn.functional as F

    from addnorm.bench.dit_training import DIT_TINY, dit_batch
    from addnorm.dit.model import DiT

    model = DiT(DIT_TINY).train(training)
    x, t, y = dit_batch(DIT_TINY, 3, torch.device("cpu"))

    def run() -> None:
        out = model(x, t, y)
        if training:
            F.mse_loss(out, torch.zeros_like(out)).backward()

    with torch.set_grad_enabled(training):
        counted = _counted(run)
    # flops.py counts a training step as three forwards (6 N per token), as the field does;
    # the two products whose input needs no gradient (the patch convolution of x and the
    # timestep MLP's first layer on the fixed sinusoids) compute only their weight's
    # gradient, one forward's worth less each, which the counter sees.
    d, tokens = DIT_TINY.d_model, (DIT_TINY.input_size // DIT_TINY.patch_size) ** 2
    no_input_gradient = 2 * 3 * (tokens * DIT_TINY.in_channels * DIT_TINY.patch_size**2 * d
                                 + DIT_TINY.d_freq * d)
    assert counted == dit_flops(model, 3, training=training) - training * no_input_gradient


def test_matmul_weights_count_a_tied_table_once_and_split_per_image_weights():
    from addnorm.bench.dit_training import DIT_TINY
    from addnorm.dit.model import DiT

    lm = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 4, bias=False))
    lm[1].weight = nn.Parameter(lm[0].weight.detach().T.contiguous())
    assert matmul_weights(lm) == 64
    tied = nn.Sequential(nn.Linear(4, 4, bias=False), nn.Linear(4, 4, bias=False))
    tied[1].weight = tied[0].weight
    assert matmul_weights(tied) == 16
    dit = DiT(DIT_TINY)
    every = sum(m.weight.numel() for m in dit.modules() if isinstance(m, nn.Linear | nn.Conv2d))
    assert matmul_weights(dit) + matmul_weights(dit, per_image=True) == every
    d = DIT_TINY.d_model  # per image: the timestep MLP, 2 adaLN-Zero layers, the final one
    assert matmul_weights(dit, per_image=True) == 256 * d + d * d + 2 * d * 6 * d + d * 2 * d
