# Run 85 (session 24): the machine of run 84, the same tree: run 11's command, passes 8-9 (limit 60 s each) on the
# caches passes 5-7 filled (/tmp/jit-S), then their figures compared with run 73's pass 4.
set -u
export PYTHONUNBUFFERED=1
export PYTHONPATH=/tmp/site:$PWD DFLASH_PARITY_PYCACHE=/tmp/dflash-pycache
SX="--shards windowed_merge[flashinfer-compiled]=5 --mps --limit max_production_context=0 --limit max_production_batch=2 --limit models=none"
for p in 8 9; do
  STEPS=sweep SWEEP_FIRST_PASS=$p SWEEP_PASSES=$p SWEEP_JOBS=15 SWEEP_TIMEOUT=60 SWEEP_EXTRA="$SX" NO_FINAL_PACK=1 \
    TRITON_CACHE_DIR=/tmp/jit-S/triton TORCHINDUCTOR_CACHE_DIR=/tmp/jit-S/inductor bash scripts/gpu_session.sh > /dev/null 2>&1
  echo "== pass $p"; grep -E "exit code|== CPU|== GPU|\[jobs\] [0-9]+ process|cases in|done in" $OUT/gpu_session.log | cut -c1-220 | head -24
  mv $OUT/gpu_session.log $OUT/pass$p.log; gzip -f $OUT/pass$p.log
  cp /tmp/sweep$p/parity.json $OUT/sweep$p-parity.json; gzip -f $OUT/sweep$p-parity.json
done
python3 scripts/compare_figures.py docs/gpu/runs/73-sweep4-parity.json.gz /tmp/sweep8/parity.json /tmp/sweep9/parity.json
rm -f $OUT/sweep*.tgz
echo "all done $(date -u +%T)"
