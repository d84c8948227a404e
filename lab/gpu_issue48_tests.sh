#!/usr/bin/env bash
# Issue 48 on the GPU: the GPU-marked tests, not slow, with every failure's traceback kept (run 100 kept 25 lines
# and left one of its three failures unnamed), then each failing test alone, once more.
#   OUT=dir bash lab/gpu_issue48_tests.sh
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
exec > >(tee -a "$OUT/tests.log") 2>&1
date -u +%Y-%m-%dT%H:%M:%SZ
nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv
python3 -c "import sys, torch, triton, hypothesis; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__, 'hypothesis', hypothesis.__version__)"
echo "== the GPU-marked tests, not slow"
timeout 240 python3 -m pytest tests -m "parity_gpu and not slow" -q -p no:cacheprovider -n 12 -rfs --tb=short \
  --junitxml="$OUT/gpu-tests-junit.xml" > "$OUT/gpu-tests.log" 2>&1
echo "pytest exit $?"
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/gpu-tests.log" | tail -20
for t in $(grep -E "^FAILED" "$OUT/gpu-tests.log" | awk '{print $2}' | sort -u); do
  echo "== alone: $t"
  timeout 120 python3 -m pytest "$t" -q -p no:cacheprovider --tb=long 2>&1 | tail -60
done
date -u +%Y-%m-%dT%H:%M:%SZ
