# Run 57 (session 17): one H200 call over main at the commit named in the record; .fib/ carried; run 56's machine,
# still warm.
# Issue 18: run 11's command (11 GPU lowerings x 500, --jobs 15, the compiled merge in 5 shards, seed 3, the
# fast-sweep flags) under `--mps`, with the production dimension off (`--limit max_production_context=0
# --limit max_production_batch=2 --limit models=none`: the small shapes of run 11's day, before the `gpu` profile
# drew production-scale cases). Pass 1 fills the Triton/inductor caches (SIGTERM at 250 s), pass 2 is the warm
# figure (SIGTERM at 200 s).
set -u
export PYTHONUNBUFFERED=1
STEPS=setup NO_FINAL_PACK=1 bash scripts/gpu_session.sh > /dev/null 2>&1
mv $OUT/gpu_session.log $OUT/setup.log 2>/dev/null
STEPS=sweep SWEEP_PASSES=2 SWEEP_JOBS=15 SWEEP_TIMEOUT=${SWEEP_LIMIT:-250} SWEEP_TIMEOUT_LATER=${SWEEP_LIMIT2:-200} \
  SWEEP_EXTRA="--shards windowed_merge[flashinfer-compiled]=5 --mps --limit max_production_context=0 --limit max_production_batch=2 --limit models=none" \
  NO_FINAL_PACK=1 bash scripts/gpu_session.sh > /dev/null 2>&1
mv $OUT/gpu_session.log $OUT/small.log
grep -E "^== (fast|GPU)|exit code|^lowering|^---|pass |fail |INTERRUPTED|stopp|cases in|MPS|mps" $OUT/small.log | head -80
echo "all done"
