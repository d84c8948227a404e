#!/usr/bin/env bash
# Issue 47, first GPU call: the golden oracle and the working-dtype yardstick compiled and checked on the GPU, what
# they cost per case, the oracle's measured error over drawn cases, and the controls at the gpu profile.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
exec > >(tee -a "$OUT/probe.log") 2>&1
date -u +%Y-%m-%dT%H:%M:%SZ
nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv
python3 -c "import sys, torch, triton, hypothesis; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__, 'hypothesis', hypothesis.__version__)"
echo "== 1. GPU tests of the oracle, the bound and the yardstick"
timeout 240 python3 -m pytest tests/oracle/test_fast_engine.py tests/oracle/test_precision.py tests/parity/test_yardstick.py \
  tests/parity/test_controls.py -q -p no:cacheprovider -n 8 -k "not the_error_script" 2>&1 | tail -15
echo "== 2. the golden reference's cost per case (gpu profile)"
timeout 120 python3 lab/golden_cost.py 40 2>&1 | tail -12
echo "== 3. the oracle's measured error on the GPU"
timeout 120 python3 scripts/oracle_error.py --device cuda --cases 300 2>&1 | tail -20
echo "== 4. the controls at the gpu profile (calibration)"
timeout 150 python3 -m parity.front.cli check --device cuda --plugin tests/controls_plugin.py --profile gpu --max-examples 100 \
  --lowering "control[fp32-one-rounding]" --lowering "control[p-rounded]" --lowering "control[split-kv-4]" \
  --jobs 3 --report "$OUT/controls" 2>&1 | grep -v "^\s*\[" | tail -20
date -u +%Y-%m-%dT%H:%M:%SZ
