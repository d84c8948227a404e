# Run 79 (session 23): the machine of run 78, the same tree. 1. flashinfer's warm-up finished if run 78 stopped
# it, and the modules packed (parts of at most 15 MB); 2. run 8's command (isolated, all hardening, --jobs 16
# --mps, production off; SIGTERM at 200 s as run 8) on empty Triton and inductor caches, flashinfer's modules
# compiled: the shared cache and the precompile, with the compile log; 3. run 11's command on the Triton cache
# run 8's command left (pass 1: the compiled merge's inductor cache still cold; passes 2-3 warm); the figures
# of each pass compared with run 73's pass 4 (the same command and seed, the oracle's kernel before this tree).
set -u
export PYTHONUNBUFFERED=1
export PYTHONPATH=/tmp/site:$PWD DFLASH_PARITY_PYCACHE=/tmp/dflash-pycache
PROD_OFF="--limit max_production_context=0 --limit max_production_batch=2 --limit models=none"
FL="context[flashinfer-fa2] context[flashinfer-fa3] decode_rows[flashinfer] decode_rows[flashinfer-tc] windowed_merge[flashinfer-eager] windowed_merge[flashinfer-compiled] windowed_merge[flashinfer-triton] windowed_merge[flashinfer-merge_state]"
if ! ls /tmp/fi_aot_s23.tar.xz > /dev/null 2>&1; then
  echo "== $(date -u +%T) warm-up of flashinfer's modules, the rest"
  TRITON_CACHE_DIR=/tmp/jit-warm/triton TORCHINDUCTOR_CACHE_DIR=/tmp/jit-warm/inductor MAX_JOBS=2 timeout 300 \
    python3 -m parity.warmup --jobs 16 $PROD_OFF $FL > $OUT/warmup2.log 2>&1; echo "warm-up exit $?"
  grep -E "warm-up on|FAILED" $OUT/warmup2.log | tail -3; gzip -f $OUT/warmup2.log
  python3 .fib/flashinfer_aot.py pack /tmp/fi_aot_s23.tar.xz 2>&1 | tail -1
  split -b 15m /tmp/fi_aot_s23.tar.xz $OUT/fi_aot_s23.tar.xz.part-; ls -la $OUT | grep part
fi
echo "== $(date -u +%T) run 8's command, empty Triton and inductor caches"
export TRITON_CACHE_DIR=/tmp/jit-C/triton TORCHINDUCTOR_CACHE_DIR=/tmp/jit-C/inductor DFLASH_PARITY_COMPILE_LOG=$OUT/compiles-C.log
start=$(date +%s.%N)
timeout -s TERM -k 60 200 python3 -m parity.cli check --device cuda --profile gpu --report /tmp/report-C \
  --jobs 16 --mps $PROD_OFF > $OUT/run8-C.log 2>&1
echo "exit code: $?; wall $(python3 -c "import time;print(round(time.time()-$start,1))") s"
grep -E "\[jobs\] (children|[0-9]+ process|.*done in)|  time |cases in|INTERRUPTED|FAIL|fail |kernels: " $OUT/run8-C.log | cut -c1-230 | head -80
awk '{n[$2]++; s[$2]+=$4} END {for (k in n) printf "compile log: %s %d entries, %.1f s\n", k, n[k], s[k]}' $OUT/compiles-C.log
cp /tmp/report-C/parity.json $OUT/run8-C-parity.json 2>/dev/null; cp /tmp/report-C/summary.md $OUT/run8-C-summary.md 2>/dev/null
gzip -f $OUT/run8-C.log $OUT/compiles-C.log $OUT/run8-C-parity.json
unset DFLASH_PARITY_COMPILE_LOG
SX="--shards windowed_merge[flashinfer-compiled]=5 --mps $PROD_OFF"
for p in 1 2 3; do
  STEPS=sweep SWEEP_FIRST_PASS=$p SWEEP_PASSES=$p SWEEP_JOBS=15 SWEEP_TIMEOUT=90 SWEEP_EXTRA="$SX" NO_FINAL_PACK=1 \
    TRITON_CACHE_DIR=/tmp/jit-C/triton TORCHINDUCTOR_CACHE_DIR=/tmp/jit-C/inductor bash scripts/gpu_session.sh > /dev/null 2>&1
  echo "== pass $p"; grep -E "exit code|== CPU|== GPU|\[jobs\] [0-9]+ process|cases in|kernels: " $OUT/gpu_session.log | cut -c1-220 | head -12
  mv $OUT/gpu_session.log $OUT/pass$p.log; gzip -f $OUT/pass$p.log
done
python3 scripts/compare_figures.py docs/gpu/runs/73-sweep4-parity.json.gz /tmp/sweep1/parity.json /tmp/sweep2/parity.json /tmp/sweep3/parity.json
(cd $OUT && tar -cf sweeps.tar sweep*.tgz && rm -f sweep*.tgz)
echo "all done $(date -u +%T)"
