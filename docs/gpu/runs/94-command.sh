# Run 94 (session 27): run 11's command on the machine run 93 left warm (its Triton caches; flashinfer's modules):
# pass 1 fills the caches with the compiled merge in 10 shards (limit 130 s; not a figure of record), passes 2-4
# are run 11's command exactly (limit 40 s each); their figures against run 73's.
set -u
export PYTHONUNBUFFERED=1
STEPS=setup NO_FINAL_PACK=1 bash scripts/gpu_session.sh > /dev/null 2>&1; mv $OUT/gpu_session.log /tmp/setup94.log 2>/dev/null
head -3 /tmp/setup94.log; ls /tmp/jit-C/triton 2>/dev/null | wc -l | sed 's/^/Triton cache entries at the start: /'
export PYTHONPATH=/tmp/site:$PWD DFLASH_PARITY_PYCACHE=/tmp/dflash-pycache
export TRITON_CACHE_DIR=/tmp/jit-C/triton TORCHINDUCTOR_CACHE_DIR=/tmp/jit-C/inductor
PROD_OFF="--limit max_production_context=0 --limit max_production_batch=2 --limit models=none"
mkdir -p /tmp/r94
SX="--shards windowed_merge[flashinfer-compiled]=5 --mps $PROD_OFF"
for p in 1 2 3 4; do
  limit=40; X="$SX"; [ $p = 1 ] && limit=130 && X="${SX/=5/=10}"
  STEPS=sweep SWEEP_FIRST_PASS=$p SWEEP_PASSES=$p SWEEP_JOBS=15 SWEEP_TIMEOUT=$limit SWEEP_EXTRA="$X" NO_FINAL_PACK=1 \
    bash scripts/gpu_session.sh > /dev/null 2>&1
  echo "== pass $p"; grep -E "exit code|== CPU|== GPU|\[jobs\] [0-9]+ process|cases in|done in" $OUT/gpu_session.log | cut -c1-200 | head -24
  mv $OUT/gpu_session.log /tmp/r94/pass$p.log; cp /tmp/sweep$p/parity.json /tmp/r94/sweep$p-parity.json 2>/dev/null
  cp /tmp/sweep$p.log /tmp/r94/ 2>/dev/null; rm -f $OUT/sweep$p.tgz
done
python3 scripts/compare_figures.py docs/gpu/runs/73-sweep4-parity.json.gz /tmp/r94/sweep2-parity.json /tmp/r94/sweep3-parity.json /tmp/r94/sweep4-parity.json
cp /tmp/setup94.log /tmp/r94/ 2>/dev/null
(cd /tmp && tar -czf $OUT/run94.tgz r94)
echo "all done $(date -u +%T)"
