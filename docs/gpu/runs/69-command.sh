# Run 69 (session 20): one H200 call over main at the commit named in the record; .fib/ carried; a fresh machine.
# Issue 18. Run 68 found PYTHONDONTWRITEBYTECODE=1 set on the image (torch has no __pycache__), so parity.bytecode
# changed nothing there. This tree caches the bytecode in DFLASH_PARITY_PYCACHE when that names a folder (the
# opt-in) even under PYTHONDONTWRITEBYTECODE.
# 1. The prefork's imports alone: opted out, opted in with a cold cache, then warm (twice).
# 2. Run 11's full command (production off, --mps, the compiled merge in 5 shards, --jobs 15): pass 1 cold, opted
#    in (fills the JIT and bytecode caches); then warm: opted in, opted out (this tree's default there), opted in,
#    spawn opted in. Process wall and the check's figure of each; figures compared with pass 3.
set -u
export PYTHONUNBUFFERED=1
STEPS=setup NO_FINAL_PACK=1 bash scripts/gpu_session.sh > /dev/null 2>&1
mv $OUT/gpu_session.log $OUT/setup.log 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD TRITON_CACHE_DIR=/tmp/jit/triton TORCHINDUCTOR_CACHE_DIR=/tmp/jit/inductor
PYC=/tmp/dflash-pycache
{
echo "== PYTHONDONTWRITEBYTECODE=${PYTHONDONTWRITEBYTECODE-unset}"
for mode in off $PYC $PYC $PYC; do
  DFLASH_PARITY_PYCACHE=$mode python3 -c "
import time, os; t0 = time.perf_counter(); c0 = sum(os.times()[:2])
from parity import bytecode; w = bytecode.cache_bytecode()
from parity.prefork import preload, PRELOAD; r = preload(PRELOAD, ())
print('prefork imports, DFLASH_PARITY_PYCACHE=$mode:', w, round(time.perf_counter() - t0, 2), 's,', round(sum(os.times()[:2]) - c0, 2), 's CPU; refused:', r[2])" 2>&1 | grep -v Warn
done
echo "cache: $(du -sh $PYC | cut -f1), $(find $PYC -name '*.pyc' | wc -l) files"
} > $OUT/bytecode.txt 2>&1
echo "== bytecode"; cat $OUT/bytecode.txt
SX="--shards windowed_merge[flashinfer-compiled]=5 --mps --limit max_production_context=0 --limit max_production_batch=2 --limit models=none"
: > $OUT/sweeps.log
for spec in "1 prefork in" "2 prefork in" "3 prefork out" "4 prefork in" "5 spawn in"; do
  set -- $spec
  lim=90; [ "$1" = 1 ] && lim=200
  if [ "$3" = in ]; then export DFLASH_PARITY_PYCACHE=$PYC; else unset DFLASH_PARITY_PYCACHE; fi
  STEPS=sweep SWEEP_FIRST_PASS=$1 SWEEP_PASSES=$1 SWEEP_JOBS=15 SWEEP_TIMEOUT=$lim SWEEP_EXTRA="$SX --jobs-start $2" \
    NO_FINAL_PACK=1 bash scripts/gpu_session.sh > /dev/null 2>&1
  echo "== pass $1: --jobs-start $2, bytecode cache opted $3" >> $OUT/sweeps.log
  cat $OUT/gpu_session.log >> $OUT/sweeps.log; rm -f $OUT/gpu_session.log
done
unset DFLASH_PARITY_PYCACHE
grep -E "^== (pass|fast|GPU|CPU)|exit code|\[jobs\] (children|[0-9]+ process)|cases in|INTERRUPTED|dflash-parity: torch" $OUT/sweeps.log | cut -c1-250
for n in 1 2 3 4 5; do grep -hE "\[jobs\] children|dflash-parity: torch" /tmp/sweep$n/sweep.log | sed "s/^/pass $n: /" | cut -c1-300; done
python3 - <<'PY'
import json
keys = ("status", "cases", "passed", "unsupported", "worst_ulp", "worst_rel_l2", "worst_margin")
runs = {}
for n in range(1, 6):
    try:
        d = json.load(open(f"/tmp/sweep{n}/parity.json"))
    except OSError as err:
        print(f"pass {n}: no report ({err})"); continue
    runs[n] = {k: tuple(v.get(x) for x in keys) for k, v in d["lowerings"].items()}
base = runs.get(3)
for n, r in runs.items():
    diff = {k: (v, (base or {}).get(k)) for k, v in r.items() if base is not None and base.get(k) != v}
    print(f"pass {n}: {len(r)} lowerings, {sum(v[1] or 0 for v in r.values())} cases; "
          + ("the same figures as pass 3" if not diff else f"differs from pass 3: {diff}"))
PY
(cd $OUT && tar -cf sweeps.tar sweep*.tgz && rm -f sweep*.tgz)
