"""One GPU run that checks what the CPU could not: the perf branch's CUDA paths, in ~2 minutes.

1. Compiled decoding, GPT-2 small widths (random weights, pad_id None, learned positions),
   prompt 32, 128 new tokens: eager and ``compile=True`` (CUDA graphs,
   ``mode="reduce-overhead"``) in bf16 at batch 1 and 16, ms per token (median of warm
   calls, each call synchronised); whether inductor skipped CUDA graphs
   (``cudagraph_skips``), how many graphs dynamo built; and, in float32 at batch 1, whether
   the compiled tokens equal the eager ones.
2. Unpadded encoder, BERT-base widths, B 64 x T 128 with rows of 38-128 real tokens (35%
   padding), bf16, eval: ``unpad=True`` against the padded layout (the relative error of the
   real tokens' hidden states, and the time of each), and how many calls reached torch's
   variable-length flash kernel (one per layer expected).
3. A compiled GPT-2-small training step (B 8 x T 1024, bf16 autocast, fused AdamW): its
   peak memory and time, and that its SDPA calls ran without a mask (is_causal).

    python benchmarks/perf_gpu_check.py                  # on a GPU
    python benchmarks/perf_gpu_check.py --device cpu --tiny   # smoke test, tiny sizes

Prints one JSON object at the end (also to --json FILE). Not part of pytest; ``addnorm bench
--device cuda`` is the side-by-side timing with the references.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time

import torch
import torch.nn.functional as F
from torch._dynamo.utils import counters

import addnorm
import addnorm.varlen_attention as varlen


def synced(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def median_seconds(fn, device: torch.device, repeats: int) -> float:
    fn()
    synced(device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        synced(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def gpt2_config(tiny: bool) -> addnorm.LMConfig:
    widths = dict(vocab_size=96, d_model=32, n_heads=4, n_layers=2, d_ff=128, max_len=192) \
        if tiny else dict(vocab_size=50257, d_model=768, n_heads=12, n_layers=12, d_ff=3072,
                          max_len=1024)
    return addnorm.LMConfig(**widths, dropout=0.0, activation="gelu_tanh", norm_position="pre",
                            final_norm=True, position_encoding="learned", embed_scale="none",
                            tie_output=True, pad_id=None, bos_id=None, eos_id=None)


def check_decoding(device: torch.device, tiny: bool, repeats: int) -> dict:
    cfg = gpt2_config(tiny)
    torch.manual_seed(0)
    model = addnorm.TransformerLM(cfg).to(device).eval()
    new = 16 if tiny else 128
    out: dict = {}
    # float32 batch 1: the tokens must be identical; bf16: timed (tokens compared as a note)
    for dtype, batch in ((torch.float32, 1), (torch.bfloat16, 1), (torch.bfloat16, 16)):
        model.to(dtype)
        prompt = torch.randint(0, cfg.vocab_size, (batch, 32), device=device)
        config = dataclasses.replace(model.generation_config, max_new_tokens=new)
        compiled = dataclasses.replace(config, compile=True)
        counters.clear()
        tokens_compiled = model.generate(prompt, compiled)  # compiles, records the graph
        tokens_eager = model.generate(prompt, config)
        case = f"{str(dtype).removeprefix('torch.')} batch {batch}"
        result = {"tokens_identical": bool(torch.equal(tokens_compiled, tokens_eager)),
                  "cudagraph_skips": dict(counters["inductor"]).get("cudagraph_skips", 0),
                  "unique_graphs": counters["stats"]["unique_graphs"]}
        if dtype == torch.bfloat16:
            eager_s = median_seconds(lambda p=prompt, c=config: model.generate(p, c),
                                     device, repeats)
            compiled_s = median_seconds(lambda p=prompt, c=compiled: model.generate(p, c),
                                        device, repeats)
            result |= {"eager_ms_per_token": 1e3 * eager_s / new,
                       "compiled_ms_per_token": 1e3 * compiled_s / new}
        out[case] = result
    return out


def check_unpadded_encoder(device: torch.device, tiny: bool, repeats: int) -> dict:
    cfg = addnorm.EncoderConfig(
        vocab_size=30522, d_model=768, n_heads=12, n_layers=12, d_ff=3072, activation="gelu",
        norm_eps=1e-12, max_len=512, n_token_types=2, embed_norm=True, dropout=0.0, pad_id=0)
    batch, length, shortest = 64, 128, 38
    if tiny:
        cfg = dataclasses.replace(cfg, vocab_size=64, d_model=32, n_heads=4, n_layers=2, d_ff=64)
        batch, length, shortest = 4, 16, 5
    torch.manual_seed(0)
    padded = addnorm.EncoderModel(cfg).to(device).eval()
    unpadded = addnorm.EncoderModel(dataclasses.replace(cfg, unpad=True)).to(device).eval()
    unpadded.load_state_dict(padded.state_dict())
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(shortest, length + 1, (batch,), generator=gen)
    lengths[0] = length
    padding = torch.arange(length)[None, :] >= lengths[:, None]
    ids = torch.randint(1, cfg.vocab_size, (batch, length), generator=gen).masked_fill(padding, 0)
    ids, padding = ids.to(device), padding.to(device)
    real = ~padding
    flash_calls = 0
    kernel = varlen.flash_varlen_kernel

    def counted(*args):
        nonlocal flash_calls
        flash_calls += 1
        assert kernel is not None
        return kernel(*args)

    out: dict = {}
    for dtype in (torch.float32, torch.bfloat16):
        padded.to(dtype), unpadded.to(dtype)
        varlen.flash_varlen_kernel = counted
        flash_calls = 0
        with torch.no_grad():
            want = padded(ids, padding_mask=padding)[real].float()
            got = unpadded(ids, padding_mask=padding)[real].float()
            calls = flash_calls
            result = {"relative_error": ((got - want).norm() / want.norm()).item(),
                      "flash_varlen_calls": calls, "layers": cfg.n_layers}
            if dtype == torch.bfloat16:
                result |= {
                    "padded_ms": 1e3 * median_seconds(
                        lambda: padded(ids, padding_mask=padding), device, repeats),
                    "unpadded_ms": 1e3 * median_seconds(
                        lambda: unpadded(ids, padding_mask=padding), device, repeats),
                    "real_tokens": int(real.sum())}
        varlen.flash_varlen_kernel = kernel
        out[str(dtype).removeprefix("torch.")] = result
    return out


def check_training_step(device: torch.device, tiny: bool, repeats: int) -> dict:
    cfg = gpt2_config(tiny)
    torch.manual_seed(0)
    model = addnorm.TransformerLM(cfg).to(device).train()
    batch, length = (2, 64) if tiny else (8, 1024)
    ids = torch.randint(0, cfg.vocab_size, (batch, length + 1), device=device)
    x, y = ids[:, :-1], ids[:, 1:].flatten()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
    loss_fn = torch.compile(lambda: F.cross_entropy(model(x).flatten(0, 1).float(), y),
                            fullgraph=True)
    masks: list[bool] = []
    sdpa = F.scaled_dot_product_attention

    def watched(*args, **kwargs):
        masks.append(kwargs.get("attn_mask") is not None or len(args) > 3)
        return sdpa(*args, **kwargs)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, torch.bfloat16):
            loss = loss_fn()
        loss.backward()
        optimizer.step()

    F.scaled_dot_product_attention = watched  # seen while dynamo traces the first call
    try:
        start = time.perf_counter()
        step()
        synced(device)
        compile_s = time.perf_counter() - start
    finally:
        F.scaled_dot_product_attention = sdpa
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    step_s = median_seconds(step, device, repeats)
    peak = torch.cuda.max_memory_allocated() if device.type == "cuda" else None
    return {"compile_s": compile_s, "step_ms": 1e3 * step_s,
            "tokens_per_s": batch * length / step_s, "peak_memory_gib": None if peak is None
            else peak / 2**30, "sdpa_calls_traced": len(masks),
            "sdpa_calls_with_a_mask": sum(masks)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true", help="tiny sizes (a CPU smoke test)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", help="also write the result here")
    parser.add_argument("--only", nargs="*", default=["decoding", "unpadded_encoder",
                                                      "training_step"], help="checks to run")
    args = parser.parse_args()
    device = torch.device(args.device)
    result = {"torch": torch.__version__, "device": torch.cuda.get_device_name()
              if device.type == "cuda" else "cpu"}
    checks = {"decoding": check_decoding, "unpadded_encoder": check_unpadded_encoder,
              "training_step": check_training_step}
    for name in args.only:
        check = checks[name]
        start = time.perf_counter()
        try:
            result[name] = check(device, args.tiny, args.repeats)
        except Exception as error:  # report and go on: one GPU run for all three
            result[name] = {"error": f"{type(error).__name__}: {error}"}
        result[name]["seconds"] = time.perf_counter() - start
        print(name, json.dumps(result[name]), flush=True)
    print(json.dumps(result, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
