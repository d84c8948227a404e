# Run 54 (session 16): one H200 call over main at the commit named in the record; .fib/ carried; the machine of
# run 53, still warm (its Triton/inductor caches hold what pass 1 compiled).
# Issue 18:
# 1. Run 11's command under `check --mps`, pass 2: the warm-JIT figure (SIGTERM at 200 s, partial report kept).
# 2. Run 8's command, the hardened `gpu` record (every lowering, isolated, every hardening check, --jobs 16),
#    under `--mps` (SIGTERM at 240 s).
set -u
export PYTHONUNBUFFERED=1
STEPS=setup NO_FINAL_PACK=1 bash scripts/gpu_session.sh > /dev/null 2>&1
mv $OUT/gpu_session.log $OUT/setup.log 2>/dev/null
ls /tmp/jit/triton 2>/dev/null | wc -l | sed 's/^/== Triton cache entries left by run 53: /'
STEPS=sweep SWEEP_FIRST_PASS=2 SWEEP_PASSES=2 SWEEP_JOBS=15 SWEEP_TIMEOUT=${SWEEP_LIMIT:-200} \
  SWEEP_EXTRA="--shards windowed_merge[flashinfer-compiled]=5 --mps" NO_FINAL_PACK=1 bash scripts/gpu_session.sh > /dev/null 2>&1
mv $OUT/gpu_session.log $OUT/pass2.log
grep -E "^== (fast|GPU)|exit code|^lowering|^---|pass |fail |INTERRUPTED|stopp|cases in|MPS|mps" $OUT/pass2.log | head -60
STEPS=check CHECK_ARGS="--jobs 16 --mps" CHECK_TIMEOUT=${CHECK_LIMIT:-240} NO_FINAL_PACK=1 bash scripts/gpu_session.sh > /dev/null 2>&1
mv $OUT/gpu_session.log $OUT/hardened.log
grep -E "^== |exit code|^lowering|^---|pass |fail |FAIL|unavailable|INTERRUPTED|stopp|cases in|MPS|mps" $OUT/hardened.log | head -60
echo "all done"
