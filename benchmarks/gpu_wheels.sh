#!/usr/bin/env bash
# Fetch what benchmarks/gpu_session.sh installs on a GPU machine that has no network: the
# diffusers wheel (pure Python; its dependencies are on the GPU image), the version installed
# here, into benchmarks/wheels/ (git-ignored: name that folder in the device call's carry).
#
#   PYTHON=.venv/bin/python bash benchmarks/gpu_wheels.sh
set -eu
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
version=$("$PY" -c "import diffusers; print(diffusers.__version__)" 2>/dev/null || true)
mkdir -p benchmarks/wheels
"$PY" -m pip download --no-deps --only-binary=:all: -d benchmarks/wheels "diffusers${version:+==$version}"
ls -la benchmarks/wheels
