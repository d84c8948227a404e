# Run 92 (session 27): on a fresh machine, this tree (the isolated workers' fork server forked from each --jobs
# child instead of a fresh interpreter: parity.forked_server; the builder's 32 variants; each child's start-up
# line): 1. one process's precompile alone on an empty Triton cache (the cost of a compile without contention);
# 2. run 8's command exactly on empty Triton and inductor caches (limit 150 s; the 14 lowerings without a
# torch.compile family finish well before); 3. run 11's command: pass 1 fills the caches (the compiled merge in 10
# shards, limit 130 s, not a figure of record), passes 2-3 are run 11's command exactly (limit 40 s each).
set -u
export PYTHONUNBUFFERED=1
STEPS=setup NO_FINAL_PACK=1 bash scripts/gpu_session.sh > /dev/null 2>&1; mv $OUT/gpu_session.log /tmp/setup.log 2>/dev/null
head -8 /tmp/setup.log
export PYTHONPATH=/tmp/site:$PWD DFLASH_PARITY_PYCACHE=/tmp/dflash-pycache
PROD_OFF="--limit max_production_context=0 --limit max_production_batch=2 --limit models=none"
mkdir -p /tmp/r92
echo "== $(date -u +%T) one process's precompile alone, empty Triton cache"
TRITON_CACHE_DIR=/tmp/jit-A/triton TORCHINDUCTOR_CACHE_DIR=/tmp/jit-A/inductor DFLASH_PARITY_COMPILE_LOG=/tmp/r92/compiles-alone.log \
  timeout 120 python3 -m parity.cli check --device cuda --lowering context --max-examples 1 --warm-up --no-hardening \
  --no-isolate $PROD_OFF --report /tmp/report-alone > /tmp/r92/alone.log 2>&1; echo "exit code: $?"
grep -E "variants gone over" /tmp/r92/alone.log | cut -c1-250
awk '{n[$2]++; s[$2]+=$4} END {for (k in n) printf "compile log (alone): %s %d entries, %.1f s, %.2f s each\n", k, n[k], s[k], s[k]/n[k]}' /tmp/r92/compiles-alone.log
export TRITON_CACHE_DIR=/tmp/jit-C/triton TORCHINDUCTOR_CACHE_DIR=/tmp/jit-C/inductor
echo "== $(date -u +%T) run 8's command, cold (limit 150 s)"; start=$(date +%s.%N)
DFLASH_PARITY_COMPILE_LOG=/tmp/r92/compiles-cold.log timeout -s TERM -k 20 150 python3 -m parity.cli check --device cuda \
  --profile gpu --report /tmp/report-cold --mps $PROD_OFF --jobs 16 > /tmp/r92/run8-cold.log 2>&1
echo "exit code: $?; wall $(python3 -c "import time;print(round(time.time()-$start,1))") s"
grep -E "\[jobs\] .*done in|  time |variants gone over|its cases start|cases in|INTERRUPTED|FAIL|fail " /tmp/r92/run8-cold.log | cut -c1-230 | head -70
echo "fork server lines: $(grep -c "fork server: forked" /tmp/r92/run8-cold.log) forked, $(grep -c "fork server: a fresh" /tmp/r92/run8-cold.log) fresh"
awk '{n[$2]++; s[$2]+=$4} END {for (k in n) printf "compile log: %s %d entries, %.1f s\n", k, n[k], s[k]}' /tmp/r92/compiles-cold.log
cp /tmp/report-cold/parity.json /tmp/r92/run8-cold-parity.json; cp /tmp/report-cold/summary.md /tmp/r92/run8-cold-summary.md
SX="--shards windowed_merge[flashinfer-compiled]=5 --mps $PROD_OFF"
for p in 1 2 3; do
  limit=40; X="$SX"; [ $p = 1 ] && limit=130 && X="${SX/=5/=10}"
  STEPS=sweep SWEEP_FIRST_PASS=$p SWEEP_PASSES=$p SWEEP_JOBS=15 SWEEP_TIMEOUT=$limit SWEEP_EXTRA="$X" NO_FINAL_PACK=1 \
    bash scripts/gpu_session.sh > /dev/null 2>&1
  echo "== pass $p"; grep -E "exit code|== CPU|== GPU|\[jobs\] [0-9]+ process|cases in|done in" $OUT/gpu_session.log | cut -c1-200 | head -24
  grep -E "its cases start" /tmp/sweep$p.log | cut -c1-200
  mv $OUT/gpu_session.log /tmp/r92/pass$p.log; cp /tmp/sweep$p/parity.json /tmp/r92/sweep$p-parity.json 2>/dev/null
  cp /tmp/sweep$p.log /tmp/r92/ 2>/dev/null; rm -f $OUT/sweep$p.tgz
done
python3 scripts/compare_figures.py docs/gpu/runs/73-sweep4-parity.json.gz /tmp/r92/sweep2-parity.json /tmp/r92/sweep3-parity.json
cp /tmp/setup.log /tmp/r92/
(cd /tmp && tar -czf $OUT/run92.tgz r92)
echo "all done $(date -u +%T)"
