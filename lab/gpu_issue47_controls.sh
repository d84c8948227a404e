#!/usr/bin/env bash
# Issue 47, the GPU record: the three correct computation orders of tests/controls.py at the gpu profile, 2,000 cases
# each (three shards apiece), and the oracle's measured error over 1,000 drawn cases on the GPU.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
exec > >(tee -a "$OUT/controls.log") 2>&1
date -u +%Y-%m-%dT%H:%M:%SZ
nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv
python3 -c "import sys, torch, triton; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__)"
(timeout 560 python3 scripts/oracle_error.py --device cuda --cases 1000 > "$OUT/oracle_error.txt" 2>&1; echo "oracle_error exit $?" >> "$OUT/oracle_error.txt") &
C='control[fp32-one-rounding]'; P='control[p-rounded]'; S='control[split-kv-4]'
timeout 540 python3 -m parity.front.cli check --device cuda --plugin tests/controls_plugin.py --profile gpu --max-examples 2000 \
  --lowering "$C" --lowering "$P" --lowering "$S" --jobs 9 --shards "$C=3" --shards "$P=3" --shards "$S=3" \
  --report /tmp/gpu-controls 2>&1 | grep -v "^\s*\[" | tail -25
wait
cat "$OUT/oracle_error.txt"
cp /tmp/gpu-controls/parity.json "$OUT/gpu_controls_parity.json" 2>/dev/null; cp /tmp/gpu-controls/summary.md "$OUT/gpu_controls_summary.md" 2>/dev/null
date -u +%Y-%m-%dT%H:%M:%SZ
