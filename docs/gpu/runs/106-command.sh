#!/usr/bin/env bash
# Issue 48 on the GPU after ed9e9d7 (the oracle kernel's F64 variant converts to fp64 through an impure inline
# `cvt.f64.f32`, which triton 3.6 compiles): whether this Triton now runs the golden reference's fp64 on the kernel,
# the GPU tests of both fp64 engines and the bound, run 11's command (lab/gpu_issue48_run11.sh:
# this tree against main 1933668 in .base/, alternating), then, in the time left, the reference's measured error.
#   OUT=dir FILL=100 PASSES=2 EXCLUDE='context[flashinfer-fa3]' bash lab/gpu_issue48_f64.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
exec > >(tee -a "$OUT/f64.log") 2>&1
date -u +%Y-%m-%dT%H:%M:%SZ
git log -1 --format='tree %h' 2>/dev/null || true
STEPS=none bash lab/gpu_session.sh > "$OUT/setup.log" 2>&1
head -6 "$OUT/setup.log"; grep -E "installed|^flashinfer" "$OUT/setup.log" | head -8
export PYTHONPATH=/tmp/site:$PWD TRITON_CACHE_DIR=/tmp/jit/triton TORCHINDUCTOR_CACHE_DIR=/tmp/jit/inductor
export DFLASH_PARITY_PYCACHE=/tmp/dflash-pycache
echo "== $(date -u +%T) 1. does this Triton compile the F64 variant"
python3 -c "import torch, triton; from oracle import reference; print('triton', triton.__version__, 'triton_f64_ready', reference.triton_f64_ready(torch.device('cuda')))"
echo "== $(date -u +%T) 2. the GPU tests of the fast engine (both fp64 engines), the bound and the golden reference"
timeout 150 python3 -m pytest tests/oracle/test_fast_engine.py tests/oracle/test_precision.py \
  -q -p no:cacheprovider -n 8 -rfs --tb=short 2>&1 | tail -12
echo "== $(date -u +%T) 3. run 11's command"
bash lab/gpu_issue48_run11.sh
for f in "$OUT"/parity-*.json.gz; do
  python3 - "$f" <<'PY'
import gzip, json, sys
d = json.load(gzip.open(sys.argv[1]))
for name, v in d["lowerings"].items():
    print(sys.argv[1].rsplit("/", 1)[-1], name, v.get("status"), v.get("cases"), "oracle", v.get("oracle"))
PY
done 2>/dev/null | head -60
left=$(( ${BUDGET:-570} - SECONDS ))
if [ "$left" -gt 30 ]; then
  echo "== $(date -u +%T) 4. scripts/oracle_error.py --device cuda --cases ${ERR_CASES:-200} (limit $left s)"
  timeout $left python3 scripts/oracle_error.py --device cuda --cases ${ERR_CASES:-200} > "$OUT/oracle_error.txt" 2>&1
  echo "exit $?"; grep -v Warning "$OUT/oracle_error.txt" | tail -22
fi
date -u +%T
