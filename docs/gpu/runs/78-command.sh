# Run 78 (session 23): one H200 call over main at the commit named in the record; .fib/ carried (the offline
# flashinfer bundle and session 22's 14-module pack); a fresh machine.
# 1. setup; 2. every flashinfer module the `gpu` profile (production off) needs for the 8 flashinfer lowerings,
#    compiled side by side (parity.warmup --jobs 16, a throwaway Triton cache); meanwhile 3. the GPU tests of
#    the oracle's kernel (one variant across storage, window-B mask and page-table dtype) and of the precompile;
#    4. the new modules packed in parts of at most 15 MB when the warm-up finished (else run 79 finishes it).
set -u
export PYTHONUNBUFFERED=1
STEPS=setup NO_FINAL_PACK=1 bash scripts/gpu_session.sh > /dev/null 2>&1
mv $OUT/gpu_session.log $OUT/setup.log 2>/dev/null; head -8 $OUT/setup.log
export PYTHONPATH=/tmp/site:$PWD DFLASH_PARITY_PYCACHE=/tmp/dflash-pycache
PROD_OFF="--limit max_production_context=0 --limit max_production_batch=2 --limit models=none"
FL="context[flashinfer-fa2] context[flashinfer-fa3] decode_rows[flashinfer] decode_rows[flashinfer-tc] windowed_merge[flashinfer-eager] windowed_merge[flashinfer-compiled] windowed_merge[flashinfer-triton] windowed_merge[flashinfer-merge_state]"
echo "== $(date -u +%T) warm-up of flashinfer's modules (background)"
( TRITON_CACHE_DIR=/tmp/jit-warm/triton TORCHINDUCTOR_CACHE_DIR=/tmp/jit-warm/inductor MAX_JOBS=2 timeout 420 \
  python3 -m parity.warmup --jobs 16 $PROD_OFF $FL > $OUT/warmup.log 2>&1; echo "warm-up exit $?" >> $OUT/warmup.log ) &
WPID=$!
echo "== $(date -u +%T) GPU tests: the oracle's kernel, specialization, precompile"
TRITON_CACHE_DIR=/tmp/jit-tests timeout 300 python3 -m pytest -q -p no:cacheprovider -rs tests/oracle/test_fast_engine.py \
  tests/lowerings/test_specialization.py tests/parity/test_precompile.py 2>&1 | tail -15
wait $WPID
echo "== $(date -u +%T) warm-up done"; grep -E "warm-up on|FAILED|exit" $OUT/warmup.log | tail -5
if grep -q "warm-up exit 0" $OUT/warmup.log; then
  python3 .fib/flashinfer_aot.py pack /tmp/fi_aot_s23.tar.xz 2>&1 | tail -1
  split -b 15m /tmp/fi_aot_s23.tar.xz $OUT/fi_aot_s23.tar.xz.part-; ls -la $OUT | grep part
fi
gzip -f $OUT/warmup.log
echo "all done $(date -u +%T)"
