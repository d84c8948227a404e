# Run 51 (session 15): one H200 call over main at the commit named in the record; .fib/ carried; the machine of
# runs 48-50 (warm: its Triton/inductor caches hold what they compiled).
# Issue 18: run 11's command (all 11 GPU lowerings x 500 cases, --jobs 11, seed 3, the fast-sweep flags) with
# today's defaults (production scale on), under CUDA MPS; two passes: the first fills the JIT caches, the second
# is the warm-JIT figure. SIGTERM at 260 s each (partial reports kept).
set -u
export PYTHONUNBUFFERED=1
STEPS=setup NO_FINAL_PACK=1 bash scripts/gpu_session.sh > /dev/null 2>&1
mv $OUT/gpu_session.log $OUT/setup.log 2>/dev/null
STEPS=sweep SWEEP_PASSES=2 SWEEP_TIMEOUT=${SWEEP_LIMIT:-260} NO_FINAL_PACK=1 MPS=1 bash scripts/gpu_session.sh > /dev/null 2>&1
grep -E "^== (fast|GPU|CUDA)|exit code|^lowering|^---|pass |fail |INTERRUPTED|time |cases in" $OUT/gpu_session.log
echo "all done"
