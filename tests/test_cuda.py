"""The same models on CUDA as on the CPU: skipped where no GPU is present.

The CPU run is the oracle: every check below compares a CUDA result with the CPU result of
the same module and weights, or restates an invariant (no NaN for fully padded rows,
cached == uncached, batched == alone) on the GPU's own attention kernels.
"""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from tolerances import FLOAT32_MODEL, FLOAT64_EXACT, LOW_PRECISION

import addnorm

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

CUDA = torch.device("cuda")


def _tiny_transformer(**changes) -> addnorm.Transformer:
    cfg = dataclasses.replace(
        addnorm.PRESETS["tiny"], src_vocab_size=20, tgt_vocab_size=20, dropout=0.0, **changes
    )
    torch.manual_seed(0)
    return addnorm.Transformer(cfg).eval()


def _ids(batch: int, length: int, vocab: int, *, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (batch, length), generator=gen)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_fully_padded_rows_give_zeros_on_every_cuda_kernel(dtype):
    # Invariant (docs/design.md): a row that sees no key returns zeros, never NaN, whatever
    # SDPA backend (flash, memory-efficient, math) the dtype selects.
    torch.manual_seed(0)
    mha = addnorm.MultiHeadAttention(64, 4).to(CUDA, dtype)
    x = torch.randn(3, 7, 64, device=CUDA, dtype=dtype)
    padding = torch.zeros(3, 7, dtype=torch.bool, device=CUDA)
    padding[1] = True  # every key of row 1 is padding
    out = mha(x, padding_mask=padding)
    assert torch.isfinite(out).all()
    assert torch.equal(out[1], torch.zeros_like(out[1]))


def test_attention_on_cuda_equals_the_cpu_result():
    # Oracle: the same module and weights on the CPU in float64.
    torch.manual_seed(1)
    mha = addnorm.MultiHeadAttention(64, 8).double()
    x = torch.randn(2, 9, 64, dtype=torch.float64)
    padding = torch.tensor([[False] * 9, [False] * 5 + [True] * 4])
    expected = mha(x, padding_mask=padding, causal=True)
    got = copy.deepcopy(mha).to(CUDA, torch.float32)(
        x.to(CUDA, torch.float32), padding_mask=padding.to(CUDA), causal=True
    )
    # A float32 result against a float64 oracle: the float32 computation's own error
    # (8.9e-7 for the CPU's float32 on |y| <= 3.6), which FLOAT32_MODEL bounds on any device.
    torch.testing.assert_close(got.cpu().double(), expected, **FLOAT32_MODEL)


def test_transformer_logits_on_cuda_equal_the_cpu_logits():
    model = _tiny_transformer()
    src, tgt = _ids(3, 8, 20, seed=2), _ids(3, 6, 20, seed=3)
    src[2, 5:] = model.cfg.pad_id
    with torch.no_grad():
        expected = model(src, tgt)
        got = copy.deepcopy(model).to(CUDA)(src.to(CUDA), tgt.to(CUDA))
    # Two float32 runs of one small model (D = 64, 2 + 2 layers): each is within 1.1e-6 of
    # the float64 logits on the CPU (|y| <= 4.2), so FLOAT32_MODEL holds with 10x to spare.
    torch.testing.assert_close(got.cpu(), expected, **FLOAT32_MODEL)


@pytest.mark.parametrize("positions", ["sinusoidal", "learned", "rotary"])
def test_cached_greedy_decoding_on_cuda_equals_the_cpu_tokens(positions):
    # Oracle: the CPU decode of the same weights; batched equals alone on the GPU too.
    model = _tiny_transformer(position_encoding=positions)
    src = _ids(3, 8, 20, seed=4)
    src[1, 4:] = model.cfg.pad_id
    config = dataclasses.replace(model.generation_config, max_new_tokens=10, eos_id=None)
    expected = model.generate(src, config)  # top-2 logit gaps >= 0.67 on the CPU, >> 1e-5
    gpu = copy.deepcopy(model).to(CUDA)
    got = gpu.generate(src.to(CUDA), config).cpu()
    assert torch.equal(got, expected)
    alone = gpu.generate(src[1:2, :4].to(CUDA), config).cpu()
    assert torch.equal(alone, expected[1:2])


def test_lm_left_padded_batch_on_cuda_decodes_like_each_prompt_alone():
    cfg = dataclasses.replace(addnorm.PRESETS["lm-tiny"], vocab_size=30, dropout=0.0)
    torch.manual_seed(5)
    model = addnorm.TransformerLM(cfg).eval().to(CUDA)
    short, long = _ids(1, 3, 30, seed=6), _ids(1, 6, 30, seed=7)
    batch = torch.full((2, 6), cfg.pad_id)
    batch[0, 3:], batch[1] = short[0], long[0]
    padding = batch == cfg.pad_id
    config = dataclasses.replace(model.generation_config, max_new_tokens=8, eos_id=None)
    both = model.generate(batch.to(CUDA), config, padding_mask=padding.to(CUDA)).cpu()
    for row, prompt in enumerate((short, long)):
        alone = model.generate(prompt.to(CUDA), config).cpu()
        assert torch.equal(both[row : row + 1], alone)


def test_masked_batchnorm_on_cuda_equals_the_cpu_result():
    torch.manual_seed(8)
    x = torch.randn(4, 6, 16, dtype=torch.float64)
    padding = torch.rand(4, 6) < 0.3
    padding[:, 0] = False
    cpu = addnorm.BatchNorm(16).double()
    gpu = copy.deepcopy(cpu).to(CUDA)
    # float64 reductions over <= 24 tokens in CUDA's order: ~1e-15 apart.
    out = gpu(x.to(CUDA), padding.to(CUDA)).cpu()
    torch.testing.assert_close(out, cpu(x, padding), **FLOAT64_EXACT)
    torch.testing.assert_close(gpu.running_var.cpu(), cpu.running_var, **FLOAT64_EXACT)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("offset", [0.0, 1e2, 1e4, -3e4])
def test_low_precision_layernorm_on_cuda_takes_float32_statistics(offset, dtype):
    """On CUDA LayerNorm hands float16 / bfloat16 to torch's kernel, whose statistics are
    float32 and centred: held to nn.LayerNorm in float64 on the same rounded input, with the
    tolerance tests/test_norms.py derives for the CPU path (LOW_PRECISION, 4u)."""
    gen = torch.Generator().manual_seed(9)
    norm = addnorm.LayerNorm(64)
    with torch.no_grad():
        for p in norm.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.5 + 1.0)
    ref = torch.nn.LayerNorm(64).double()
    ref.load_state_dict(norm.state_dict())
    for scale in (1e-2, 1.0, 1e2):
        x = (torch.randn(8, 16, 64, generator=gen) * scale + offset).to(dtype)
        y = copy.deepcopy(norm).to(CUDA, dtype)(x.to(CUDA))
        assert y.dtype == dtype
        torch.testing.assert_close(y.cpu().double(), ref(x.double()), **LOW_PRECISION[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_nan_padding_reaches_no_real_gradient_on_every_cuda_kernel(dtype):
    # The property tests/test_padding_numerics.py checks on the CPU, on the GPU's SDPA
    # kernels (flash, memory-efficient, math by dtype): real outputs and real inputs'
    # gradients are the clean run's, bitwise, with NaN or inf in the padding.
    torch.manual_seed(0)
    mha = addnorm.MultiHeadAttention(64, 4).to(CUDA, dtype)
    padding = torch.zeros(3, 7, dtype=torch.bool, device=CUDA)
    padding[0, 4:], padding[2, 1:] = True, True
    x = torch.randn(3, 7, 64, device=CUDA, dtype=dtype)
    weights = torch.randn(3, 7, 64, device=CUDA, dtype=dtype)
    runs = []
    for fill in (0.0, float("nan"), float("inf")):
        inp = x.masked_fill(padding[..., None], fill).requires_grad_()
        out = mha(inp, padding_mask=padding)
        torch.where(padding[..., None], 0.0, out * weights).sum().backward()
        runs.append((out.detach()[~padding], inp.grad[~padding]))
        mha.zero_grad()
    for out, grad in runs[1:]:
        assert torch.equal(out, runs[0][0]) and torch.equal(grad, runs[0][1])
        assert torch.isfinite(grad).all()
