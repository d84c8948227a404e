# Run 82 (session 24): one H200 call over main at the commit named in the record; .fib/ carried (the offline
# flashinfer bundle, session 22's 14-module pack and session 23's 26 modules in two parts); a fresh machine.
# 1. setup; 2. in the background, flashinfer's warm-up for the 8 flashinfer lowerings (production off; only fa3's
#    fp16 D=128 modules should be left to compile), then the new modules packed in parts of at most 15 MB;
# 3. meanwhile the GPU tests of the oracle's kernel (its KV_ROUNDED variant included), the yardstick and the
#    precompile; 4. run 11's command, pass 1, on a cache of its own (/tmp/jit-S): it fills Triton's and inductor's
#    caches for run 83's warm passes (not a figure).
set -u
export PYTHONUNBUFFERED=1
STEPS=setup NO_FINAL_PACK=1 bash scripts/gpu_session.sh > /dev/null 2>&1
mv $OUT/gpu_session.log $OUT/setup.log 2>/dev/null; head -8 $OUT/setup.log
export PYTHONPATH=/tmp/site:$PWD DFLASH_PARITY_PYCACHE=/tmp/dflash-pycache
PROD_OFF="--limit max_production_context=0 --limit max_production_batch=2 --limit models=none"
FL="context[flashinfer-fa2] context[flashinfer-fa3] decode_rows[flashinfer] decode_rows[flashinfer-tc] windowed_merge[flashinfer-eager] windowed_merge[flashinfer-compiled] windowed_merge[flashinfer-triton] windowed_merge[flashinfer-merge_state]"
echo "== $(date -u +%T) warm-up of flashinfer's modules (background)"
( TRITON_CACHE_DIR=/tmp/jit-warm/triton TORCHINDUCTOR_CACHE_DIR=/tmp/jit-warm/inductor MAX_JOBS=4 timeout 400 \
  python3 -m parity.warmup --jobs 16 $PROD_OFF $FL > $OUT/warmup.log 2>&1; echo "warm-up exit $?" >> $OUT/warmup.log ) &
WPID=$!
echo "== $(date -u +%T) GPU tests: the oracle's kernel, the yardstick, specialization, precompile"
TRITON_CACHE_DIR=/tmp/jit-tests timeout 240 python3 -m pytest -q -p no:cacheprovider -rs tests/oracle/test_fast_engine.py \
  tests/parity/test_yardstick.py tests/lowerings/test_specialization.py tests/parity/test_precompile.py 2>&1 | tail -15
echo "== $(date -u +%T) run 11's command, pass 1 (fills /tmp/jit-S)"
SX="--shards windowed_merge[flashinfer-compiled]=5 --mps $PROD_OFF"
STEPS=sweep SWEEP_FIRST_PASS=1 SWEEP_PASSES=1 SWEEP_JOBS=15 SWEEP_TIMEOUT=200 SWEEP_EXTRA="$SX" NO_FINAL_PACK=1 \
  TRITON_CACHE_DIR=/tmp/jit-S/triton TORCHINDUCTOR_CACHE_DIR=/tmp/jit-S/inductor bash scripts/gpu_session.sh > /dev/null 2>&1
grep -E "exit code|== CPU|== GPU|\[jobs\] [0-9]+ process|cases in" $OUT/gpu_session.log | cut -c1-220 | head -8
mv $OUT/gpu_session.log $OUT/pass1.log; gzip -f $OUT/pass1.log
wait $WPID
echo "== $(date -u +%T) warm-up done"; grep -E "warm-up on|FAILED|exit" $OUT/warmup.log | tail -5
python3 .fib/flashinfer_aot.py pack /tmp/fi_aot_s24.tar.xz 2>&1 | tail -1
split -b 15m /tmp/fi_aot_s24.tar.xz $OUT/fi_aot_s24.tar.xz.part-; ls -la $OUT | grep part
gzip -f $OUT/warmup.log
rm -f $OUT/sweep*.tgz
echo "all done $(date -u +%T)"
