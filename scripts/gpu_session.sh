#!/usr/bin/env bash
# One GPU session on the lent H200 (see docs/gpu/): flashinfer from the offline bundle in .fib/, compiled
# kernel tests, `dflash-parity check --device cuda --profile gpu` over every lowering, the Triton bench,
# and flashinfer's compiled modules packed for the next machine. Everything lands under $OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1
LOG=$OUT/gpu_session.log
exec > >(tee -a "$LOG") 2>&1
echo "== date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv
python3 -c "import sys, torch, triton; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__)"
mkdir -p /tmp/site && tar -C /tmp/site -xJf .fib/fi_strip.tar.xz \
  && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .fib/*.whl
export PYTHONPATH=/tmp/site:$PWD
if [ -f .fib/fi_aot.tar.xz ]; then python3 .fib/flashinfer_aot.py install .fib/fi_aot.tar.xz; fi
python3 -c "import flashinfer; print('flashinfer', flashinfer.__version__)"
STEPS=${STEPS:-tests,check,bench}
if [[ $STEPS == *tests* ]]; then
  # PYTEST_TARGETS: space-separated paths (no quoting inside); PYTEST_K: one -k expression.
  read -r -a targets <<< "${PYTEST_TARGETS:-tests/lowerings tests/parity/test_judge.py tests/oracle/test_fast_engine.py}"
  kargs=(); [ -n "${PYTEST_K:-}" ] && kargs=(-k "$PYTEST_K")
  echo "== pytest ${targets[*]} ${kargs[*]} (compiled kernels, gpu-marked tests)"
  timeout ${TESTS_TIMEOUT:-240} python3 -m pytest "${targets[@]}" "${kargs[@]}" -q -rs -p no:cacheprovider \
    --junitxml="$OUT/pytest-junit.xml" ${PYTEST_EXTRA:-} 2>&1 | tail -60
fi
if [[ $STEPS == *warmup* ]]; then
  echo "== pytest tests/test_parity.py -k flashinfer --dflash-warmup (JIT warm-up through the plugin)"
  timeout ${WARMUP_TIMEOUT:-120} python3 -m pytest tests/test_parity.py -k flashinfer --dflash-warmup --parity-device cuda \
    --parity-max-examples 5 -q -rs -p no:cacheprovider 2>&1 | tail -40
fi
if [[ $STEPS == *oracle* ]]; then
  echo "== scripts/gpu_oracle_bench.py (the oracle at production scale)"
  timeout ${ORACLE_TIMEOUT:-180} python3 scripts/gpu_oracle_bench.py "$OUT/oracle_bench.json"
fi
if [[ $STEPS == *sweep* ]]; then
  # The fast sweep: every GPU lowering, SWEEP_N cases each, device-built cases, Triton oracle, no
  # hardening re-runs, in process.
  read -r -a sl <<< "${SWEEP_LOWERINGS:-context[flashinfer-fa2] context[flashinfer-fa3] decode_rows[flashinfer] decode_rows[flashinfer-tc] windowed_merge[flashinfer-eager] windowed_merge[flashinfer-triton] windowed_merge[flashinfer-merge_state] hybrid_paged windowed_merge[triton]}"
  largs=(); for l in "${sl[@]}"; do largs+=(--lowering "$l"); done
  echo "== fast sweep: check --no-hardening --no-isolate --max-examples ${SWEEP_N:-500} ${sl[*]}"
  start=$(date +%s.%N)
  timeout ${SWEEP_TIMEOUT:-240} python3 -m parity.cli check --device cuda --profile gpu --seed 3 --max-examples ${SWEEP_N:-500} \
    --no-hardening --no-isolate --report /tmp/sweep "${largs[@]}" > "$OUT/sweep.log" 2>&1
  echo "exit code: $?; wall $(python3 -c "import time;print(round(time.time()-$start,1))") s"
  grep -v "^  .*: [0-9]* cases, " "$OUT/sweep.log" | tail -40
  tar -C /tmp -czf "$OUT/sweep.tgz" sweep
fi
if [[ $STEPS == *check* ]]; then
  echo "== dflash-parity check --device cuda --profile gpu ${CHECK_ARGS:-}"
  timeout ${CHECK_TIMEOUT:-300} python3 -m parity.cli check --device cuda --profile gpu --report /tmp/report ${CHECK_ARGS:-}
  echo "exit code: $?"
  tar -C /tmp -czf "$OUT/report.tgz" report
fi
if [[ $STEPS == *bench* ]]; then
  echo "== scripts/bench_triton.py"
  timeout ${BENCH_TIMEOUT:-150} python3 scripts/bench_triton.py "$OUT/bench_triton.json"
fi
python3 .fib/flashinfer_aot.py pack "$OUT/fi_aot.tar.xz" || true
echo "== done $(date -u +%H:%M:%S)"
