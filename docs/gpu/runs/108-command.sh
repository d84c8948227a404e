# run 108's call: OUT=$OUT CASES=15 bash lab/gpu_issue48_oracle.sh (tree de95954's parent with the change uncommitted; this script as it was)
#!/usr/bin/env bash
# Issue 48 on the GPU: the oracle phase's new launches (the statistics kernel, the split merge with the output's
# figures, fp64 on the GPU) compiled by the device's Triton: the oracle's and the yardstick's tests, the GPU-marked
# tests (not slow), then lab/oracle_phase_cost.py (the oracle phase and the yardstick per drawn case, fp64 against
# fp32 on drawn and production shapes). Logs under $OUT.
#   OUT=dir CASES=15 bash lab/gpu_issue48_oracle.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
exec > >(tee -a "$OUT/oracle.log") 2>&1
date -u +%Y-%m-%dT%H:%M:%SZ
git log -1 --format='tree %h' 2>/dev/null || true
STEPS=none bash lab/gpu_session.sh > /tmp/setup.log 2>&1
head -3 /tmp/setup.log
export PYTHONPATH=/tmp/site:$PWD TRITON_CACHE_DIR=/tmp/jit/triton
echo "== 1. the oracle's, the yardstick's and the precompile's tests"
timeout 150 python3 -m pytest tests/oracle tests/parity/test_yardstick.py tests/parity/test_precompile.py -q \
  -p no:cacheprovider -n 12 -rfs --tb=short -k "not the_error_script" > "$OUT/oracle-tests.log" 2>&1
echo "pytest exit $?"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/oracle-tests.log" | tail -12
echo "== 2. lab/oracle_phase_cost.py ${CASES:-15}"
timeout 150 python3 lab/oracle_phase_cost.py "${CASES:-15}" > "$OUT/phase_cost.txt" 2>&1
echo "exit $?"; tail -16 "$OUT/phase_cost.txt"
echo "== 3. the GPU-marked tests, not slow (fa3's modules absent: its tests fail or skip)"
timeout 170 python3 -m pytest tests -m "parity_gpu and not slow" -q -p no:cacheprovider -n 12 -rfs --tb=line \
  > "$OUT/gpu-tests.log" 2>&1
echo "pytest exit $?"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/gpu-tests.log" | tail -25
date -u +%Y-%m-%dT%H:%M:%SZ
