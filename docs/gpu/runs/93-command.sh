# Run 93 (session 27): run 8's command on a fresh machine, this tree (as run 92: the isolated workers' fork server
# forked from each --jobs child, 32 builder/oracle variants): 1. cold, exactly as run 8 (empty Triton and
# inductor caches, limit 150 s): a second cold sample after run 92's; 2. fill: the two torch.compile merges'
# remaining families compiled across processes (the same command with both sharded; limit 120 s; not a rate of
# record); 3-4. run 8's command exactly, twice, on those caches (limit 70 s each): per-lowering whole walls.
set -u
export PYTHONUNBUFFERED=1
STEPS=setup NO_FINAL_PACK=1 bash scripts/gpu_session.sh > /dev/null 2>&1; mv $OUT/gpu_session.log /tmp/setup.log 2>/dev/null; head -8 /tmp/setup.log
export PYTHONPATH=/tmp/site:$PWD DFLASH_PARITY_PYCACHE=/tmp/dflash-pycache
export TRITON_CACHE_DIR=/tmp/jit-C/triton TORCHINDUCTOR_CACHE_DIR=/tmp/jit-C/inductor
PROD_OFF="--limit max_production_context=0 --limit max_production_batch=2 --limit models=none"
mkdir -p /tmp/r93
run8() {  # $1 name, $2 limit, rest: extra args
  local name=$1 limit=$2; shift 2
  echo "== $(date -u +%T) run 8's command: $name (limit $limit s)"
  local start=$(date +%s.%N)
  DFLASH_PARITY_COMPILE_LOG=/tmp/r93/compiles-$name.log timeout -s TERM -k 20 $limit python3 -m parity.cli check \
    --device cuda --profile gpu --report /tmp/report-$name --mps $PROD_OFF "$@" > /tmp/r93/run8-$name.log 2>&1
  echo "exit code: $?; wall $(python3 -c "import time;print(round(time.time()-$start,1))") s"
  grep -E "\[jobs\] .*done in|  time |cases in|INTERRUPTED|FAIL|fail " /tmp/r93/run8-$name.log | cut -c1-200 | head -60
  grep -E "variants gone over" /tmp/r93/run8-$name.log | sed 's/.*kernels: //' | cut -c1-60 | sort | uniq -c | head -5
  awk '{n[$2]++; s[$2]+=$4} END {for (k in n) printf "compile log: %s %d entries, %.1f s\n", k, n[k], s[k]}' /tmp/r93/compiles-$name.log 2>/dev/null
  cp /tmp/report-$name/parity.json /tmp/r93/run8-$name-parity.json 2>/dev/null
  cp /tmp/report-$name/summary.md /tmp/r93/run8-$name-summary.md 2>/dev/null
}
run8 cold 150 --jobs 16
run8 fill 120 --jobs 16 --shards "windowed_merge[flashinfer-compiled]=8" --shards "windowed_merge[compiled]=4"
run8 warmA 70 --jobs 16
run8 warmB 70 --jobs 16
cp /tmp/setup.log /tmp/r93/
(cd /tmp && tar -czf $OUT/run93.tgz r93)
echo "all done $(date -u +%T)"
