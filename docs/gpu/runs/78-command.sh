# Run 78 (session 22): run 77's machine, right after it (flashinfer's modules compiled there, run 77's B cache).
# Issue 18: run 11's command (11 GPU lowerings x 500, --jobs 15 --warm-up --no-hardening --no-isolate, the
# compiled merge in 5 shards, --mps, production off) with this tree: the shards of one lowering share one drawer
# (parity.draw_ahead.SharedDraws; drawers otherwise off, by auto), shared Triton compiles. Pass 1 fills the
# caches (limit 170 s); passes 2-5 are the warm figure.
set -u
export PYTHONUNBUFFERED=1
export PYTHONPATH=/tmp/site:$PWD DFLASH_PARITY_PYCACHE=/tmp/dflash-pycache
export TRITON_CACHE_DIR=/tmp/jit-B/triton TORCHINDUCTOR_CACHE_DIR=/tmp/jit-B/inductor
SX="--shards windowed_merge[flashinfer-compiled]=5 --mps --limit max_production_context=0 --limit max_production_batch=2 --limit models=none"
for pass in 1 2 3 4 5; do
  limit=60; [ $pass = 1 ] && limit=170
  STEPS=sweep SWEEP_FIRST_PASS=$pass SWEEP_PASSES=$pass SWEEP_JOBS=15 SWEEP_TIMEOUT=$limit SWEEP_EXTRA="$SX" NO_FINAL_PACK=1 \
    bash scripts/gpu_session.sh > /dev/null 2>&1
  mv $OUT/gpu_session.log $OUT/pass$pass.log
  grep -E "^== fast|exit code|== CPU|== GPU|\[jobs\] ([0-9]+ process|.*done in)|cases in" $OUT/pass$pass.log | cut -c1-200 | tail -22
  [ $pass -ge 2 ] && grep -h "  time " /tmp/sweep$pass/sweep.log
done
cd $OUT && tar -czf passes.tgz pass*.log sweep*.tgz && rm -f pass*.log sweep*.tgz
echo "all done $(date -u +%T)"
