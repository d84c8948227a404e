# Run 91 (session 26): run 8's command exactly on empty Triton and inductor caches (flashinfer's modules installed
# from .fib), stopped at 120 s, not 200 as run 8 (the session's device time: the 14 lowerings that compile no
# torch.compile families finish well before; the two torch.compile merges are cut earlier than run 8's), this tree: run 90's plus the precompile's oracle units attending host-built
# inputs (parity.precompile._run_unit), so that they no longer wait for the builder's variants.
set -u
export PYTHONUNBUFFERED=1
STEPS=setup NO_FINAL_PACK=1 bash scripts/gpu_session.sh > /dev/null 2>&1; mv $OUT/gpu_session.log /tmp/setup.log 2>/dev/null
head -3 /tmp/setup.log
export PYTHONPATH=/tmp/site:$PWD DFLASH_PARITY_PYCACHE=/tmp/dflash-pycache
export TRITON_CACHE_DIR=/tmp/jit-C/triton TORCHINDUCTOR_CACHE_DIR=/tmp/jit-C/inductor
PROD_OFF="--limit max_production_context=0 --limit max_production_batch=2 --limit models=none"
echo "== $(date -u +%T) run 8's command, cold (limit 120 s)"; start=$(date +%s.%N)
DFLASH_PARITY_COMPILE_LOG=$OUT/compiles-cold.log timeout -s TERM -k 15 120 python3 -m parity.cli check --device cuda \
  --profile gpu --report /tmp/report-cold --mps $PROD_OFF --jobs 16 > $OUT/run8-cold.log 2>&1
echo "exit code: $?; wall $(python3 -c "import time;print(round(time.time()-$start,1))") s"
grep -E "children forked|  time |variants gone over|cases in|INTERRUPTED|FAIL|fail " $OUT/run8-cold.log | cut -c1-200 | head -40
awk '{n[$2]++; s[$2]+=$4} END {for (k in n) printf "compile log: %s %d entries, %.1f s\n", k, n[k], s[k]}' $OUT/compiles-cold.log
cp /tmp/report-cold/parity.json $OUT/run8-cold-parity.json; cp /tmp/report-cold/summary.md $OUT/run8-cold-summary.md
gzip -f $OUT/run8-cold.log $OUT/compiles-cold.log $OUT/run8-cold-parity.json
echo "all done $(date -u +%T)"
