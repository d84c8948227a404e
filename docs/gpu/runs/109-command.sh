# run 109's call: OUT=$OUT FILL=150 PASSES=2 CASES=5 bash lab/gpu_issue48_final.sh
#!/usr/bin/env bash
# Issue 48 on the GPU, one call: the oracle's new launches compiled by the device's Triton (the oracle's and the
# yardstick's tests, the GPU-marked tests not slow), then run 11's command with fa3, this tree against main 1933668
# (.base/), with its per-phase table (lab/gpu_issue48_phases.sh), then lab/oracle_phase_cost.py while time is left.
#   OUT=dir FILL=150 PASSES=2 CASES=5 bash lab/gpu_issue48_final.sh
set -uo pipefail
export PYTHONUNBUFFERED=1 NO_FINAL_PACK=1
exec > >(tee -a "$OUT/final.log") 2>&1
date -u +%Y-%m-%dT%H:%M:%SZ
git log -1 --format='tree %h' 2>/dev/null || true
STEPS=none bash lab/gpu_session.sh > /tmp/setup.log 2>&1
head -3 /tmp/setup.log; grep -E "installed|flashinfer " /tmp/setup.log
export PYTHONPATH=/tmp/site:$PWD TRITON_CACHE_DIR=/tmp/jit/triton
echo "== 1. the oracle's and the yardstick's tests"
timeout 90 python3 -m pytest tests/oracle/test_fast_engine.py tests/oracle/test_precision.py tests/parity/test_yardstick.py \
  -q -p no:cacheprovider -n 12 -rfs --tb=short -k "not the_error_script" > /tmp/oracle-tests.log 2>&1
echo "pytest exit $?"; grep -E "^(FAILED|ERROR)|passed|failed" /tmp/oracle-tests.log | tail -8
echo "== 2. the GPU-marked tests, not slow"
timeout 100 python3 -m pytest tests -m "parity_gpu and not slow" -q -p no:cacheprovider -n 12 -rfs --tb=line \
  > /tmp/gpu-tests.log 2>&1
echo "pytest exit $?"; grep -E "^(FAILED|ERROR)|passed|failed" /tmp/gpu-tests.log | tail -12
echo "== 3. run 11's command with fa3, per phase"
unset PYTHONPATH
OUT=$OUT FILL=${FILL:-150} PASSES=${PASSES:-2} bash lab/gpu_issue48_phases.sh 2>&1 | tail -40
echo "== 4. lab/oracle_phase_cost.py ${CASES:-5}"
PYTHONPATH=/tmp/site:$PWD timeout 60 python3 lab/oracle_phase_cost.py "${CASES:-5}" > /tmp/phase_cost.txt 2>&1
echo "exit $?"; tail -14 /tmp/phase_cost.txt
tar -C /tmp -czf "$OUT/logs.tgz" oracle-tests.log gpu-tests.log phase_cost.txt setup.log 2>/dev/null
date -u +%Y-%m-%dT%H:%M:%SZ
