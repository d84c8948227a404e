#!/usr/bin/env bash
# The repository's own suite on a GPU runner, as recorded in docs/gpu/ (issue 20). Run from the repository
# root on a machine with a CUDA GPU; flashinfer comes from the offline bundle in .fib/ (fi_strip.tar.xz, the
# apache-tvm-ffi wheel, flashinfer_aot.py and any fi_aot*.tar.xz packs of compiled modules). Everything lands
# under $OUT (at most 8 files: the device tool brings back no more).
#
#   PASSES    which passes, run in the order given (default "quick,warmed,slow"):
#             quick  = pytest -m "not slow" -k "not ($WARM_K)"   (everything but the slow tests and those
#                      that need the modules being compiled in the background)
#             warmed = pytest -m "not slow" -k "$WARM_K"          (waits for the background warm-up first)
#             slow   = pytest -m slow                             (production-scale mutants, the scale profile)
#             named  = pytest $NAMED -rfEsP                       (chosen tests, their printed output kept;
#                      NAMED is split on spaces: write a -k expression without them, e.g. "-knot(fa3)")
#   WARM      lowerings whose JIT modules are compiled in the background (`python -m parity.exec.warmup`, on the
#             GPU) while the passes before `warmed` run (default "context[flashinfer-fa3]"); WARM_K the -k
#             expression of their tests (default "fa3")
#   PREBUILD  instead of WARM: arguments of scripts/flashinfer_prebuild.py (for example "--only fa3 --jobs 8"),
#             which compiles the modules without the GPU, one line per module, at a lower CPU priority
#   QUICK_K   a -k expression for the quick pass instead (e.g. "not fa3" when no pack holds fa3's modules and
#             none is compiled here: each fa3 test would compile them, 95 s each, on every worker at once)
#   N         pytest-xdist workers (default 8); QUICK_S, WARMED_S, SLOW_S, NAMED_S: each pass's SIGINT limit (s)
#
# The modules compiled here are packed for the next machine ($OUT/fi_aot_new.tar.xz, cut into 15 MB parts
# fi_aot_new.tar.xz.NN when larger: the device tool brings back no file over 16 MB; `cat` them back together).
# Each pass is verbose with -rfEs, under a SIGINT limit (pytest prints its summary on SIGINT, not on
# SIGTERM), started with job control on (a background job without it ignores SIGINT, and the suite's own
# signal tests then fail: docs/gpu-runner.md).
set -uo pipefail
set -m
export PYTHONUNBUFFERED=1 CI=true
OUT=${OUT:?set OUT to the output directory}
LOG=$OUT/session.log
exec > >(tee -a "$LOG") 2>&1
echo "== $(date -u +%Y-%m-%dT%H:%M:%SZ) $(git log --oneline -1 2>/dev/null | cut -c1-80)"
nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader
mkdir -p /tmp/site && tar -C /tmp/site -xJf .fib/fi_strip.tar.xz \
  && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .fib/*.whl
# The bundle holds no bytecode: a profiled check compiled 2,206 modules' sources at import, 6.4 s of its 40 s
# (docs/gpu/2026-12-02-h200-session12.md run 39). Compiled once here instead (the effect not yet measured).
python3 -m compileall -q -j 0 /tmp/site "$PWD/oracle" "$PWD/parity" "$PWD/lowerings" "$PWD/strategies" > /dev/null 2>&1 || true
export PYTHONPATH=/tmp/site:$PWD
for pack in .fib/fi_aot*.tar.xz; do [ -f "$pack" ] && python3 .fib/flashinfer_aot.py install "$pack"; done
export TRITON_CACHE_DIR=/tmp/jit/triton TORCHINDUCTOR_CACHE_DIR=/tmp/jit/inductor
python3 -c "import sys, torch, triton, flashinfer; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__, 'flashinfer', flashinfer.__version__)"
PASSES=${PASSES:-quick,warmed,slow}
WARM=${WARM-"context[flashinfer-fa3]"}
WARM_K=${WARM_K:-fa3}
N=${N:-8}
warm_pid=
if [ -n "${PREBUILD:-}" ]; then
  read -r -a pb <<< "$PREBUILD"
  echo "== background: nice -n 10 python3 scripts/flashinfer_prebuild.py ${pb[*]}"
  ( start=$(date +%s); FLASHINFER_CUDA_ARCH_LIST=${FLASHINFER_CUDA_ARCH_LIST:-9.0a} nice -n 10 \
      python3 scripts/flashinfer_prebuild.py "${pb[@]}" > /tmp/warm.log 2>&1
    echo "prebuild exit $? after $(( $(date +%s) - start )) s" >> /tmp/warm.log ) &
  warm_pid=$!
elif [ -n "$WARM" ]; then
  read -r -a wl <<< "$WARM"
  echo "== background: python3 -m parity.exec.warmup --jobs ${WARM_JOBS:-8} ${wl[*]}"
  ( start=$(date +%s); python3 -m parity.exec.warmup --jobs "${WARM_JOBS:-8}" "${wl[@]}" > /tmp/warm.log 2>&1
    echo "warm-up exit $? after $(( $(date +%s) - start )) s" >> /tmp/warm.log ) &
  warm_pid=$!
fi

run_pass() {  # name, limit, pytest arguments (paths included)...
  local name=$1 limit=$2; shift 2
  echo "== pass $name ($(date -u +%T), limit ${limit} s): pytest $*"
  local start; start=$(date +%s)
  timeout -s INT -k 30 "$limit" python3 -m pytest -p no:cacheprovider -v -rfEs --tb=short --durations=15 \
    -n "$N" --junitxml="/tmp/junit-$name.xml" "$@" > "$OUT/$name.log" 2>&1
  echo "pass $name: exit $? in $(( $(date +%s) - start )) s; $(grep -E '^=+ .*(passed|failed|error).* in ' "$OUT/$name.log" | tail -1)"
  grep -E "^(FAILED|ERROR)" "$OUT/$name.log" | head -30
}

pack_warm() {  # the modules compiled here so far, packed for the next machine (also when the warm-up is not done)
  grep -v " - INFO - " /tmp/warm.log | tail -20; cp /tmp/warm.log "$OUT/warm.log"
  python3 .fib/flashinfer_aot.py pack /tmp/fi_aot_new.tar.xz || return 0
  if [ "$(stat -c %s /tmp/fi_aot_new.tar.xz)" -gt 15000000 ]; then
    split -b 15000000 -d /tmp/fi_aot_new.tar.xz "$OUT/fi_aot_new.tar.xz."; ls -l "$OUT"/fi_aot_new.tar.xz.*
  else cp /tmp/fi_aot_new.tar.xz "$OUT/"; fi
}
IFS=, read -r -a order <<< "$PASSES"
for pass in "${order[@]}"; do
  case "$pass" in
    quick) if [ -n "${QUICK_K:-}" ]; then run_pass quick "${QUICK_S:-420}" tests -m "not slow" -k "$QUICK_K"
           else run_pass quick "${QUICK_S:-420}" tests -m "not slow" ${WARM_K:+${warm_pid:+-k "not ($WARM_K)"}}; fi ;;
    warmed)
      if [ -n "$warm_pid" ]; then wait "$warm_pid"; pack_warm; warm_pid=; fi
      run_pass warmed "${WARMED_S:-200}" tests -m "not slow" -k "$WARM_K" ;;
    slow) run_pass slow "${SLOW_S:-300}" tests -m slow -rfEsP ;;  # P: each mutant's caught-at / shrunk-to line
    named) read -r -a named <<< "${NAMED:?NAMED: the test ids of the named pass}"
           run_pass named "${NAMED_S:-120}" "${named[@]}" -rfEsP ;;
    *) echo "PASSES: quick, warmed, slow or named, got '$pass'"; exit 2 ;;
  esac
done
[ -n "$warm_pid" ] && { echo "== warm-up still running at the end: packing what it compiled"; pack_warm; }
tar -C /tmp -czf "$OUT/junit.tgz" $(cd /tmp && ls junit-*.xml 2>/dev/null) 2>/dev/null || true
echo "== done $(date -u +%T)"
