# Issue 18, call 2 (see docs/gpu/next/README.md), on call 1's machine: run 8's command (isolated, all hardening,
# --jobs 16 --mps, production off; SIGTERM at 200 s as run 8) on empty Triton and inductor caches (/tmp/jit-C),
# flashinfer's modules installed, with the compile log: gpu_session.sh's `check` step (it sets up a fresh machine).
set -u
export PYTHONUNBUFFERED=1
PROD_OFF="--limit max_production_context=0 --limit max_production_batch=2 --limit models=none"
STEPS=check CHECK_ARGS="--jobs 16 --mps $PROD_OFF" CHECK_TIMEOUT=200 NO_FINAL_PACK=1 DFLASH_PARITY_COMPILE_LOG=$OUT/compiles-C.log \
  TRITON_CACHE_DIR=/tmp/jit-C/triton TORCHINDUCTOR_CACHE_DIR=/tmp/jit-C/inductor bash scripts/gpu_session.sh > /dev/null 2>&1
grep -E "exit code|\[jobs\] (children|[0-9]+ process|.*done in)|  time |cases in|INTERRUPTED|FAIL|fail " $OUT/gpu_session.log | cut -c1-230 | head -80
awk '{n[$2]++; s[$2]+=$4} END {for (k in n) printf "compile log: %s %d entries, %.1f s\n", k, n[k], s[k]}' $OUT/compiles-C.log
gzip -f $OUT/gpu_session.log $OUT/compiles-C.log
echo "all done $(date -u +%T)"
