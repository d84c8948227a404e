# Run 95 (session 27): run 92's first two steps again on another fresh machine, the same tree: 1. one process's
# precompile alone on an empty Triton cache (which also fills torch's bytecode cache, DFLASH_PARITY_PYCACHE: this
# image ships torch without bytecode); 2. run 8's command exactly on empty Triton and inductor caches (limit 150 s).
# A third cold sample: run 92 ran it after step 1 (bytecode cached), run 93 without it (bytecode compiled by the run).
set -u
export PYTHONUNBUFFERED=1
STEPS=setup NO_FINAL_PACK=1 bash scripts/gpu_session.sh > /dev/null 2>&1; mv $OUT/gpu_session.log /tmp/setup.log 2>/dev/null
head -8 /tmp/setup.log
export PYTHONPATH=/tmp/site:$PWD DFLASH_PARITY_PYCACHE=/tmp/dflash-pycache
PROD_OFF="--limit max_production_context=0 --limit max_production_batch=2 --limit models=none"
mkdir -p /tmp/r95
echo "== $(date -u +%T) one process's precompile alone, empty Triton cache"
TRITON_CACHE_DIR=/tmp/jit-A/triton TORCHINDUCTOR_CACHE_DIR=/tmp/jit-A/inductor DFLASH_PARITY_COMPILE_LOG=/tmp/r95/compiles-alone.log \
  timeout 120 python3 -m parity.cli check --device cuda --lowering context --max-examples 1 --warm-up --no-hardening \
  --no-isolate $PROD_OFF --report /tmp/report-alone > /tmp/r95/alone.log 2>&1; echo "exit code: $?"
grep -E "variants gone over" /tmp/r95/alone.log | cut -c1-250
awk '{n[$2]++; s[$2]+=$4} END {for (k in n) printf "compile log (alone): %s %d entries, %.1f s, %.2f s each\n", k, n[k], s[k], s[k]/n[k]}' /tmp/r95/compiles-alone.log
export TRITON_CACHE_DIR=/tmp/jit-C/triton TORCHINDUCTOR_CACHE_DIR=/tmp/jit-C/inductor
echo "== $(date -u +%T) run 8's command, cold (limit 150 s)"; start=$(date +%s.%N)
DFLASH_PARITY_COMPILE_LOG=/tmp/r95/compiles-cold.log timeout -s TERM -k 20 150 python3 -m parity.cli check --device cuda \
  --profile gpu --report /tmp/report-cold --mps $PROD_OFF --jobs 16 > /tmp/r95/run8-cold.log 2>&1
echo "exit code: $?; wall $(python3 -c "import time;print(round(time.time()-$start,1))") s"
grep -E "\[jobs\] .*done in|  time |variants gone over|its cases start|cases in|INTERRUPTED|FAIL|fail " /tmp/r95/run8-cold.log | cut -c1-230 | head -70
echo "fork server lines: $(grep -c "fork server: forked" /tmp/r95/run8-cold.log) forked, $(grep -c "fork server: a fresh" /tmp/r95/run8-cold.log) fresh"
awk '{n[$2]++; s[$2]+=$4} END {for (k in n) printf "compile log: %s %d entries, %.1f s\n", k, n[k], s[k]}' /tmp/r95/compiles-cold.log
cp /tmp/report-cold/parity.json /tmp/r95/run8-cold-parity.json; cp /tmp/report-cold/summary.md /tmp/r95/run8-cold-summary.md
cp /tmp/setup.log /tmp/r95/
(cd /tmp && tar -czf $OUT/run95.tgz r95)
echo "all done $(date -u +%T)"
