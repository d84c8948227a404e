#!/usr/bin/env bash
# Issue 48 on the GPU: the oracle's and the yardstick's tests, then the GPU-marked tests not slow (steps 1-2 of
# lab/gpu_issue48_final.sh), on a machine lab/gpu_session.sh has set up. Their logs come back in OUT/tests.tgz.
#   OUT=dir bash lab/gpu_issue48_steps.sh
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD TRITON_CACHE_DIR=/tmp/jit/triton
date -u +%Y-%m-%dT%H:%M:%SZ
echo "== 1. the oracle's and the yardstick's tests"
timeout 90 python3 -m pytest tests/oracle/test_fast_engine.py tests/oracle/test_precision.py tests/parity/test_yardstick.py \
  -q -p no:cacheprovider -n 12 -rfs --tb=short -k "not the_error_script" > /tmp/oracle-tests.log 2>&1
echo "pytest exit $?"; grep -E "^(FAILED|ERROR)|passed|failed" /tmp/oracle-tests.log | tail -8
echo "== 2. the GPU-marked tests, not slow"
timeout 100 python3 -m pytest tests -m "parity_gpu and not slow" -q -p no:cacheprovider -n 12 -rfs --tb=line \
  > /tmp/gpu-tests.log 2>&1
echo "pytest exit $?"; grep -E "^(FAILED|ERROR)|passed|failed" /tmp/gpu-tests.log | tail -12
tar -C /tmp -czf "$OUT/tests.tgz" oracle-tests.log gpu-tests.log
date -u +%Y-%m-%dT%H:%M:%SZ
