# Run 88 (session 26): run 8's command on caches that hold every compile its cases need (a runner that keeps its
# Triton and inductor caches), this tree (one device-memory query per step: parity.memory.cached_unused_bytes).
# 1. fill: run 8's command with the two torch.compile merges sharded (the same cases; their inductor families
#    compiled across processes; limit 190 s; cold, so not a rate of record); 2-3. run 8's command exactly, twice
#    (limit 110 s each): per-lowering whole walls from "[jobs] X: done in" and the time lines.
set -u
export PYTHONUNBUFFERED=1
STEPS=setup NO_FINAL_PACK=1 bash scripts/gpu_session.sh > /dev/null 2>&1; mv $OUT/gpu_session.log /tmp/setup.log 2>/dev/null; head -8 /tmp/setup.log
export PYTHONPATH=/tmp/site:$PWD DFLASH_PARITY_PYCACHE=/tmp/dflash-pycache
export TRITON_CACHE_DIR=/tmp/jit-C/triton TORCHINDUCTOR_CACHE_DIR=/tmp/jit-C/inductor
PROD_OFF="--limit max_production_context=0 --limit max_production_batch=2 --limit models=none"
mkdir -p /tmp/r88
run8() {  # $1 name, $2 limit, rest: extra args
  local name=$1 limit=$2; shift 2
  echo "== $(date -u +%T) run 8's command: $name (limit $limit s)"
  local start=$(date +%s.%N)
  timeout -s TERM -k 20 $limit python3 -m parity.cli check --device cuda --profile gpu --report /tmp/report-$name \
    --mps $PROD_OFF "$@" > /tmp/r88/run8-$name.log 2>&1
  echo "exit code: $?; wall $(python3 -c "import time;print(round(time.time()-$start,1))") s"
  grep -E "\[jobs\] .*done in|  time |variants gone over|cases in|INTERRUPTED|FAIL|fail " /tmp/r88/run8-$name.log | cut -c1-200 | head -60
  cp /tmp/report-$name/parity.json /tmp/r88/run8-$name-parity.json 2>/dev/null
  cp /tmp/report-$name/summary.md /tmp/r88/run8-$name-summary.md 2>/dev/null
}
DFLASH_PARITY_COMPILE_LOG=/tmp/r88/compiles-fill.log run8 fill 190 --jobs 16 \
  --shards "windowed_merge[flashinfer-compiled]=6" --shards "windowed_merge[compiled]=3"
awk '{n[$2]++; s[$2]+=$4} END {for (k in n) printf "compile log: %s %d entries, %.1f s\n", k, n[k], s[k]}' /tmp/r88/compiles-fill.log
for p in warmA warmB; do
  DFLASH_PARITY_COMPILE_LOG=/tmp/r88/compiles-$p.log run8 $p 110 --jobs 16
  awk '{n[$2]++; s[$2]+=$4} END {for (k in n) printf "compile log: %s %d entries, %.1f s\n", k, n[k], s[k]}' /tmp/r88/compiles-$p.log 2>/dev/null
done
cp /tmp/setup.log /tmp/r88/
(cd /tmp && tar -czf $OUT/run88.tgz r88)
echo "all done $(date -u +%T)"
