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
OUT=$OUT bash lab/gpu_issue48_steps.sh  # 1. the oracle's and the yardstick's tests, 2. the GPU-marked tests
echo "== 3. run 11's command with fa3, per phase"
unset PYTHONPATH
OUT=$OUT FILL=${FILL:-150} PASSES=${PASSES:-2} bash lab/gpu_issue48_phases.sh 2>&1 | tail -40
echo "== 4. lab/oracle_phase_cost.py ${CASES:-5}"
PYTHONPATH=/tmp/site:$PWD timeout 60 python3 lab/oracle_phase_cost.py "${CASES:-5}" > /tmp/phase_cost.txt 2>&1
echo "exit $?"; tail -14 /tmp/phase_cost.txt
tar -C /tmp -czf "$OUT/logs.tgz" oracle-tests.log gpu-tests.log phase_cost.txt setup.log 2>/dev/null
date -u +%Y-%m-%dT%H:%M:%SZ
