# Run 76 (session 22): one H200 call over main at the commit named in the record; .fib/ carried (the offline
# flashinfer bundle, no packed modules); a fresh machine.
# Issue 18: run 8's command on cold Triton/inductor caches, the A side: Triton's own file cache (every process
# that misses a kernel compiles it), counting each compile (scripts/unshared_compile_cache.py). Run 77 is the B
# side (parity.shared_compile_cache: one compile per kernel across the processes), on this machine.
# 1. setup; 2. flashinfer's modules compiled side by side (parity.warmup; a throwaway Triton cache) and packed
#    into $OUT for the next machine; 3. run 8's command (isolated, all hardening, --jobs 16 --mps, production
#    off; SIGTERM at 200 s as run 8), Triton and inductor caches empty.
set -u
export PYTHONUNBUFFERED=1
STEPS=setup NO_FINAL_PACK=1 bash scripts/gpu_session.sh > /dev/null 2>&1
mv $OUT/gpu_session.log $OUT/setup.log 2>/dev/null; cat $OUT/setup.log | head -8
export PYTHONPATH=/tmp/site:$PWD DFLASH_PARITY_PYCACHE=/tmp/dflash-pycache
PROD_OFF="--limit max_production_context=0 --limit max_production_batch=2 --limit models=none"
python3 -c "import os; os.environ['TRITON_CACHE_MANAGER']='parity.shared_compile_cache:SharedCompileCache'
from triton.runtime.cache import get_cache_manager; print('cache manager:', type(get_cache_manager('ab' * 16)).__name__)"
TRITON_CACHE_DIR=/tmp/jit-pytest python3 -m pytest -q -p no:cacheprovider tests/parity/test_shared_compiles.py 2>&1 | tail -2
echo "== $(date -u +%T) warm-up of flashinfer's modules"
FL="context[flashinfer-fa2] context[flashinfer-fa3] decode_rows[flashinfer] decode_rows[flashinfer-tc] windowed_merge[flashinfer-eager] windowed_merge[flashinfer-compiled] windowed_merge[flashinfer-triton] windowed_merge[flashinfer-merge_state]"
TRITON_CACHE_DIR=/tmp/jit-warm/triton TORCHINDUCTOR_CACHE_DIR=/tmp/jit-warm/inductor MAX_JOBS=2 timeout 300 \
  python3 -m parity.warmup --jobs 8 $PROD_OFF $FL > $OUT/warmup.log 2>&1; echo "warm-up exit $?"; tail -14 $OUT/warmup.log
python3 .fib/flashinfer_aot.py pack $OUT/fi_aot_s22.tar.xz 2>&1 | tail -1; ls -la $OUT/fi_aot_s22.tar.xz
echo "== $(date -u +%T) run 8's command, unshared Triton cache (A)"
export TRITON_CACHE_DIR=/tmp/jit-A/triton TORCHINDUCTOR_CACHE_DIR=/tmp/jit-A/inductor DFLASH_PARITY_COMPILE_LOG=$OUT/compiles-A.log
start=$(date +%s.%N)
PYTHONPATH=$PWD/scripts:$PYTHONPATH TRITON_CACHE_MANAGER=unshared_compile_cache:UnsharedCompileCache \
  timeout -s TERM -k 60 200 python3 -m parity.cli check --device cuda --profile gpu --report /tmp/report-A \
  --jobs 16 --mps $PROD_OFF > $OUT/run8-A.log 2>&1
echo "exit code: $?; wall $(python3 -c "import time;print(round(time.time()-$start,1))") s"
grep -E "\[jobs\] (children|[0-9]+ process|.*done in)|  time |cases in|INTERRUPTED|FAIL|fail " $OUT/run8-A.log | cut -c1-230 | head -60
awk '{n[$2]++; s[$2]+=$4} END {for (k in n) printf "compile log A: %s %d entries, %.1f s\n", k, n[k], s[k]}' $OUT/compiles-A.log
cp /tmp/report-A/parity.json $OUT/run8-A-parity.json 2>/dev/null; cp /tmp/report-A/summary.md $OUT/run8-A-summary.md 2>/dev/null
gzip -f $OUT/run8-A.log $OUT/compiles-A.log $OUT/run8-A-parity.json $OUT/warmup.log
echo "all done $(date -u +%T)"
