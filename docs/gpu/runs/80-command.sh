# Run 80 (session 23): the machine of runs 78-79, the same tree. Run 11's command (production off, --mps, the
# compiled merge in 5 shards, --jobs 15) on the Triton/inductor caches runs 79's check and its stopped sweep left:
# passes 2-5 (limit 70 s each), then their figures compared with run 73's pass 4 (the same command and seed).
set -u
export PYTHONUNBUFFERED=1
export PYTHONPATH=/tmp/site:$PWD DFLASH_PARITY_PYCACHE=/tmp/dflash-pycache
SX="--shards windowed_merge[flashinfer-compiled]=5 --mps --limit max_production_context=0 --limit max_production_batch=2 --limit models=none"
for p in 2 3 4 5; do
  STEPS=sweep SWEEP_FIRST_PASS=$p SWEEP_PASSES=$p SWEEP_JOBS=15 SWEEP_TIMEOUT=70 SWEEP_EXTRA="$SX" NO_FINAL_PACK=1 \
    TRITON_CACHE_DIR=/tmp/jit-C/triton TORCHINDUCTOR_CACHE_DIR=/tmp/jit-C/inductor bash scripts/gpu_session.sh > /dev/null 2>&1
  echo "== pass $p"; grep -E "exit code|== CPU|== GPU|\[jobs\] [0-9]+ process|cases in" $OUT/gpu_session.log | cut -c1-220 | head -8
  mv $OUT/gpu_session.log $OUT/pass$p.log; gzip -f $OUT/pass$p.log
done
python3 scripts/compare_figures.py docs/gpu/runs/73-sweep4-parity.json.gz /tmp/sweep2/parity.json /tmp/sweep3/parity.json /tmp/sweep4/parity.json /tmp/sweep5/parity.json
(cd $OUT && tar -cf sweeps.tar sweep*.tgz && rm -f sweep*.tgz)
echo "all done $(date -u +%T)"
