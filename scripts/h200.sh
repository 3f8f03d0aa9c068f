#!/usr/bin/env bash
# Everything this project needs from a GPU machine, in one call (an offline H200 host):
# GPU tests, the default matrix on target cuda, the SASS/register report and the benchmark.
# Usage (from the repository root on the GPU machine):  bash scripts/h200.sh [OUT_DIR]
# STEPS picks steps (default: env smoke tests sass libsmoke matrix bench profile); MATRIX_ARGS
# the cells of step matrix. The host stack's six modes in one 10-minute call (572 s at b30c1b3):
#   STEPS="env modes" bash scripts/h200.sh $OUT
# Wheels in .whl/ (numpy<2.5 for numba-cuda, jsonschema, pydantic) are installed to /tmp/site
# when present, since that machine has no package index.
set -uo pipefail
# The GPU host's copy of the tree carries no commit of ours: `bash scripts/h200.sh
# --stamp` (here, on a clean checkout) records HEAD and a digest of the source files in
# .carry/source.json; there, the reports name that commit only if the digest still matches.
source_digest() {
  find gate_residual_matrix scripts tests containers docs noxfile.py matrix*.yaml pyproject.toml \
    README.md -type f -not -path '*/__pycache__/*' -not -name '*.pyc' -print0 2>/dev/null \
    | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -c1-64
}
if [ "${1:-}" = "--stamp" ]; then
  [ -z "$(git status --porcelain --untracked-files=no -- . ':(exclude)reports')" ] \
    || { echo "h200.sh --stamp: commit first (the tree has changes)" >&2; exit 2; }
  mkdir -p .carry
  printf '{"commit": "%s", "digest": "%s"}\n' "$(git rev-parse HEAD)" "$(source_digest)" \
    > .carry/source.json
  cat .carry/source.json; exit 0
fi
if [ -f .carry/source.json ]; then
  stamped=$(python3 -c 'import json; d = json.load(open(".carry/source.json")); print(d["commit"], d["digest"])')
  if [ "${stamped#* }" = "$(source_digest)" ]; then
    export GATE_RESIDUAL_COMMIT=${stamped%% *} GATE_RESIDUAL_DIRTY=0
    echo "source: commit $GATE_RESIDUAL_COMMIT (digest of the source files matches)"
  else
    echo "source: .carry/source.json does not match these files: reports say what git says"
  fi
fi
out=${1:-${OUT:-artifacts}}
mkdir -p "$out"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:${PYTHONPATH:-} PATH=/tmp/site/bin:$PATH
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1
# Compilation caches inside the (git-ignored) build/ folder: a host that keeps the tree keeps ignored
# build outputs between calls, so later calls reuse inductor's, Triton's and RL-Kernel's.
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-$PWD/build/inductor}
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-$PWD/build/triton}
export RLK_BUILD_DIR=${RLK_BUILD_DIR:-$PWD/build/rl-kernel}
export GATE_RESIDUAL_CUBIN_CACHE=${GATE_RESIDUAL_CUBIN_CACHE:-$PWD/build/cubin}
export GATE_RESIDUAL_PROGRESS=${GATE_RESIDUAL_PROGRESS:-plain}
steps=${STEPS:-"env smoke tests sass libsmoke matrix bench profile"}
rc=0
for step in $steps; do
  echo "=== $step"
  case $step in
    env)    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
            python3 -c "import torch, numba, numpy, numba_cuda; print('torch', torch.__version__, 'numba', numba.__version__, 'numba-cuda', numba_cuda.__version__, 'numpy', numpy.__version__)" ;;
    smoke)  # the cuLaunchKernel path first: if the driver refuses it, use cuda.core.launch
            python3 -c "import torch; from gate_residual_matrix.kernels.gate_residual import gate_residual_forward as f; x = torch.ones(3, 5376, device='cuda', dtype=torch.bfloat16); i = torch.zeros(3, dtype=torch.int64, device='cuda'); assert torch.equal(f(x, x[:1], x, i), x + x[:1] * x); print('launch ok')" \
              || { export GATE_RESIDUAL_LAUNCH=core; echo "cuLaunchKernel failed: GATE_RESIDUAL_LAUNCH=core"; rc=1; } ;;
    tests)  python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_kernels_gpu.py tests/test_kernels_gpu_launch.py ${GPU_TESTS_ARGS:-} 2>&1 | tee "$out/gpu-tests.log" | tail -25 || rc=1 ;;
    rlbuild) # RL-Kernel's extension, built once into $RLK_BUILD_DIR (an install step, ~80 s)
            PYTHONPATH=$PWD/.carry/rl-kernel-h3:$PYTHONPATH python3 -c "import time; t = time.time(); from rl_engine.kernels.ops import base; print('rl_engine._C built:', base._EXT_AVAILABLE, getattr(base, '_EXT_ERROR', None), f'{time.time() - t:.0f} s')" 2>&1 | tail -3 ;;
    libsmoke) # library rows (issue 13): kernel-only loads from .carry/, RL-Kernel's build
            python3 scripts/library_smoke.py 2>&1 | tee "$out/library-smoke.log" | tail -30 || rc=1 ;;
    sass)   python3 scripts/sass_report.py > "$out/sass-report.txt" 2>&1 || rc=1; tail -30 "$out/sass-report.txt" ;;
    matrix) # one tarball: only a few files come back (six modes make six cuda reports)
            # SIGTERM before the host's own time limit: the runner keeps a stopped cell's
            # finished cases (status partial) and the next call resumes it.
            timer=""; [ -x /usr/bin/time ] && timer="/usr/bin/time -v"
            $timer timeout -s TERM "${MATRIX_TIMEOUT:-540}" python3 -m gate_residual_matrix.runner matrix ${MATRIX_ARGS:---stack host --target cuda} 2>&1 | tee "$out/matrix.log" | tail -60 || rc=1
            tar czf "$out/matrix-reports.tgz" reports/*-cuda.json reports/README.md reports/index.html reports/summary.* reports/*.svg 2>/dev/null ;;
    modes)  # MODES (default: the host stack's six) on this one GPU, in one command:
            # 1. one pool of compile workers fills inductor's caches for every mode
            #    (python -m gate_residual_matrix.runner.cell.precompile: the first mode, then the rest, whose graphs
            #    reuse its Triton kernels), while RL-Kernel's extension builds beside it;
            # 2. the cells one after another (MODE_JOBS at a time, default 1), each cell as
            #    several processes (runner/backends/shards.py: one per dtype group of its cases, up to
            #    one per 2 CPUs; GATE_RESIDUAL_SHARDS sets it), sharing the GPU under
            #    contract/gpu_lock.py: each case's timing loops alone on the GPU, every other
            #    stretch of GPU work (one call and its checks) shared. No cell compiles ahead
            #    again (the stamps) and none waits on the build while holding the lock.
            modes=${MODES:-"plain deterministic tf32 inference vllm_batch_invariant sglang_ieee"}
            # reports outside $out, archived after every cell: only a few files come back,
            # and a call stopped at its limit returned none of a run's reports (2026-12-01)
            reports=${MODE_REPORTS:-$PWD/build/mode-reports}; mkdir -p "$reports" "$PWD/build"
            # partial reports of an earlier call (same source): their cells run only what is missing
            [ -d .carry/resume ] && cp .carry/resume/*.json "$reports"/ 2>/dev/null
            deadline=$(( $(date +%s) + ${MATRIX_TIMEOUT:-540} ))
            t0=$(date +%s)
            PYTHONPATH=$PWD/.carry/rl-kernel-h3:$PYTHONPATH python3 -c "import time; t = time.time(); from rl_engine.kernels.ops import base; print('rl_engine._C built:', base._EXT_AVAILABLE, getattr(base, '_EXT_ERROR', None), f'{time.time() - t:.0f} s')" > "$out/rlbuild.log" 2>&1 &
            build=$!
            # MATRICES: the matrix files (default matrix.yaml), precompiled at the same time, the
            # CPUs shared out among them (one after another, three norm files took 259 s)
            matrices=${MATRICES:-matrix.yaml}
            count=$(printf '%s\n' $matrices | wc -l); per=$(( ($(nproc) - 2) / count )); [ "$per" -lt 1 ] && per=1
            pids=""
            for mx in $matrices; do
              ( timeout -s TERM $(( deadline - $(date +%s) )) python3 -m gate_residual_matrix.runner.cell.precompile --matrix "$mx" --target "${MODE_TARGET:-cuda}" --workers "$per" $(printf -- '--mode %s ' $modes) ${PRECOMPILE_ARGS:-} > "$out/matrix-precompile-$(basename "$mx" .yaml).log" 2>&1
                echo "precompile $mx: exit $? after $(( $(date +%s) - t0 )) s: $(tail -c 300 "$out/matrix-precompile-$(basename "$mx" .yaml).log")" ) &
              pids="$pids $!"
            done
            wait $pids
            wait $build; echo "rlbuild: done after $(( $(date +%s) - t0 )) s: $(tail -n 1 "$out/rlbuild.log")"
            jobs=${MODE_JOBS:-1}
            if [ "$jobs" -gt 1 ]; then
              export GATE_RESIDUAL_GPU_LOCK=$PWD/build/gpu.lock
              # the CPUs shared out: each cell's thread pools sized to its share
              threads=$(( $(nproc) / jobs )); [ "$threads" -lt 2 ] && threads=2
              export OMP_NUM_THREADS=$threads NUMBA_NUM_THREADS=$threads
            fi
            left=$(( deadline - $(date +%s) ))
            printf '%s\n' $modes | xargs -P "$jobs" -I{} \
              sh -c "timeout -s TERM $left python3 -m gate_residual_matrix.runner matrix $(printf -- '--matrix %s ' $matrices) --stack host --target ${MODE_TARGET:-cuda} --mode {} --reports '$reports' ${MATRIX_ARGS:-} > '$out/matrix-{}.log' 2>&1; echo '{}: exit' \$? after \$(( \$(date +%s) - $t0 )) s; flock '$PWD/build/tar.lock' sh -c 'cd \"$reports\" && tar czf \"$out/.modes-reports.tgz\" \$(ls *.json | grep -v ^summary) && mv \"$out/.modes-reports.tgz\" \"$out/modes-reports.tgz\"'"
            echo "all modes: $(( $(date +%s) - t0 )) s wall"
            # (the tables are rendered where the reports are committed: python -m gate_residual_matrix.runner report)
            python3 -c "import json, glob; [print(r['cell']['id'], r['status'], r['duration_s'], 's', len(r['cases']), 'cases', {k: v for k, v in r.get('phases', {}).items() if not isinstance(v, dict)}) for r in (json.load(open(p)) for p in sorted(glob.glob('$reports/*.json'))) if 'cell' in r]" 2>&1 || true
            # only a few files come back: the reports travel as one archive
            tar czf "$out/modes-reports.tgz" -C "$reports" $(cd "$reports" && ls *.json | grep -v '^summary') && rm -rf "$reports"
            for f in "$out"/matrix-*.log; do tail -n 3 "$f"; done > "$out/modes-tails.log"
            tar czf "$out/modes-logs.tgz" -C "$out" $(cd "$out" && ls matrix-*.log rlbuild.log) && rm -f "$out"/matrix-*.log
            cat "$out/modes-tails.log" ;;
    cells)  # CELLS ("MATRIX:MODE ...", default: each op's plain cell) one after another, each
            # alone on the GPU and timed, after one precompile per matrix (all at once, beside
            # RL-Kernel's build): a cell's own wall time, its compile caches warm
            cells=${CELLS:-"matrix-scale-shift.yaml:plain matrix.yaml:plain"}
            reports=${CELL_REPORTS:-$out/reports-cells}; mkdir -p "$reports"
            deadline=$(( $(date +%s) + ${MATRIX_TIMEOUT:-540} )); t0=$(date +%s)
            PYTHONPATH=$PWD/.carry/rl-kernel-h3:$PYTHONPATH python3 -c "import time; t = time.time(); from rl_engine.kernels.ops import base; print('rl_engine._C built:', base._EXT_AVAILABLE, getattr(base, '_EXT_ERROR', None), f'{time.time() - t:.0f} s')" > "$out/rlbuild.log" 2>&1 &
            pids="$!"
            for m in $(printf '%s\n' $cells | cut -d: -f1 | sort -u); do
              timeout -s TERM $(( deadline - $(date +%s) )) python3 -m gate_residual_matrix.runner.cell.precompile --matrix "$m" --target "${MODE_TARGET:-cuda}" $(printf '%s\n' $cells | grep "^$m:" | cut -d: -f2 | sed 's/^/--mode /') ${PRECOMPILE_ARGS:-} > "$out/precompile-$(basename "$m" .yaml).log" 2>&1 &
              pids="$pids $!"
            done
            wait $pids; echo "precompile + rlbuild: $(( $(date +%s) - t0 )) s: $(cat "$out"/precompile-*.log | tail -c 800) $(tail -n 1 "$out/rlbuild.log")"
            for c in $cells; do
              t1=$(date +%s)
              # PYSPY_RATE=N: sample the cell (and its cell process) with py-spy, N per second,
              # every thread, idle ones too: collapsed stacks in pyspy-<matrix>-<mode>.txt
              # (PYSPY_CELLS: only those cells; PYSPY_NATIVE=1: C/C++ frames too)
              spy=""; command -v py-spy >/dev/null && [ -n "${PYSPY_RATE:-}" ] && \
                case " ${PYSPY_CELLS:-$c} " in *" $c "*) true ;; *) false ;; esac && \
                spy="py-spy record --idle --threads --subprocesses ${PYSPY_NATIVE:+--native} --rate $PYSPY_RATE --format raw -o $out/pyspy-$(basename "${c%%:*}" .yaml)-${c##*:}.txt --"
              timeout -s TERM $(( deadline - $(date +%s) )) $spy python3 -m gate_residual_matrix.runner matrix --matrix "${c%%:*}" --stack host --target "${MODE_TARGET:-cuda}" --mode "${c##*:}" --reports "$reports" ${MATRIX_ARGS:-} > "$out/matrix-cell-$(basename "${c%%:*}" .yaml)-${c##*:}.log" 2>&1
              echo "$c: exit $? after $(( $(date +%s) - t1 )) s (alone)"
            done
            python3 -c "import json, glob; [print(r['cell']['id'], r['status'], r['duration_s'], 's', len(r['cases']), 'cases', {k: v for k, v in r.get('phases', {}).items() if not isinstance(v, dict)}) for r in (json.load(open(p)) for p in sorted(glob.glob('$reports/*.json'))) if 'cell' in r]" 2>&1 || true
            tar czf "$out/cells-reports.tgz" -C "$reports" $(cd "$reports" && ls *.json) && rm -rf "$reports"
            tar czf "$out/cells-logs.tgz" -C "$out" $(cd "$out" && ls matrix-cell-*.log precompile-*.log rlbuild.log) && rm -f "$out"/matrix-cell-*.log "$out"/precompile-*.log ;;
    bench)  python3 -m gate_residual_matrix.bench.gate_residual ${BENCH_ARGS:-} --out "$out" 2>&1 | tee "$out/bench.log" | tail -60 || rc=1 ;;
    benchruns) # the benchmark BENCH_RUNS times (default 4), each a fresh process, e.g. with
            # BENCH_ARGS="--case bfloat16:1 --peer eager --peer numba --rounds 20 --iters 1000":
            # run-to-run spread of a small-N verdict (issue 14); one archive comes back
            for i in $(seq "${BENCH_RUNS:-4}"); do
              mkdir -p "$out/bench-runs/run-$i"
              python3 -m gate_residual_matrix.bench.gate_residual ${BENCH_ARGS:-} --out "$out/bench-runs/run-$i" > "$out/bench-runs/run-$i/bench.log" 2>&1 \
                || { rc=1; echo "run $i failed:"; tail -n 5 "$out/bench-runs/run-$i/bench.log"; continue; }
              grep -h "^| [a-z0-9]* | [0-9]* | " "$out/bench-runs/run-$i"/bench-*.md | sed "s/^/run $i: /"
            done
            tar czf "$out/bench-runs.tgz" -C "$out" bench-runs && rm -rf "$out/bench-runs" ;;
    profile) python3 scripts/profile_host.py 1 > "$out/profile-host.txt" 2>&1 || rc=1; grep "us/call" "$out/profile-host.txt" ;;
  esac
done
exit $rc
