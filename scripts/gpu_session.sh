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
for pack in .fib/fi_aot*.tar.xz; do [ -f "$pack" ] && python3 .fib/flashinfer_aot.py install "$pack"; done
# Triton's and inductor's caches in one place: .fib/jit_cache*.tar.xz (a PACK_JIT=1 run's $OUT/jit_cache.tar.xz,
# carried back) restores what an earlier machine compiled, so "warm JIT" survives a fresh machine.
export TRITON_CACHE_DIR=/tmp/jit/triton TORCHINDUCTOR_CACHE_DIR=/tmp/jit/inductor
mkdir -p /tmp/jit
for pack in .fib/jit_cache*.tar.xz; do [ -f "$pack" ] && tar -C /tmp -xJf "$pack" && echo "installed $pack"; done
python3 -c "import flashinfer; print('flashinfer', flashinfer.__version__)"
STEPS=${STEPS:-tests,check,bench}
if [[ $STEPS == *prewarm* ]]; then
  # JIT modules not in the installed packs, compiled PREWARM_JOBS at a time, then packed on their own
  # (the JIT cache holds only what this machine compiled) as $OUT/fi_aot_${PACK_NAME:-new}.tar.xz.
  read -r -a pl <<< "${PREWARM_LOWERINGS:-context[flashinfer-fa3]}"
  echo "== python3 -m parity.warmup --jobs ${PREWARM_JOBS:-4} ${PREWARM_EXTRA:-} ${pl[*]}"
  timeout ${PREWARM_TIMEOUT:-240} python3 -m parity.warmup --jobs ${PREWARM_JOBS:-4} ${PREWARM_EXTRA:-} "${pl[@]}"
  echo "exit code: $?"
  python3 .fib/flashinfer_aot.py pack "$OUT/fi_aot_${PACK_NAME:-new}.tar.xz" || true
fi
if [[ $STEPS == *tests* ]]; then
  # PYTEST_TARGETS: space-separated paths (no quoting inside); PYTEST_K: one -k expression.
  read -r -a targets <<< "${PYTEST_TARGETS:-tests/lowerings tests/parity/test_judge.py tests/oracle/test_fast_engine.py}"
  kargs=(); [ -n "${PYTEST_K:-}" ] && kargs=(-k "$PYTEST_K")
  echo "== pytest ${targets[*]} ${kargs[*]} (compiled kernels, gpu-marked tests)"
  timeout ${TESTS_TIMEOUT:-240} python3 -m pytest "${targets[@]}" "${kargs[@]}" -q -rs -p no:cacheprovider \
    --junitxml="$OUT/pytest-junit.xml" ${PYTEST_EXTRA:-} 2>&1 | tail -60
fi
if [[ $STEPS == *warmup* ]]; then
  echo "== pytest tests/test_parity.py -k flashinfer --parity-warm-up (JIT warm-up through the plugin)"
  timeout ${WARMUP_TIMEOUT:-120} python3 -m pytest tests/test_parity.py -k flashinfer --parity-warm-up --parity-device cuda \
    --parity-max-examples 5 -q -rs -p no:cacheprovider 2>&1 | tail -40
fi
if [[ $STEPS == *oracle* ]]; then
  echo "== scripts/gpu_oracle_bench.py (the oracle at production scale)"
  timeout ${ORACLE_TIMEOUT:-180} python3 scripts/gpu_oracle_bench.py "$OUT/oracle_bench.json"
fi
if [[ $STEPS == *check* ]]; then
  echo "== dflash-parity check --device cuda --profile gpu ${CHECK_ARGS:-}"
  start=$(date +%s.%N)
  timeout -s INT -k 60 ${CHECK_TIMEOUT:-300} python3 -m parity.cli check --device cuda --profile gpu --report /tmp/report \
    ${CHECK_ARGS:-} > /tmp/check.log 2>&1
  echo "exit code: $?; wall $(python3 -c "import time;print(round(time.time()-$start,1))") s"
  grep -v "cases, .* unsupported, .* failed" /tmp/check.log | grep -v "_warn_once\|UserWarning" | tail -70
  cp /tmp/check.log /tmp/report/check.log 2>/dev/null
  tar -C /tmp -czf "$OUT/report.tgz" report
fi
if [[ $STEPS == *sweep* ]]; then
  # The fast sweep: every GPU lowering, SWEEP_N cases each, SWEEP_JOBS lowerings at once (one process
  # each), device-built cases, the Triton oracle, no hardening re-runs, JIT modules warmed first in each
  # process. SWEEP_PASSES runs of the same command: the first fills the JIT caches (flashinfer, Triton,
  # inductor), the later ones are the warm-JIT figure. SIGINT at the time limit: partial reports kept.
  read -r -a sl <<< "${SWEEP_LOWERINGS:-context[flashinfer-fa2] context[flashinfer-fa3] decode_rows[flashinfer] decode_rows[flashinfer-tc] windowed_merge[flashinfer-eager] windowed_merge[flashinfer-compiled] windowed_merge[flashinfer-triton] windowed_merge[flashinfer-merge_state] hybrid_paged hybrid_paged[splits=4] windowed_merge[triton]}"
  largs=(); for l in "${sl[@]}"; do largs+=(--lowering "$l"); done
  for pass in $(seq 1 ${SWEEP_PASSES:-1}); do
    echo "== fast sweep pass $pass: check --jobs ${SWEEP_JOBS:-11} --warm-up --no-hardening --no-isolate --max-examples ${SWEEP_N:-500} ${SWEEP_EXTRA:-} (${#sl[@]} lowerings)"
    start=$(date +%s.%N)
    limit=${SWEEP_TIMEOUT:-240}; [ "$pass" != 1 ] && limit=${SWEEP_TIMEOUT_LATER:-$limit}
    timeout -s INT -k 60 $limit python3 -m parity.cli check --device cuda --profile gpu --seed 3 \
      --max-examples ${SWEEP_N:-500} --jobs ${SWEEP_JOBS:-11} --warm-up --no-hardening --no-isolate ${SWEEP_EXTRA:-} \
      --report /tmp/sweep$pass "${largs[@]}" > "/tmp/sweep$pass.log" 2>&1
    echo "exit code: $?; wall $(python3 -c "import time;print(round(time.time()-$start,1))") s"
    grep -v "cases, .* unsupported, .* failed" "/tmp/sweep$pass.log" | grep -v "_warn_once\|UserWarning" | tail -60
    cp "/tmp/sweep$pass.log" /tmp/sweep$pass/sweep.log 2>/dev/null
    tar -C /tmp -czf "$OUT/sweep$pass.tgz" sweep$pass
    if [ "$pass" = 1 ] && [ -n "${PACK_AFTER_SWEEP:-}" ]; then python3 .fib/flashinfer_aot.py pack "$OUT/fi_aot.tar.xz" || true; fi
  done
fi
if [[ $STEPS == *bench* ]]; then
  echo "== scripts/bench_triton.py"
  timeout ${BENCH_TIMEOUT:-150} python3 scripts/bench_triton.py "$OUT/bench_triton.json"
fi
[ -n "${NO_FINAL_PACK:-}" ] || python3 .fib/flashinfer_aot.py pack "$OUT/fi_aot.tar.xz" || true
if [ -n "${PACK_JIT:-}" ]; then
  tar -C /tmp -cf - jit | xz -T0 -3 > "$OUT/jit_cache.tar.xz"
  echo "== packed the Triton/inductor caches: $(du -sh /tmp/jit | cut -f1) -> $(du -h "$OUT/jit_cache.tar.xz" | cut -f1)"
fi
echo "== done $(date -u +%H:%M:%S)"
