# Issue 18, call 1 (see docs/gpu/next/README.md): setup; run 11's command, a long first pass on empty caches
# (/tmp/jit-S; limit 300 s), then passes 2-4 (limit 60 s each), their figures compared with run 73's pass 4.
set -u
export PYTHONUNBUFFERED=1
STEPS=setup NO_FINAL_PACK=1 bash scripts/gpu_session.sh > /dev/null 2>&1
mv $OUT/gpu_session.log $OUT/setup.log 2>/dev/null; head -8 $OUT/setup.log
export PYTHONPATH=/tmp/site:$PWD DFLASH_PARITY_PYCACHE=/tmp/dflash-pycache
SX="--shards windowed_merge[flashinfer-compiled]=5 --mps --limit max_production_context=0 --limit max_production_batch=2 --limit models=none"
for p in 1 2 3 4; do
  limit=60; [ $p = 1 ] && limit=300
  STEPS=sweep SWEEP_FIRST_PASS=$p SWEEP_PASSES=$p SWEEP_JOBS=15 SWEEP_TIMEOUT=$limit SWEEP_EXTRA="$SX" NO_FINAL_PACK=1 \
    TRITON_CACHE_DIR=/tmp/jit-S/triton TORCHINDUCTOR_CACHE_DIR=/tmp/jit-S/inductor bash scripts/gpu_session.sh > /dev/null 2>&1
  echo "== pass $p"; grep -E "exit code|== CPU|== GPU|\[jobs\] [0-9]+ process|cases in|done in" $OUT/gpu_session.log | cut -c1-220 | head -24
  mv $OUT/gpu_session.log $OUT/pass$p.log; gzip -f $OUT/pass$p.log
  cp /tmp/sweep$p/parity.json $OUT/sweep$p-parity.json 2>/dev/null && gzip -f $OUT/sweep$p-parity.json
done
python3 scripts/compare_figures.py docs/gpu/runs/73-sweep4-parity.json.gz /tmp/sweep2/parity.json /tmp/sweep3/parity.json /tmp/sweep4/parity.json
rm -f $OUT/sweep*.tgz
echo "all done $(date -u +%T)"
