#!/usr/bin/env bash
# The GPU-host procedure (`python -m gate_residual_matrix gpu-host`, README "On a GPU machine")
# on a host without a package index, from the copy's root:  bash scripts/gpu_host.sh [OPTIONS]
# Here first: wheels in .whl/ are installed to /tmp/site (before Python imports pydantic and
# the rest; not for --stamp, which runs where the checkout is), and the compilation caches
# (Python's bytecode included) go to the copy's build/ (kept between calls where the copy is
# kept).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" != --stamp ] && ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} PATH=/tmp/site/bin:$PATH
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
# An image that sets PYTHONDONTWRITEBYTECODE and ships no bytecode makes every process compile
# each module it imports from source again (torch's dynamo and inductor: seconds per process,
# and a run starts hundreds): the bytecode goes to the copy's build/ instead, written once.
unset PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX=${PYTHONPYCACHEPREFIX:-$PWD/build/pycache}
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-$PWD/build/inductor}
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-$PWD/build/triton}
export RLK_BUILD_DIR=${RLK_BUILD_DIR:-$PWD/build/rl-kernel}
export GATE_RESIDUAL_CUBIN_CACHE=${GATE_RESIDUAL_CUBIN_CACHE:-$PWD/build/cubin}
export GATE_RESIDUAL_INPUT_CACHE=${GATE_RESIDUAL_INPUT_CACHE:-$PWD/build/inputs}
export GATE_RESIDUAL_PROGRESS=${GATE_RESIDUAL_PROGRESS:-plain}
exec python3 -m gate_residual_matrix gpu-host "$@"
