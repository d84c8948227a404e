# Run 77 (session 22): one H200 call over main at the commit named in the record; .fib/ carried (the offline
# flashinfer bundle, no packed modules: run 76's pack was too large to come back); a fresh machine.
# Issue 18: run 8's command on cold Triton/inductor caches, the B side: parity.shared_compile_cache (one compile
# per kernel across the processes) and the case builder's single signature (oracle._device_values._unread_fp32).
# 1. setup; 2. flashinfer's modules for the gpu profile with production off, compiled by a short check
#    (--warm-up, 1 case, 8 flashinfer lowerings side by side; a throwaway Triton/inductor cache), packed into
#    $OUT in parts; 3. run 8's command (isolated, all hardening, --jobs 16 --mps, production off; SIGTERM at
#    200 s as run 8), Triton and inductor caches empty, each compile logged.
set -u
export PYTHONUNBUFFERED=1
STEPS=setup NO_FINAL_PACK=1 bash scripts/gpu_session.sh > /dev/null 2>&1
mv $OUT/gpu_session.log $OUT/setup.log 2>/dev/null; head -6 $OUT/setup.log
export PYTHONPATH=/tmp/site:$PWD DFLASH_PARITY_PYCACHE=/tmp/dflash-pycache
PROD_OFF="--limit max_production_context=0 --limit max_production_batch=2 --limit models=none"
FL="context[flashinfer-fa2] context[flashinfer-fa3] decode_rows[flashinfer] decode_rows[flashinfer-tc] windowed_merge[flashinfer-eager] windowed_merge[flashinfer-compiled] windowed_merge[flashinfer-triton] windowed_merge[flashinfer-merge_state]"
largs=""; for l in $FL; do largs="$largs --lowering $l"; done
echo "== $(date -u +%T) flashinfer's modules: check --warm-up, 1 case each"
start=$(date +%s.%N)
TRITON_CACHE_DIR=/tmp/jit-warm/triton TORCHINDUCTOR_CACHE_DIR=/tmp/jit-warm/inductor MAX_JOBS=2 timeout -s TERM -k 30 300 \
  python3 -m parity.cli check --device cuda --profile gpu --max-examples 1 --jobs 8 --warm-up --no-hardening --no-isolate \
  $PROD_OFF --report /tmp/report-warm $largs > $OUT/modules.log 2>&1
echo "exit code: $?; wall $(python3 -c "import time;print(round(time.time()-$start,1))") s"
grep -E "done in|cases in" $OUT/modules.log | cut -c1-160
python3 .fib/flashinfer_aot.py pack /tmp/fi_aot_s22.tar.xz 2>&1 | tail -1
split -b 15m -d /tmp/fi_aot_s22.tar.xz $OUT/fi_aot_s22.tar.xz.part; ls -la $OUT/fi_aot_s22.tar.xz.part*
echo "== $(date -u +%T) run 8's command, shared Triton compiles (B)"
export TRITON_CACHE_DIR=/tmp/jit-B/triton TORCHINDUCTOR_CACHE_DIR=/tmp/jit-B/inductor DFLASH_PARITY_COMPILE_LOG=$OUT/compiles-B.log
start=$(date +%s.%N)
timeout -s TERM -k 60 200 python3 -m parity.cli check --device cuda --profile gpu --report /tmp/report-B \
  --jobs 16 --mps $PROD_OFF > $OUT/run8-B.log 2>&1
echo "exit code: $?; wall $(python3 -c "import time;print(round(time.time()-$start,1))") s"
grep -E "\[jobs\] (children|[0-9]+ process|.*done in)|  time |cases in|INTERRUPTED|FAIL|fail " $OUT/run8-B.log | cut -c1-230 | head -60
awk '{n[$2]++; s[$2]+=$4} END {for (k in n) printf "compile log B: %s %d entries, %.1f s\n", k, n[k], s[k]}' $OUT/compiles-B.log
cp /tmp/report-B/parity.json $OUT/run8-B-parity.json 2>/dev/null; cp /tmp/report-B/summary.md $OUT/run8-B-summary.md 2>/dev/null
gzip -f $OUT/run8-B.log $OUT/compiles-B.log $OUT/run8-B-parity.json $OUT/modules.log
echo "all done $(date -u +%T)"
