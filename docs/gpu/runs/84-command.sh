# Run 84 (session 24): run 83 found a fresh machine (flashinfer not installed for its run 8): the same steps again, with setup first and session 24's fa3 modules installed; Triton and inductor caches for run 8 empty (/tmp/jit-D).
# --mps, production off; SIGTERM at 200 s as run 8) on empty Triton and inductor caches (/tmp/jit-D), flashinfer's
# modules compiled, with the compile log; 2. run 11's command, passes 2-4, on the caches run 82's pass 1 filled
# (/tmp/jit-S), limit 60 s each; their figures compared with run 73's pass 4 (the same command and seed).
set -u
export PYTHONUNBUFFERED=1
STEPS=setup NO_FINAL_PACK=1 bash scripts/gpu_session.sh > /dev/null 2>&1; mv $OUT/gpu_session.log $OUT/setup.log 2>/dev/null; grep installed $OUT/setup.log
PYTHONPATH=/tmp/site python3 .fib/flashinfer_aot.py install .fib/fi_aot_s22s23s24.tar.xz  # a warm machine: setup skipped its installs
export PYTHONPATH=/tmp/site:$PWD DFLASH_PARITY_PYCACHE=/tmp/dflash-pycache
PROD_OFF="--limit max_production_context=0 --limit max_production_batch=2 --limit models=none"
echo "== $(date -u +%T) run 8's command, empty Triton and inductor caches"
export TRITON_CACHE_DIR=/tmp/jit-D/triton TORCHINDUCTOR_CACHE_DIR=/tmp/jit-D/inductor DFLASH_PARITY_COMPILE_LOG=$OUT/compiles-C.log
start=$(date +%s.%N)
timeout -s TERM -k 60 200 python3 -m parity.cli check --device cuda --profile gpu --report /tmp/report-C \
  --jobs 16 --mps $PROD_OFF > $OUT/run8-C.log 2>&1
echo "exit code: $?; wall $(python3 -c "import time;print(round(time.time()-$start,1))") s"
grep -E "\[jobs\] (children|[0-9]+ process|.*done in)|  time |cases in|INTERRUPTED|FAIL|fail |kernels: " $OUT/run8-C.log | cut -c1-230 | head -80
awk '{n[$2]++; s[$2]+=$4} END {for (k in n) printf "compile log: %s %d entries, %.1f s\n", k, n[k], s[k]}' $OUT/compiles-C.log
cp /tmp/report-C/parity.json $OUT/run8-C-parity.json 2>/dev/null; cp /tmp/report-C/summary.md $OUT/run8-C-summary.md 2>/dev/null
gzip -f $OUT/run8-C.log $OUT/compiles-C.log $OUT/run8-C-parity.json
unset DFLASH_PARITY_COMPILE_LOG TRITON_CACHE_DIR TORCHINDUCTOR_CACHE_DIR
SX="--shards windowed_merge[flashinfer-compiled]=5 --mps $PROD_OFF"
for p in 5 6 7; do
  STEPS=sweep SWEEP_FIRST_PASS=$p SWEEP_PASSES=$p SWEEP_JOBS=15 SWEEP_TIMEOUT=45 SWEEP_EXTRA="$SX" NO_FINAL_PACK=1 \
    TRITON_CACHE_DIR=/tmp/jit-S/triton TORCHINDUCTOR_CACHE_DIR=/tmp/jit-S/inductor bash scripts/gpu_session.sh > /dev/null 2>&1
  echo "== pass $p"; grep -E "exit code|== CPU|== GPU|\[jobs\] [0-9]+ process|cases in" $OUT/gpu_session.log | cut -c1-220 | head -8
  mv $OUT/gpu_session.log $OUT/pass$p.log; gzip -f $OUT/pass$p.log
done
python3 scripts/compare_figures.py docs/gpu/runs/73-sweep4-parity.json.gz /tmp/sweep5/parity.json /tmp/sweep6/parity.json /tmp/sweep7/parity.json
(cd $OUT && tar -cf sweeps.tar sweep*.tgz && rm -f sweep*.tgz)
echo "all done $(date -u +%T)"
