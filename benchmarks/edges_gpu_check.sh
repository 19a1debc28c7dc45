#!/bin/sh
# The GPU checks of the padding-isolation and LayerNorm changes, in one call (~4 minutes on an
# H100; run from the repository root with the project's Python on PATH as python):
#   1. the CUDA tests of tests/test_cuda.py they add: NaN/inf padding reaches no real gradient
#      on every SDPA kernel (fp32/bf16/fp16); float16/bfloat16 LayerNorm with a 1e4 offset is
#      within 4u of float64 through torch's CUDA kernel (which keeps the kernel path);
#   2. attention forward + backward cost of the isolation, eager and torch.compile(fullgraph),
#      this tree against itself with the two isolation steps replaced by the identity,
#      alternating subprocesses, medians (benchmarks/attention_padding.py).
set -e
export PYTHONPATH=src
python -m pytest -q -p no:xdist -p no:cacheprovider tests/test_cuda.py \
    -k "nan_padding or low_precision_layernorm or fully_padded"
SIZES="--batch 16 --length 512 --d-model 1024 --heads 16"
python benchmarks/attention_padding.py --device cuda --against-unisolated --rounds 5 \
    --repeats 20 $SIZES
python benchmarks/attention_padding.py --device cuda --against-unisolated --compile \
    --rounds 3 --repeats 20 $SIZES
