#!/usr/bin/env bash
# Build the native core against a second torch version and run the tests that exercise it (README: "A second torch version").
#
#   .ci/second_torch.sh                 # torch 2.14.1 (default) in /tmp/torchtpu-lab-torch2.14.1
#   TORCH_VERSION=2.11.0 .ci/second_torch.sh
#
# Makes a separate virtual environment (VENV, default /tmp/torchtpu-lab-torch$TORCH_VERSION), installs that torch,
# JAX and the package (editable, --no-build-isolation so nothing is built against another torch), builds the core
# into a cache of its own (TORCHTPU_LAB_NATIVE_DIR under the venv, so the first-build time is measured every run)
# and runs tests/test_native_core.py, tests/test_multichip.py and tests/test_device.py. A CUDA build of torch
# works: the tests run on XLA:CPU and never touch CUDA. Set KEEP_VENV=0 to delete the venv afterwards.
set -euo pipefail
cd "$(dirname "$0")/.."
TORCH_VERSION=${TORCH_VERSION:-2.14.1}
PYTHON=${PYTHON:-python3}
VENV=${VENV:-/tmp/torchtpu-lab-torch$TORCH_VERSION}
PY=$VENV/bin/python
TESTS=${TESTS:-tests/test_native_core.py tests/test_multichip.py tests/test_device.py}

export TORCHTPU_LAB_NATIVE_DIR=${TORCHTPU_LAB_NATIVE_DIR:-$VENV/native-cache}
export TORCHTPU_LAB_PLATFORM=cpu
step() { printf '\n== %s (%s)\n' "$1" "$(date -u +%H:%M:%S)"; }

step "venv $VENV"
[ -x "$PY" ] || "$PYTHON" -m venv "$VENV"
"$PY" -m pip install -q --upgrade pip
step "torch==$TORCH_VERSION, JAX, build tools"
"$PY" -m pip install -q "torch==$TORCH_VERSION" jax jaxlib numpy ml_dtypes hatchling editables \
  pytest pytest-timeout expecttest hypothesis ipython
step "the package (editable, --no-build-isolation)"
"$PY" -m pip install -q --no-build-isolation --no-deps -e .
TORCH_DEVICE_BACKEND_AUTOLOAD=0 "$PY" -c 'import torch, jax; print("torch", torch.__version__, "| jax", jax.__version__)'
step "native core build"
start=$(date +%s)
"$PY" -m torchtpu_lab.native
echo "first build + import: $(( $(date +%s) - start )) s"

step "tests: $TESTS"
status=0
# shellcheck disable=SC2086
"$PY" -m pytest -q -p no:cacheprovider $TESTS || status=$?
step "done (pytest exit $status)"
if [ "${KEEP_VENV:-1}" = 0 ]; then rm -rf "$VENV"; fi
exit $status
