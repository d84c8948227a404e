# Run 53 (session 16): one H200 call over main at the commit named in the record; .fib/ carried.
# Issue 18:
# 1. The yardstick's SDPA calls in fp32 (the math backend's own upcast done once, the additive mask built once per
#    batch): the same bits as before on production-scale cases? how much faster? (scripts/gpu_yardstick_ab.py)
# 2. The phase profile of run 52's fa2 line again with this code (same seed, --min-keys 4097): before/after.
# 3. Run 11's command (11 GPU lowerings x 500, --jobs 15, the compiled merge in 5 shards, seed 3, the fast-sweep
#    flags) with today's defaults, under `check --mps` (the Python path, first time on the GPU): pass 1, cold
#    Triton/inductor caches. Run 54 (the next call, on this machine while it is warm) is pass 2.
set -u
export PYTHONUNBUFFERED=1
STEPS=setup NO_FINAL_PACK=1 bash scripts/gpu_session.sh > /dev/null 2>&1
mv $OUT/gpu_session.log $OUT/setup.log 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD TRITON_CACHE_DIR=/tmp/jit/triton TORCHINDUCTOR_CACHE_DIR=/tmp/jit/inductor
start=$(date +%s)
timeout -s TERM -k 10 ${AB_LIMIT:-120} python3 scripts/gpu_yardstick_ab.py --cases 30 --min-keys 4097 > $OUT/ab.txt 2>&1
echo "== yardstick A/B: exit $? after $(( $(date +%s) - start )) s"; grep -v "_warn_once\|UserWarning" $OUT/ab.txt | tail -34
start=$(date +%s)
timeout -s TERM -k 10 ${PHASE_LIMIT:-90} python3 scripts/gpu_phase_profile.py --cases 40 --kernel-cases 6 --min-keys 4097 \
  'context[flashinfer-fa2]' > $OUT/fa2-after.txt 2>&1
echo "== phase profile fa2 (after): exit $? after $(( $(date +%s) - start )) s"
grep -E "^==|per case|device time" $OUT/fa2-after.txt | grep -v "warm-up"
STEPS=sweep SWEEP_JOBS=15 SWEEP_TIMEOUT=${SWEEP_LIMIT:-270} SWEEP_EXTRA="--shards windowed_merge[flashinfer-compiled]=5 --mps" \
  NO_FINAL_PACK=1 bash scripts/gpu_session.sh > /dev/null 2>&1
mv $OUT/gpu_session.log $OUT/pass1.log
grep -E "^== (fast|GPU)|exit code|^lowering|^---|pass |fail |INTERRUPTED|stopp|cases in|MPS|mps" $OUT/pass1.log | head -60
echo "all done"
