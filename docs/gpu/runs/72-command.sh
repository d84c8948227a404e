# Run 72 (session 21): one H200 call over main at the commit named in the record; .fib/ carried; a fresh machine
# (cold Triton/inductor caches, as run 8's were).
# Issue 18. This tree draws each lowering's cases in a forked process while the check judges them
# (parity.draw_ahead; --draw-ahead auto: on for the gpu profile's 200 and run 11's 500 cases).
# 1. Run 8's command (isolated, all hardening, --jobs 16 --mps, production off) on cold caches, as run 63 ran it
#    (SIGTERM at 240 s): the rate per lowering against run 8's 2.2-3.2 cases/s.
# 2. Run 11's full command, pass 1 (its JIT caches partly filled by step 1), limit 150 s.
set -u
export PYTHONUNBUFFERED=1
STEPS=setup NO_FINAL_PACK=1 bash scripts/gpu_session.sh > /dev/null 2>&1
mv $OUT/gpu_session.log $OUT/setup.log 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD TRITON_CACHE_DIR=/tmp/jit/triton TORCHINDUCTOR_CACHE_DIR=/tmp/jit/inductor
export DFLASH_PARITY_PYCACHE=/tmp/dflash-pycache
rm -rf /tmp/report
STEPS=check CHECK_ARGS="--jobs 16 --mps --limit max_production_context=0 --limit max_production_batch=2 --limit models=none" \
  CHECK_TIMEOUT=240 NO_FINAL_PACK=1 bash scripts/gpu_session.sh > /dev/null 2>&1
mv $OUT/gpu_session.log $OUT/hardened-small.log
grep -E "^== |exit code|\[jobs\] (children|[0-9]+ process|.*done in)|  time |cases in|INTERRUPTED|FAIL|fail " $OUT/hardened-small.log | cut -c1-230 | head -60
SX="--shards windowed_merge[flashinfer-compiled]=5 --mps --limit max_production_context=0 --limit max_production_batch=2 --limit models=none"
STEPS=sweep SWEEP_FIRST_PASS=1 SWEEP_PASSES=1 SWEEP_JOBS=15 SWEEP_TIMEOUT=150 SWEEP_EXTRA="$SX" NO_FINAL_PACK=1 \
  bash scripts/gpu_session.sh > /dev/null 2>&1
mv $OUT/gpu_session.log $OUT/pass1.log
grep -E "^== fast|exit code|== CPU|== GPU|\[jobs\] (children|[0-9]+ process|.*done in)|cases in" $OUT/pass1.log | cut -c1-220
grep -h "  time " /tmp/sweep1/sweep.log
echo "all done"
