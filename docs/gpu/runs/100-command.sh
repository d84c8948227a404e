#!/usr/bin/env bash
# Issue 48 on the GPU: the layered house's quick pass. The GPU-marked tests (not slow), run 97's GPU tests of the
# oracle, its bound, the yardstick and the controls, then run 99's command (the controls at the gpu profile, three
# shards each, --jobs 9: the front, the jobs, the prefork, the isolated workers and the engine of the new packages)
# stopped by SIGTERM after 120 s, so its report holds what ran (rates to compare with run 99's), and `list`.
#   OUT=dir bash lab/gpu_issue48_quick.sh
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
exec > >(tee -a "$OUT/quick.log") 2>&1
date -u +%Y-%m-%dT%H:%M:%SZ
git log -1 --format='tree %h' 2>/dev/null || true
nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv
python3 -c "import sys, torch, triton, hypothesis; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__, 'hypothesis', hypothesis.__version__)"
echo "== 1. the GPU-marked tests, not slow"
timeout 150 python3 -m pytest tests -m "parity_gpu and not slow" -q -p no:cacheprovider -n 12 -rs 2>&1 | tail -25
echo "== 2. run 97's GPU tests of the oracle, the bound, the yardstick and the controls"
timeout 100 python3 -m pytest tests/oracle/test_fast_engine.py tests/oracle/test_precision.py tests/parity/test_yardstick.py \
  tests/parity/test_controls.py -q -p no:cacheprovider -n 12 -k "not the_error_script" 2>&1 | tail -6
echo "== 3. run 99's command, SIGTERM after 120 s"
C='control[fp32-one-rounding]'; P='control[p-rounded]'; S='control[split-kv-4]'
timeout -s TERM 120 python3 -m parity.front.cli check --device cuda --plugin tests/controls_plugin.py --profile gpu \
  --max-examples 2000 --lowering "$C" --lowering "$P" --lowering "$S" --jobs 9 --shards "$C=3" --shards "$P=3" \
  --shards "$S=3" --report /tmp/gpu-controls 2>&1 | grep -v "^\s*\[" | tail -25
echo "check exit ${PIPESTATUS[0]}"
cp /tmp/gpu-controls/summary.md "$OUT/controls_summary.md" 2>/dev/null
echo "== 4. list"
timeout 60 python3 -m parity.front.cli list --device cuda 2>&1 | tail -30
date -u +%Y-%m-%dT%H:%M:%SZ
