# Issue 18, call 2 (see docs/gpu/next/README.md), on call 1's machine: run 8's command (isolated, all hardening,
# --jobs 16 --mps, production off; SIGTERM at 200 s as run 8) on empty Triton and inductor caches (/tmp/jit-C),
# flashinfer's modules installed, with the compile log.
set -u
export PYTHONUNBUFFERED=1
[ -f /tmp/site/.dflash-installed ] || { echo "a fresh machine: setting up first"; STEPS=setup NO_FINAL_PACK=1 bash scripts/gpu_session.sh > /dev/null 2>&1; }
export PYTHONPATH=/tmp/site:$PWD DFLASH_PARITY_PYCACHE=/tmp/dflash-pycache
PROD_OFF="--limit max_production_context=0 --limit max_production_batch=2 --limit models=none"
echo "== $(date -u +%T) run 8's command, empty Triton and inductor caches"
export TRITON_CACHE_DIR=/tmp/jit-C/triton TORCHINDUCTOR_CACHE_DIR=/tmp/jit-C/inductor DFLASH_PARITY_COMPILE_LOG=$OUT/compiles-C.log
start=$(date +%s.%N)
timeout -s TERM -k 60 200 python3 -m parity.cli check --device cuda --profile gpu --report /tmp/report-C \
  --jobs 16 --mps $PROD_OFF > $OUT/run8-C.log 2>&1
echo "exit code: $?; wall $(python3 -c "import time;print(round(time.time()-$start,1))") s"
grep -E "\[jobs\] (children|[0-9]+ process|.*done in)|  time |cases in|INTERRUPTED|FAIL|fail |kernels: " $OUT/run8-C.log | cut -c1-230 | head -80
awk '{n[$2]++; s[$2]+=$4} END {for (k in n) printf "compile log: %s %d entries, %.1f s\n", k, n[k], s[k]}' $OUT/compiles-C.log
cp /tmp/report-C/parity.json $OUT/run8-C-parity.json 2>/dev/null; cp /tmp/report-C/summary.md $OUT/run8-C-summary.md 2>/dev/null
gzip -f $OUT/run8-C.log $OUT/compiles-C.log $OUT/run8-C-parity.json
echo "all done $(date -u +%T)"
