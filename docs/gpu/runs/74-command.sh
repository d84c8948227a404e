# Run 74 (session 21): one H200 call over main at the commit named in the record; .fib/ carried; a fresh machine.
# Issue 18. The drawer (parity.draw_ahead) where a check has cores to spare: one lowering at a time, the host's
# 16 cores to itself, --draw-ahead off and on alternating, warm JIT (a first short run compiles).
# 1. Run 11's per-lowering command (gpu profile, seed 3, 500 cases, --no-isolate --no-hardening --warm-up,
#    production off) for hybrid_paged (off, on, off, on), decode_rows[flashinfer] and
#    windowed_merge[flashinfer-eager] (off, on).
# 2. The default isolated, hardened gpu-profile check of decode_rows[flashinfer] (200 cases; production off), off, on.
# Each pair's reports compared (status, cases, passed, unsupported, worst ulp, worst relative L2, margin).
set -u
export PYTHONUNBUFFERED=1
STEPS=setup NO_FINAL_PACK=1 bash scripts/gpu_session.sh > /dev/null 2>&1
mv $OUT/gpu_session.log $OUT/setup.log 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD TRITON_CACHE_DIR=/tmp/jit/triton TORCHINDUCTOR_CACHE_DIR=/tmp/jit/inductor
export DFLASH_PARITY_PYCACHE=/tmp/dflash-pycache
PROD="--limit max_production_context=0 --limit max_production_batch=2 --limit models=none"
FAST="--device cuda --profile gpu --seed 3 --no-isolate --no-hardening --warm-up $PROD"
t0=$(date +%s)
python3 -m parity.cli check $FAST --max-examples 40 --jobs 3 --report /tmp/warm --lowering hybrid_paged \
  --lowering 'decode_rows[flashinfer]' --lowering 'windowed_merge[flashinfer-eager]' > $OUT/warm.log 2>&1
echo "== JIT warm-up run: exit $? in $(( $(date +%s) - t0 )) s"
n=0
one() {  # one check: $1 label, rest: arguments
  n=$((n + 1)); label=$1; shift
  s=$(date +%s.%N)
  python3 -m parity.cli check "$@" --report /tmp/r$n > $OUT/r$n.log 2>&1
  rc=$?
  echo "== r$n $label: exit $rc, wall $(python3 -c "import time;print(round(time.time()-$s,1))") s"
  grep -E "cases in|  time " $OUT/r$n.log | cut -c1-200
}
for lw in hybrid_paged hybrid_paged 'decode_rows[flashinfer]' 'windowed_merge[flashinfer-eager]'; do
  for mode in off on; do one "$lw --draw-ahead $mode" $FAST --max-examples 500 --lowering "$lw" --draw-ahead $mode; done
done
ISO="--device cuda --profile gpu $PROD"
for mode in off on; do one "decode_rows[flashinfer] isolated, hardened, --draw-ahead $mode" $ISO --lowering 'decode_rows[flashinfer]' --draw-ahead $mode; done
python3 - <<'PY'
import json
keys = ("status", "cases", "passed", "unsupported", "worst_ulp", "worst_rel_l2", "worst_margin")
def entry(n):
    d = json.load(open(f"/tmp/r{n}/parity.json"))
    return {k: tuple(v.get(x) for x in keys) for k, v in d["lowerings"].items()}
for a, b in ((1, 2), (3, 4), (1, 3), (5, 6), (7, 8), (9, 10)):
    try:
        ea, eb = entry(a), entry(b)
    except OSError as err:
        print(f"r{a} r{b}: {err}"); continue
    print(f"r{a} vs r{b}: " + ("the same figures " + str(ea) if ea == eb else f"DIFFER {ea} {eb}"))
PY
echo "all done"
