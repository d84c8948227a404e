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
# Installed once per machine (/tmp/site/.dflash-installed): a later call of this script on a warm machine
# skips the bundle, the bytecode and the compiled modules (about 20 s each time before).
if [ ! -f /tmp/site/.dflash-installed ]; then
mkdir -p /tmp/site && tar -C /tmp/site -xJf .fib/fi_strip.tar.xz \
  && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .fib/*.whl
# The bundle holds no bytecode: a profiled check compiled 2,206 modules' sources at import, 6.4 s of its 40 s
# (docs/gpu/2026-12-02-h200-session12.md run 39). Compiled once here instead (the effect not yet measured).
python3 -m compileall -q -j 0 /tmp/site "$PWD/oracle" "$PWD/parity" "$PWD/lowerings" "$PWD/strategies" > /dev/null 2>&1 || true
export PYTHONPATH=/tmp/site:$PWD
for pack in .fib/fi_aot*.tar.xz; do [ -f "$pack" ] && python3 .fib/flashinfer_aot.py install "$pack"; done
# A pack brought back in parts (the device tool returns files of at most 16 MiB: `split -b 15m`), joined first.
for first in .fib/fi_aot*.tar.xz.part-aa; do
  [ -f "$first" ] || continue
  joined=/tmp/$(basename "${first%.part-aa}"); cat "${first%aa}"?? > "$joined" && python3 .fib/flashinfer_aot.py install "$joined"
done
# Triton's and inductor's caches in one place: .fib/jit_cache*.tar.xz (a PACK_JIT=1 run's $OUT/jit_cache.tar.xz,
# carried back) restores what an earlier machine compiled, so "warm JIT" survives a fresh machine.
mkdir -p /tmp/jit
for pack in .fib/jit_cache*.tar.xz; do [ -f "$pack" ] && tar -C /tmp -xJf "$pack" && echo "installed $pack"; done
touch /tmp/site/.dflash-installed
fi
export PYTHONPATH=/tmp/site:$PWD TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/jit/triton} TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-/tmp/jit/inductor}
# The image sets PYTHONDONTWRITEBYTECODE=1 and its torch has no bytecode: every process compiled torch again (the
# prefork's imports 7.8 s; 2.8-3.2 s from this cache, docs/gpu/2026-12-03-h200-session20.md run 69). Opted in here.
export DFLASH_PARITY_PYCACHE=${DFLASH_PARITY_PYCACHE:-/tmp/dflash-pycache}
python3 -c "import flashinfer; print('flashinfer', flashinfer.__version__)"
STEPS=${STEPS:-tests,check,bench}
# MPS=1: the steps below run under CUDA MPS (one shared context: the kernels of the side-by-side check processes
# may run at once instead of taking turns). Not yet run on the lent H200: whether its daemon starts there is
# what the first such run finds out; it is stopped at the end (no setting of the GPU is changed).
if [ -n "${MPS:-}" ]; then
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  if nvidia-cuda-mps-control -d; then
    echo "== CUDA MPS daemon started"; trap 'echo quit | nvidia-cuda-mps-control; echo "== CUDA MPS daemon stopped"' EXIT
  else
    echo "== CUDA MPS daemon did not start: the steps run without it"; unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
  fi
fi
# The GPU's own view while a step runs: every 500 ms, the share of the time a kernel of any process ran
# (nvidia-smi's utilization.gpu) and the memory in use; `smi_stop` prints the mean, the median and the
# share of samples at 90% or more.
# The host's cores too (/proc/stat every 500 ms): the share of all cores busy (user, system, irq), so a step
# bound by the CPU shows as such.
smi_start() {
  nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader,nounits -lms 500 > "/tmp/smi_$1.csv" & SMI_PID=$!
  (while :; do head -1 /proc/stat; sleep 0.5; done) > "/tmp/cpu_$1.txt" & CPU_PID=$!
}
smi_stop() {
  kill "$SMI_PID" "$CPU_PID" 2>/dev/null; wait "$SMI_PID" "$CPU_PID" 2>/dev/null
  python3 - "/tmp/cpu_$1.txt" "$2" <<'EOF'
import os, sys
rows = []
for line in open(sys.argv[1]):
    f = line.split()
    if f and f[0] == "cpu" and len(f) >= 8:
        v = [int(x) for x in f[1:]]
        rows.append((sum(v[:8]), v[3] + v[4]))  # all but guest time; idle + iowait
busy = [1 - (i1 - i0) / (t1 - t0) for (t0, i0), (t1, i1) in zip(rows, rows[1:]) if t1 > t0]
if busy:
    s = sorted(busy)
    print(f"== CPU busy, {sys.argv[2]}: mean {100 * sum(busy) / len(busy):.0f}% of {os.cpu_count()} cores, median "
          f"{100 * s[len(s) // 2]:.0f}%, {100 * sum(b >= 0.9 for b in busy) // len(busy)}% of samples >= 90% "
          f"({len(busy)} intervals)")
EOF
  python3 - "/tmp/smi_$1.csv" "$2" <<'EOF'
import sys
us, mem = [], []
for row in open(sys.argv[1]):
    try:
        u, m = (float(x) for x in row.split(","))
    except ValueError:
        continue
    us.append(u); mem.append(m)
if us:
    s = sorted(us)
    print(f"== GPU utilization, {sys.argv[2]}: mean {sum(us) / len(us):.0f}%, median {s[len(s) // 2]:.0f}%, "
          f"{100 * sum(u >= 90 for u in us) // len(us)}% of samples >= 90%; memory used up to {max(mem) / 1024:.1f} GiB "
          f"({len(us)} samples, 500 ms apart)")
EOF
}
if [[ $STEPS == *prewarm* ]]; then
  # JIT modules not in the installed packs, compiled PREWARM_JOBS at a time, then packed on their own
  # (the JIT cache holds only what this machine compiled) as $OUT/fi_aot_${PACK_NAME:-new}.tar.xz.
  read -r -a pl <<< "${PREWARM_LOWERINGS:-context[flashinfer-fa3]}"
  echo "== python3 -m parity.exec.warmup --jobs ${PREWARM_JOBS:-4} ${PREWARM_EXTRA:-} ${pl[*]}"
  timeout ${PREWARM_TIMEOUT:-240} python3 -m parity.exec.warmup --jobs ${PREWARM_JOBS:-4} ${PREWARM_EXTRA:-} "${pl[@]}"
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
  echo "== lab/gpu_oracle_bench.py (the oracle at production scale)"
  timeout ${ORACLE_TIMEOUT:-180} python3 lab/gpu_oracle_bench.py "$OUT/oracle_bench.json"
fi
if [[ $STEPS == *check* ]]; then
  echo "== dflash-parity check --device cuda --profile gpu ${CHECK_ARGS:-}"
  start=$(date +%s.%N)
  timeout -s TERM -k 60 ${CHECK_TIMEOUT:-300} python3 -m parity.front.cli check --device cuda --profile gpu --report /tmp/report \
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
  # inductor), the later ones are the warm-JIT figure. SIGTERM at the time limit (SIGINT may be ignored: see run 41), partial reports kept.
  read -r -a sl <<< "${SWEEP_LOWERINGS:-context[flashinfer-fa2] context[flashinfer-fa3] decode_rows[flashinfer] decode_rows[flashinfer-tc] windowed_merge[flashinfer-eager] windowed_merge[flashinfer-compiled] windowed_merge[flashinfer-triton] windowed_merge[flashinfer-merge_state] hybrid_paged hybrid_paged[splits=4] windowed_merge[triton]}"
  largs=(); for l in "${sl[@]}"; do largs+=(--lowering "$l"); done
  for pass in $(seq ${SWEEP_FIRST_PASS:-1} ${SWEEP_PASSES:-1}); do  # SWEEP_FIRST_PASS=2: a later call's warm pass
    echo "== fast sweep pass $pass: check --jobs ${SWEEP_JOBS:-11} --warm-up --no-hardening --no-isolate --max-examples ${SWEEP_N:-500} ${SWEEP_EXTRA:-} (${#sl[@]} lowerings)"
    start=$(date +%s.%N)
    limit=${SWEEP_TIMEOUT:-240}; [ "$pass" != 1 ] && limit=${SWEEP_TIMEOUT_LATER:-$limit}
    smi_start sweep$pass
    timeout -s TERM -k 60 $limit python3 -m parity.front.cli check --device cuda --profile gpu --seed 3 \
      --max-examples ${SWEEP_N:-500} --jobs ${SWEEP_JOBS:-11} --warm-up --no-hardening --no-isolate ${SWEEP_EXTRA:-} \
      --report /tmp/sweep$pass "${largs[@]}" > "/tmp/sweep$pass.log" 2>&1
    echo "exit code: $?; wall $(python3 -c "import time;print(round(time.time()-$start,1))") s"
    smi_stop sweep$pass "sweep pass $pass"
    grep -v "cases, .* unsupported, .* failed" "/tmp/sweep$pass.log" | grep -v "_warn_once\|UserWarning" | tail -60
    cp "/tmp/sweep$pass.log" /tmp/sweep$pass/sweep.log 2>/dev/null
    tar -C /tmp -czf "$OUT/sweep$pass.tgz" sweep$pass
    if [ "$pass" = 1 ] && [ -n "${PACK_AFTER_SWEEP:-}" ]; then python3 .fib/flashinfer_aot.py pack "$OUT/fi_aot.tar.xz" || true; fi
  done
fi
if [[ $STEPS == *profile* ]]; then
  # Where a case's time goes, function by function: each of PROFILE_LOWERINGS in its own `check` process
  # under cProfile (the fast sweep's flags: --seed 3, no hardening, in process), all side by side as the
  # sweep runs them, SIGINT at PROFILE_TIMEOUT; then PROFILE_ALONE by itself (no other process on the GPU).
  # Each process's top functions (own time, then cumulative time of the project's own) land in
  # $OUT/profile.txt, the raw pstats in $OUT/profile.tgz.
  read -r -a pl <<< "${PROFILE_LOWERINGS:-context[flashinfer-fa2] decode_rows[flashinfer-tc] windowed_merge[flashinfer-eager] hybrid_paged}"
  mkdir -p /tmp/prof
  run_profiled() {  # $1 tag, $2 lowering, $3 seconds
    timeout -s INT -k 30 "$3" python3 -m cProfile -o "/tmp/prof/$1.pstats" -m parity.front.cli check --device cuda --profile gpu \
      --seed 3 --max-examples ${PROFILE_N:-500} --warm-up --no-hardening --no-isolate ${PROFILE_EXTRA:-} --lowering "$2" \
      --report "/tmp/prof/$1" > "/tmp/prof/$1.log" 2>&1
  }
  smi_start profile
  echo "== profile: ${#pl[@]} processes side by side, ${PROFILE_TIMEOUT:-150} s: ${pl[*]}"
  i=0; pids=(); for l in "${pl[@]}"; do i=$((i+1)); run_profiled "side$i" "$l" ${PROFILE_TIMEOUT:-150} & pids+=($!); done
  wait "${pids[@]}"
  smi_stop profile "side by side"
  if [ -n "${PROFILE_ALONE:-}" ]; then
    echo "== profile: $PROFILE_ALONE alone, ${PROFILE_ALONE_TIMEOUT:-60} s"
    smi_start alone
    run_profiled alone "$PROFILE_ALONE" ${PROFILE_ALONE_TIMEOUT:-60}
    smi_stop alone "$PROFILE_ALONE alone"
  fi
  python3 - "${pl[@]}" <<'EOF' > "$OUT/profile.txt" 2>&1
import glob, io, pstats, re, sys
for path in sorted(glob.glob("/tmp/prof/*.pstats")):
    tag = path.split("/")[-1][:-7]
    log = open(path[:-7] + ".log").read()
    print(f"######## {tag}: " + " | ".join(l.strip() for l in log.splitlines() if re.search(r"time |cases in|lowering\(s\)", l)))
    for order, n in (("tottime", 45), ("cumulative", 70)):
        s = io.StringIO()
        st = pstats.Stats(path, stream=s).sort_stats(order)
        if order == "cumulative":
            st.print_stats(r"(parity|oracle|lowerings|strategies)/", n)
        else:
            st.print_stats(n)
        print("\n".join(l[:200] for l in s.getvalue().splitlines() if l.strip()))
EOF
  tar -C /tmp -czf "$OUT/profile.tgz" prof
  echo "== profile written: $(wc -l < "$OUT/profile.txt") lines"
fi
if [[ $STEPS == *phase* ]]; then
  # Each phase's own device time (synchronized at its end) and the kernels by device time, per lowering of
  # PHASE_LOWERINGS, alone on the GPU (lab/gpu_phase_profile.py); PHASE_BEFORE=DIR runs the same with
  # the code in DIR too (an older tree carried along, e.g. the commit before a speed change); PHASE_EXTRA more
  # arguments (e.g. `--min-keys 4097`: production-scale cases only).
  read -r -a ph <<< "${PHASE_LOWERINGS:-context[flashinfer-fa2] hybrid_paged}"
  for tree in ${PHASE_BEFORE:-} .; do
    echo "== lab/gpu_phase_profile.py --cases ${PHASE_N:-40} --kernel-cases ${PHASE_M:-20} (code in $tree) ${ph[*]}"
    script=$tree/lab/gpu_phase_profile.py; [ -f "$script" ] || script=$tree/scripts/gpu_phase_profile.py  # a tree before issue 48
    timeout -s INT -k 30 ${PHASE_TIMEOUT:-200} python3 "$script" --cases ${PHASE_N:-40} \
      --kernel-cases ${PHASE_M:-20} ${PHASE_EXTRA:-} "${ph[@]}" 2>&1 | grep -v "_warn_once\|UserWarning\|warm-up [0-9]" | tee -a "$OUT/phase.txt"
  done
fi
if [[ $STEPS == *bench* ]]; then
  echo "== lab/bench_triton.py"
  timeout ${BENCH_TIMEOUT:-150} python3 lab/bench_triton.py "$OUT/bench_triton.json"
fi
[ -n "${NO_FINAL_PACK:-}" ] || python3 .fib/flashinfer_aot.py pack "$OUT/fi_aot.tar.xz" || true
if [ -n "${PACK_JIT:-}" ]; then
  tar -C /tmp -cf - jit | xz -T0 -3 > "$OUT/jit_cache.tar.xz"
  echo "== packed the Triton/inductor caches: $(du -sh /tmp/jit | cut -f1) -> $(du -h "$OUT/jit_cache.tar.xz" | cut -f1)"
fi
echo "== done $(date -u +%H:%M:%S)"
