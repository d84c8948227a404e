#!/usr/bin/env bash
# Issue 48 (and 47's point 3) on the GPU with flashinfer, in two parts (one call each, on one machine):
#   PART=setup: the offline bundle and the modules compiled on the CPU machine (.fib/, lab/gpu_session.sh's set-up),
#     then the warm-up of every flashinfer lowering, 8 at a time: it compiles here the modules the pack lacks (the
#     CPU machine had time for 28 of the 42: fa2 in fp16 at D=64 and fa3's), packed into $OUT for the next machine;
#   PART=judge: the GPU-marked tests (not slow) with flashinfer importable; lab/fa2_golden.py (what flashinfer's fa2
#     kernel costs at large scores against a golden fp64 reference).
#   OUT=dir PART=setup bash lab/gpu_issue48_flashinfer.sh; OUT=dir PART=judge FA2_CASES=40 bash lab/gpu_issue48_flashinfer.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
FI=(context[flashinfer-fa2] context[flashinfer-fa3] decode_rows[flashinfer] decode_rows[flashinfer-tc]
    windowed_merge[flashinfer-eager] windowed_merge[flashinfer-compiled] windowed_merge[flashinfer-triton]
    windowed_merge[flashinfer-merge_state])
if [ "${PART:-setup}" = setup ]; then
  STEPS=none bash lab/gpu_session.sh > "$OUT/setup.log" 2>&1
  exec > >(tee -a "$OUT/flashinfer-setup.log") 2>&1
  head -6 "$OUT/setup.log"; grep -E "installed|^flashinfer" "$OUT/setup.log" | head -5
  git log -1 --format='tree %h' 2>/dev/null || true
  echo "== $(date -u +%T) the warm-up of every flashinfer lowering, 8 at a time (compiles what the pack lacks)"
  STEPS=prewarm PREWARM_JOBS=8 PREWARM_TIMEOUT=${PREWARM_TIMEOUT:-400} PREWARM_LOWERINGS="${FI[*]}" PACK_NAME=s30_gpu \
    bash lab/gpu_session.sh > "$OUT/prewarm.log" 2>&1
  grep -vE "^\s*$" "$OUT/prewarm.log" | grep -iE "exit code|module|packed|fail|error|s total|warm" | tail -25
  date -u +%T
  exit 0
fi
exec > >(tee -a "$OUT/flashinfer-judge.log") 2>&1
export PYTHONPATH=/tmp/site:$PWD TRITON_CACHE_DIR=/tmp/jit/triton TORCHINDUCTOR_CACHE_DIR=/tmp/jit/inductor
export DFLASH_PARITY_PYCACHE=/tmp/dflash-pycache
python3 -c "import flashinfer; print('flashinfer', flashinfer.__version__)"
echo "== $(date -u +%T) the GPU-marked tests, not slow (flashinfer importable)"
timeout ${TESTS_TIMEOUT:-200} python3 -m pytest tests -m "parity_gpu and not slow" -q -p no:cacheprovider -n 12 -rfs \
  --tb=short --junitxml="$OUT/gpu-tests-junit.xml" > "$OUT/gpu-tests.log" 2>&1
echo "pytest exit $?"
grep -E "^(FAILED|ERROR|SKIPPED)|passed|failed" "$OUT/gpu-tests.log" | tail -20
echo "== $(date -u +%T) lab/fa2_golden.py --cases ${FA2_CASES:-40}"
timeout ${FA2_TIMEOUT:-200} python3 lab/fa2_golden.py --cases ${FA2_CASES:-40} > "$OUT/fa2_golden.txt" 2>&1
echo "fa2_golden exit $?"; grep -v Warning "$OUT/fa2_golden.txt" | tail -20
date -u +%T
