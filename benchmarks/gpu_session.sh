#!/usr/bin/env bash
# One GPU session: addnorm's GPU bench suite with its profiles, then the CUDA tests, in one
# command of under 7 minutes, everything written under $OUT (default ./gpu_out):
#
#   session.log         progress lines with timestamps, every step's exit status
#   bench.md            the tables (addnorm bench's stdout)
#   bench.json          the results, rewritten after each group (a run cut short keeps them;
#                       benchmarks/bench_table.py prints them as tables)
#   profile/summary.txt torch.profiler top-30 tables and memory of the profiled calls
#   profile/traces.tar.gz  their Chrome traces
#   pytest_cuda.txt     tests/test_cuda.py and the CUDA-parametrised tests
#
# Run from the repository root; addnorm need not be installed (PYTHONPATH=src). diffusers
# (the DiT groups' reference) comes from a wheel in benchmarks/wheels/ when it is missing
# (benchmarks/gpu_wheels.sh fetches it on a machine with network; carry that folder).
#
#   bash benchmarks/gpu_session.sh                        # on the GPU machine
#   GPU_SESSION_DEVICE=cpu bash benchmarks/gpu_session.sh # smoke run on the CPU, tiny sizes
#
# Knobs (environment): PYTHON (default python3), BENCH_BUDGET (seconds after which the bench
# starts no new group, default 240), BENCH_TIMEOUT (hard stop of the bench, default 330),
# TEST_TIMEOUT (default 60), BENCH_ONLY (groups to run, default all of the GPU suite, in
# the order gpt2-train gpt2-decode bert dit-infer dit-train dit-b-train), BENCH_FLAGS (more
# flags for addnorm bench, e.g. --no-compile for a quick smoke run).
# Worst case: about 20 s of setup + BENCH_TIMEOUT + TEST_TIMEOUT = 410 s.
# No step stops the session: each is logged with its exit status and the next one runs.

set -u -o pipefail
cd "$(dirname "$0")/.."

OUT=${OUT:-./gpu_out}
DEVICE=${GPU_SESSION_DEVICE:-cuda}
PY=${PYTHON:-python3}
BENCH_BUDGET=${BENCH_BUDGET:-240}
BENCH_TIMEOUT=${BENCH_TIMEOUT:-330}
TEST_TIMEOUT=${TEST_TIMEOUT:-60}
BENCH_ONLY=${BENCH_ONLY:-}
read -r -a EXTRA <<<"${BENCH_FLAGS:-}"

mkdir -p "$OUT/profile"
LOG=$OUT/session.log
: >"$LOG"
START=$SECONDS
say() { printf '[%s +%ds] %s\n' "$(date +%H:%M:%S)" $((SECONDS - START)) "$*" | tee -a "$LOG"; }

export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1

say "gpu_session: device $DEVICE, python $PY, out $OUT"
if [ "$DEVICE" = cuda ]; then
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv \
        2>&1 | tee -a "$LOG"
    SIZE_FLAGS=(--device cuda --quick)
else
    SIZE_FLAGS=(--suite gpu --tiny --threads 1)  # one thread: tiny kernels, a shared CPU
fi
"$PY" -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__)" 2>&1 | tee -a "$LOG"

# diffusers: installed, or from a carried wheel (no dependencies: the image has them)
if ! "$PY" -c "import diffusers" >/dev/null 2>&1; then
    if compgen -G "benchmarks/wheels/diffusers-*.whl" >/dev/null; then
        "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
            --target /tmp/addnorm-site benchmarks/wheels/diffusers-*.whl >>"$LOG" 2>&1
        say "pip install of the diffusers wheel: exit $?"
        export PYTHONPATH="$PYTHONPATH:/tmp/addnorm-site"
    else
        say "diffusers is missing and benchmarks/wheels/ has no wheel: the DiT groups skip"
    fi
fi
"$PY" -c "import diffusers; print('diffusers', diffusers.__version__)" 2>&1 | tail -1 | tee -a "$LOG"

# 1. the bench (its progress lines go to stderr, timestamped, and into the log)
ONLY=()
[ -n "$BENCH_ONLY" ] && read -r -a ONLY <<<"--only $BENCH_ONLY"
say "bench: addnorm bench ${SIZE_FLAGS[*]} ${ONLY[*]-} ${EXTRA[*]-} (budget ${BENCH_BUDGET}s, stop at ${BENCH_TIMEOUT}s)"
timeout -k 10 "$BENCH_TIMEOUT" "$PY" -m addnorm bench "${SIZE_FLAGS[@]}" ${ONLY[@]+"${ONLY[@]}"} \
    ${EXTRA[@]+"${EXTRA[@]}"} \
    --json "$OUT/bench.json" --profile "$OUT/profile" --budget "$BENCH_BUDGET" \
    >"$OUT/bench.md" 2> >(tee -a "$LOG" >&2)
BENCH_EXIT=$?
say "bench: exit $BENCH_EXIT (0 all checks passed, 1 a check or group failed, 124 stopped at ${BENCH_TIMEOUT}s)"
if [ "$BENCH_EXIT" -ne 0 ] && [ -s "$OUT/bench.json" ]; then  # the tables of what was measured
    "$PY" benchmarks/bench_table.py "$OUT/bench.json" >"$OUT/bench.md" 2>>"$LOG"
    say "bench.md rebuilt from bench.json: exit $?"
fi

# 2. the profiles' traces, one archive (at most 8 files come back from a session)
if [ -d "$OUT/profile/traces" ]; then
    tar -czf "$OUT/profile/traces.tar.gz" -C "$OUT/profile" traces && rm -rf "$OUT/profile/traces"
    size=$(stat -c %s "$OUT/profile/traces.tar.gz" 2>/dev/null || echo 0)
    if [ "$size" -gt 15000000 ]; then
        rm -f "$OUT/profile/traces.tar.gz"
        say "traces: ${size} bytes compressed, over what comes back: removed (summary.txt kept)"
    else
        say "traces: $OUT/profile/traces.tar.gz, ${size} bytes"
    fi
fi

# 3. the CUDA tests: tests/test_cuda.py and the tests parametrised over devices ("cuda" ids)
say "tests: pytest -k cuda"
timeout -k 5 "$TEST_TIMEOUT" "$PY" -m pytest -q -p no:cacheprovider -k cuda \
    tests/test_cuda.py tests/test_norms.py tests/test_residual.py tests/test_feedforward.py \
    tests/test_timestep.py tests/test_rotary.py tests/test_encodings.py \
    tests/generation/test_loop.py tests/bench/test_gpu_suite.py \
    >"$OUT/pytest_cuda.txt" 2>&1
TEST_EXIT=$?
tail -3 "$OUT/pytest_cuda.txt" | tee -a "$LOG"
say "tests: exit $TEST_EXIT (0 passed, 5 none selected, 124 stopped at ${TEST_TIMEOUT}s)"

say "gpu_session: done in $((SECONDS - START)) s; bench exit $BENCH_EXIT, tests exit $TEST_EXIT"
ls -la "$OUT" "$OUT/profile" >>"$LOG" 2>&1
exit 0
