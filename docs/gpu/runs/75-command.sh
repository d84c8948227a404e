# Run 75 (session 21): the machine of run 74, warm, the same tree. Run 74's first "off" runs of decode_rows[flashinfer],
# windowed_merge[flashinfer-eager] and the isolated check were still compiling (oracle 28-56% of their time lines):
# the same pairs again, warm, on first then off.
set -u
export PYTHONUNBUFFERED=1
export PYTHONPATH=/tmp/site:$PWD TRITON_CACHE_DIR=/tmp/jit/triton TORCHINDUCTOR_CACHE_DIR=/tmp/jit/inductor
export DFLASH_PARITY_PYCACHE=/tmp/dflash-pycache
PROD="--limit max_production_context=0 --limit max_production_batch=2 --limit models=none"
FAST="--device cuda --profile gpu --seed 3 --no-isolate --no-hardening --warm-up $PROD"
ISO="--device cuda --profile gpu $PROD"
n=10
one() {
  n=$((n + 1)); label=$1; shift
  s=$(date +%s.%N)
  python3 -m parity.cli check "$@" --report /tmp/r$n > $OUT/r$n.log 2>&1
  echo "== r$n $label: exit $?, wall $(python3 -c "import time;print(round(time.time()-$s,1))") s"
  grep -E "cases in|  time " $OUT/r$n.log | cut -c1-200
}
for lw in 'decode_rows[flashinfer]' 'windowed_merge[flashinfer-eager]'; do
  for mode in on off; do one "$lw --draw-ahead $mode" $FAST --max-examples 500 --lowering "$lw" --draw-ahead $mode; done
done
for mode in on off; do one "decode_rows[flashinfer] isolated, hardened, --draw-ahead $mode" $ISO --lowering 'decode_rows[flashinfer]' --draw-ahead $mode; done
python3 - <<'PY'
import json
keys = ("status", "cases", "passed", "unsupported", "worst_ulp", "worst_rel_l2", "worst_margin")
def entry(n):
    d = json.load(open(f"/tmp/r{n}/parity.json"))
    return {k: tuple(v.get(x) for x in keys) for k, v in d["lowerings"].items()}
for a, b in ((11, 12), (13, 14), (15, 16), (5, 11), (7, 13), (9, 15)):
    ea, eb = entry(a), entry(b)
    print(f"r{a} vs r{b}: " + ("the same figures " + str(ea) if ea == eb else f"DIFFER {ea} {eb}"))
PY
