#!/usr/bin/env bash
# Issue 14 on an H200 host in one call (GPU time is scarce):
#   1. at once: the GPU tests of the kernels and entry points (three pytest processes),
#      RL-Kernel's extension build, and torch.compile's graphs for the benchmark compiled
#      into inductor's cache (gate_residual_matrix.ops.gate_residual.bench --precompile);
#   2. then the benchmark alone on the GPU (gate_residual_matrix.ops.gate_residual.bench, every peer, host breakdown);
#   3. everything into one tarball, OUT/issue14.tgz (only a few files come back).
# Usage, from the repository root on the GPU machine:  bash scripts/issue14_h200.sh OUT
# Runs the commit in .carry/issue14-src.tgz when there (made here by
#   git archive --format=tar.gz -o .carry/issue14-src.tgz HEAD && git rev-parse HEAD > .carry/issue14-commit
# so the reports name exactly that commit), else the tree as it is. STEPS (default
# "tests bench") picks steps; TESTS_TIMEOUT (default 150 s) bounds each test process and the
# precompile, BENCH_TIMEOUT (default 240 s) the benchmark, which keeps the cases it finished.
set -uo pipefail
repo=$PWD
out=$(realpath -m "${1:-${OUT:-artifacts}}")
mkdir -p "$out/logs" "$out/bench" "$repo/build"
src=$repo
if [ -f .carry/issue14-src.tgz ]; then
  src=/tmp/issue14-src; rm -rf "$src"; mkdir -p "$src"
  tar -xzf .carry/issue14-src.tgz -C "$src" && cp -r .carry .whl "$src"/ 2>/dev/null
  export GATE_RESIDUAL_COMMIT=$(cat .carry/issue14-commit) GATE_RESIDUAL_DIRTY=0
  echo "source: commit $GATE_RESIDUAL_COMMIT (archive)"
fi
cd "$src" || exit 2
if [ -z "${NO_WHEELS:-}" ] && ls .whl/*.whl >/dev/null 2>&1; then  # numpy<2.5 for numba-cuda
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=$src:${PYTHONPATH:-} PYTHONUNBUFFERED=1
# compilation caches in the kept build/ folder of the tree the tool copied
export TORCHINDUCTOR_CACHE_DIR=$repo/build/inductor TRITON_CACHE_DIR=$repo/build/triton
export RLK_BUILD_DIR=$repo/build/rl-kernel
t0=$(date +%s)
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
  python3 -c "import torch, numba, numpy, numba_cuda, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'numba', numba.__version__, 'numba-cuda', numba_cuda.__version__, 'numpy', numpy.__version__)"
  nproc; uptime; } > "$out/logs/env.log" 2>&1
rc=0
for step in ${STEPS:-tests bench}; do
  echo "=== $step at $(( $(date +%s) - t0 )) s"
  case $step in
    tests)
      PYTHONPATH=$src/.carry/rl-kernel-h3:$PYTHONPATH python3 -c "import time; t = time.time(); from rl_engine.kernels.ops import base; print('rl_engine._C built:', base._EXT_AVAILABLE, getattr(base, '_EXT_ERROR', None), f'{time.time() - t:.0f} s')" > "$out/logs/rlbuild.log" 2>&1 &
      limit="timeout -s TERM ${TESTS_TIMEOUT:-150}"
      $limit python3 -m gate_residual_matrix.ops.gate_residual.bench --precompile > "$out/logs/precompile.log" 2>&1 &
      pytest="$limit python3 -m pytest -q -m gpu -p no:cacheprovider"
      $pytest tests/test_kernels_gpu.py -k "not default_index_check" > "$out/logs/gpu-kernels.log" 2>&1 &
      $pytest tests/test_kernels_gpu.py -k default_index_check > "$out/logs/gpu-device-assert.log" 2>&1 &
      $pytest tests/test_op_input.py > "$out/logs/gpu-op-input.log" 2>&1 &
      $limit python3 scripts/sass_report.py > "$out/logs/sass-report.txt" 2>&1 &
      wait
      for f in gpu-kernels gpu-device-assert gpu-op-input; do
        echo "$f: $(tail -n 1 "$out/logs/$f.log")"
        grep -q " passed" "$out/logs/$f.log" && ! grep -qE "[0-9]+ (failed|error)" "$out/logs/$f.log" || rc=1
      done
      tail -n 2 "$out/logs/rlbuild.log"; tail -n 3 "$out/logs/precompile.log"
      grep -E "regs=" "$out/logs/sass-report.txt" | cut -c1-110 ;;
    bench)
      timeout -s TERM "${BENCH_TIMEOUT:-240}" python3 -m gate_residual_matrix.ops.gate_residual.bench --out "$out/bench" \
        ${BENCH_ARGS:-} > "$out/logs/bench.log" 2>&1 || rc=1
      grep -E "^\| bfloat16 \| (1|32768) \|" "$out/bench/"*.md | head -20 ;;
    host)
      python3 -m gate_residual_matrix.ops.gate_residual.bench --host > "$out/logs/host.log" 2>&1 || rc=1
      cat "$out/logs/host.log" ;;
  esac
done
echo "all steps: $(( $(date +%s) - t0 )) s, rc $rc"
tar czf "$out/issue14.tgz" -C "$out" logs bench && rm -rf "$out/logs" "$out/bench"
exit $rc
