#!/usr/bin/env bash
# Issue 48 on the GPU: run 11's command (the fast sweep: 11 GPU lowerings x 500, --jobs 15, the compiled merge in
# 5 shards, seed 3, --warm-up --no-hardening --no-isolate --mps, production off), the tree under test and the
# tree the issue was filed on (main 1933668, carried as .base/) on one machine, one after the other: a fill pass
# each (limit FILL s: JIT caches), then PASSES warm passes each, alternating. "cases in" is the figure of record.
# lab/gpu_issue48_flashinfer.sh (or lab/gpu_session.sh's set-up) ran before on this machine.
# Split over calls on one warm machine: FILL=210 PASSES=0, then FILL=0 PASSES=2 FIRST_PASS=2, then FIRST_PASS=4 ...
# (the fill's reports stay in OUT). FILL_SHARDS: the compiled merge's shards in the fill (10; the passes use 5).
# BUDGET: seconds for all the sweeps from this script's start; a sweep gets what is left less 15 s, and one left
# under 20 s is skipped and says so (so that one call with a hard limit still writes its table afterwards).
#   OUT=dir FILL=130 PASSES=2 [EXCLUDE='context[flashinfer-fa3]'] bash lab/gpu_issue48_run11.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
exec > >(tee -a "$OUT/run11.log") 2>&1
export TRITON_CACHE_DIR=/tmp/jit/triton TORCHINDUCTOR_CACHE_DIR=/tmp/jit/inductor DFLASH_PARITY_PYCACHE=/tmp/dflash-pycache
PROD_OFF="--limit max_production_context=0 --limit max_production_batch=2 --limit models=none"
L=(context[flashinfer-fa2] context[flashinfer-fa3] decode_rows[flashinfer] decode_rows[flashinfer-tc]
   windowed_merge[flashinfer-eager] windowed_merge[flashinfer-compiled] windowed_merge[flashinfer-triton]
   windowed_merge[flashinfer-merge_state] hybrid_paged hybrid_paged[splits=4] windowed_merge[triton])
largs=(); for l in "${L[@]}"; do [[ " ${EXCLUDE:-} " == *" $l "* ]] || largs+=(--lowering "$l"); done  # EXCLUDE: names
echo "lowerings: ${largs[*]}"
shards=; [[ " ${largs[*]} " == *" windowed_merge[flashinfer-compiled] "* ]] && shards=1  # its --shards, when it is checked
T0=$(date +%s)
sweep() {  # $1 tree (new|base), $2 pass, $3 limit, $4 compiled-merge shards
  local dir=$PWD mod=parity.front.cli limit=$3
  if [ -n "${BUDGET:-}" ]; then
    local left=$((BUDGET - ($(date +%s) - T0) - 15))
    [ "$left" -lt 20 ] && { echo "== $(date -u +%T) $1 pass $2 skipped: ${left} s of BUDGET=$BUDGET left"; return; }
    [ "$left" -lt "$limit" ] && limit=$left
  fi
  [ "$1" != new ] && dir=$PWD/.$1 && mod=parity.cli  # base: .base/ (main 1933668); pre48: .pre48/ (7023d6d)
  echo "== $(date -u +%T) $1 pass $2 (limit $limit s)"
  local start=$(date +%s.%N)
  (cd "$dir" && PYTHONPATH=/tmp/site:$dir timeout -s TERM -k 60 "$limit" python3 -m $mod check --device cuda --profile gpu \
     --seed 3 --max-examples 500 --jobs 15 --warm-up --no-hardening --no-isolate \
     ${shards:+--shards "windowed_merge[flashinfer-compiled]=$4"} --mps $PROD_OFF --report "/tmp/sweep-$1-$2" "${largs[@]}" \
     > "/tmp/sweep-$1-$2.log" 2>&1)
  echo "exit code: $?; wall $(python3 -c "import time;print(round(time.time()-$start,1))") s"
  grep -E "cases in|FAIL|Traceback|INTERRUPTED" "/tmp/sweep-$1-$2.log" | grep -v "cases, .* unsupported" | cut -c1-220 | tail -8
  cp "/tmp/sweep-$1-$2.log" "$OUT/" 2>/dev/null; cp "/tmp/sweep-$1-$2/summary.md" "$OUT/summary-$1-$2.md" 2>/dev/null
  cp "/tmp/sweep-$1-$2/parity.json" "$OUT/parity-$1-$2.json" 2>/dev/null
}
T=(${TREES:-new base})  # TREES="new base pre48": the tree before issue 48 too (git archive 7023d6d into .pre48/)
if [ "${FILL:-130}" != 0 ]; then for t in "${T[@]}"; do sweep $t 1 ${FILL:-130} ${FILL_SHARDS:-10}; done; fi  # FILL=0: passes only
for p in $(seq ${FIRST_PASS:-2} $((${FIRST_PASS:-2} - 1 + ${PASSES:-2}))); do for t in "${T[@]}"; do sweep $t $p 45 5; done; done
gzip -f "$OUT"/*.json "$OUT"/sweep-*.log 2>/dev/null
date -u +%T
