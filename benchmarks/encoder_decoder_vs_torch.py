"""addnorm's encoder-decoder body vs nn.Transformer, same weights, same run, same machine.

Times a training step (forward + backward) of `addnorm.EncoderDecoder` and of the
`nn.Transformer` that `addnorm.to_torch` builds from it (so both hold identical weights), and
greedy cached decoding of `TransformerLM`. Prints medians and the ratio; not part of pytest.

    .venv/bin/python benchmarks/encoder_decoder_vs_torch.py [--device cuda] [--threads 1]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import torch

import addnorm
from addnorm.transformer.config import LayerConfig


def _median_ms(fn, *, warmup: int, repeats: int, device: torch.device) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def train_step_ratio(args: argparse.Namespace, device: torch.device) -> None:
    torch.manual_seed(0)
    d, h, n, f, b, length = 256, 4, 3, 1024, 32, 64
    encoder = addnorm.Encoder(LayerConfig(d, h, f), n, final_norm=True)
    decoder = addnorm.Decoder(LayerConfig(d, h, f), n, final_norm=True)
    ours = addnorm.EncoderDecoder(encoder, decoder).to(device)
    theirs = addnorm.to_torch(ours).to(device)
    src = torch.randn(b, length, d, device=device)
    tgt = torch.randn(b, length, d, device=device)
    causal = torch.nn.Transformer.generate_square_subsequent_mask(length, device=device)

    def step_ours() -> None:
        ours(src, tgt).sum().backward()

    def step_theirs() -> None:
        theirs(src, tgt, tgt_mask=causal, tgt_is_causal=True).sum().backward()

    kw = dict(warmup=args.warmup, repeats=args.repeats, device=device)
    t_ours, t_theirs = _median_ms(step_ours, **kw), _median_ms(step_theirs, **kw)
    print(f"train step (D={d}, H={h}, {n}+{n} layers, F={f}, B={b}, L={length}):")
    print(f"  addnorm {t_ours:.1f} ms   nn.Transformer {t_theirs:.1f} ms   "
          f"ratio {t_ours / t_theirs:.2f} (< 1 is faster)")


def decode_rate(args: argparse.Namespace, device: torch.device) -> None:
    for positions in ("sinusoidal", "rotary"):
        cfg = dataclasses.replace(addnorm.PRESETS["lm-small"], positions=positions, dropout=0.0)
        torch.manual_seed(0)
        model = addnorm.TransformerLM(cfg).eval().to(device)
        prompt = torch.randint(3, cfg.vocab_size, (1, 16), device=device)

        config = dataclasses.replace(model.generation_config, max_new_tokens=100, eos_id=None)

        def run(model=model, prompt=prompt, config=config) -> None:
            model.generate(prompt, config)

        ms = _median_ms(run, warmup=1, repeats=max(3, args.repeats // 3), device=device)
        print(f"lm-small greedy decode, {positions}: {100 / (ms / 1e3):.0f} tokens/s (batch 1)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.backends.mha.set_fastpath_enabled(False)  # compare the same math, not nested tensors
    device = torch.device(args.device)
    train_step_ratio(args, device)
    decode_rate(args, device)


if __name__ == "__main__":
    main()
