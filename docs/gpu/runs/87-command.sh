# Run 87 (session 25): run 8's command (isolated, all hardening, --jobs 16 --mps, production off, SIGTERM at 200 s)
# 1. on empty Triton and inductor caches (/tmp/jit-C), flashinfer's modules installed, compile log: the precompile's
#    per-variant markers, first time on the GPU; 2. again on the caches 1 filled (a runner that keeps its caches;
#    limit 150 s); 3. the 12 lowerings that compile nothing of their own, warm, under DFLASH_PARITY_CPROFILE
#    (parity.host_profile; limit 90 s): where the host time of a check process and of its worker goes.
set -u
export PYTHONUNBUFFERED=1
STEPS=setup NO_FINAL_PACK=1 bash scripts/gpu_session.sh > /dev/null 2>&1; mv $OUT/gpu_session.log $OUT/setup.log 2>/dev/null; head -8 $OUT/setup.log
export PYTHONPATH=/tmp/site:$PWD DFLASH_PARITY_PYCACHE=/tmp/dflash-pycache
export TRITON_CACHE_DIR=/tmp/jit-C/triton TORCHINDUCTOR_CACHE_DIR=/tmp/jit-C/inductor
PROD_OFF="--limit max_production_context=0 --limit max_production_batch=2 --limit models=none"
run8() {  # $1 name, $2 limit, rest: extra args
  local name=$1 limit=$2; shift 2
  echo "== $(date -u +%T) run 8's command: $name (limit $limit s)"
  local start=$(date +%s.%N)
  timeout -s TERM -k 60 $limit python3 -m parity.cli check --device cuda --profile gpu --report /tmp/report-$name \
    --mps $PROD_OFF "$@" > $OUT/run8-$name.log 2>&1
  echo "exit code: $?; wall $(python3 -c "import time;print(round(time.time()-$start,1))") s"
  grep -E "\[jobs\] (children|[0-9]+ process|.*done in)|  time |variants gone over|cases in|INTERRUPTED|FAIL|fail " \
    $OUT/run8-$name.log | cut -c1-230 | head -60
  cp /tmp/report-$name/parity.json $OUT/run8-$name-parity.json 2>/dev/null; cp /tmp/report-$name/summary.md $OUT/run8-$name-summary.md 2>/dev/null
  gzip -f $OUT/run8-$name.log $OUT/run8-$name-parity.json
}
DFLASH_PARITY_COMPILE_LOG=$OUT/compiles-cold.log run8 cold 200 --jobs 16
awk '{n[$2]++; s[$2]+=$4} END {for (k in n) printf "compile log: %s %d entries, %.1f s\n", k, n[k], s[k]}' $OUT/compiles-cold.log
gzip -f $OUT/compiles-cold.log
run8 warm 150 --jobs 16
L=""; for n in context "context[flashinfer-fa2]" "context[flashinfer-fa3]" decode_rows "decode_rows[flashinfer-tc]" "decode_rows[flashinfer]" \
  sdpa "windowed_merge[eager]" "windowed_merge[flashinfer-eager]" "windowed_merge[flashinfer-merge_state]" "windowed_merge[flashinfer-triton]" "windowed_merge[triton]"; do
  L="$L --lowering $n"; done
DFLASH_PARITY_CPROFILE=/tmp/hp run8 profiled 90 --jobs 12 $L
python3 scripts/host_profile_summary.py /tmp/hp --top 40 > $OUT/host-profile.txt 2>&1
python3 scripts/host_profile_summary.py /tmp/hp --top 40 --match torch_emulation > $OUT/host-profile-torch.txt 2>&1
python3 scripts/host_profile_summary.py /tmp/hp --top 40 --match flashinfer_paged > $OUT/host-profile-flashinfer.txt 2>&1
head -60 $OUT/host-profile.txt | cut -c1-160
(cd /tmp && tar -czf $OUT/host-profiles.tgz hp)
echo "all done $(date -u +%T)"
