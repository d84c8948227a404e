# Run 73 (session 21): the machine of run 72, warm (its JIT and bytecode caches), the same tree.
# Run 11's full command (production off, --mps, the compiled merge in 5 shards, --jobs 15), warm passes with the
# drawer (--draw-ahead auto: on at 500 cases) and without it (--draw-ahead off), alternating; then the figures of
# every pass compared with pass 2's (status, cases, passed, unsupported, worst ulp, worst relative L2, margin).
set -u
export PYTHONUNBUFFERED=1
export PYTHONPATH=/tmp/site:$PWD TRITON_CACHE_DIR=/tmp/jit/triton TORCHINDUCTOR_CACHE_DIR=/tmp/jit/inductor
export DFLASH_PARITY_PYCACHE=/tmp/dflash-pycache
SX="--shards windowed_merge[flashinfer-compiled]=5 --mps --limit max_production_context=0 --limit max_production_batch=2 --limit models=none"
for spec in "2 auto" "3 auto" "4 off" "5 auto" "6 off" "7 auto" "8 auto"; do
  set -- $spec
  STEPS=sweep SWEEP_FIRST_PASS=$1 SWEEP_PASSES=$1 SWEEP_JOBS=15 SWEEP_TIMEOUT=60 SWEEP_EXTRA="$SX --draw-ahead $2" \
    NO_FINAL_PACK=1 bash scripts/gpu_session.sh > /dev/null 2>&1
  echo "== pass $1: --draw-ahead $2"
  grep -E "exit code|== CPU|== GPU|\[jobs\] [0-9]+ process|cases in" $OUT/gpu_session.log | cut -c1-220
  mv $OUT/gpu_session.log $OUT/pass$1.log
done
python3 - <<'PY'
import json
keys = ("status", "cases", "passed", "unsupported", "worst_ulp", "worst_rel_l2", "worst_margin")
runs = {}
for n in range(2, 9):
    try:
        d = json.load(open(f"/tmp/sweep{n}/parity.json"))
    except OSError as err:
        print(f"pass {n}: no report ({err})"); continue
    runs[n] = {k: tuple(v.get(x) for x in keys) for k, v in d["lowerings"].items()}
base = runs.get(2)
for n, r in runs.items():
    diff = {k: (v, (base or {}).get(k)) for k, v in r.items() if base is not None and base.get(k) != v}
    print(f"pass {n}: {len(r)} lowerings, {sum(v[1] or 0 for v in r.values())} cases; "
          + ("the same figures as pass 2" if not diff else f"differs from pass 2: {diff}"))
PY
(cd $OUT && tar -cf sweeps.tar sweep*.tgz && rm -f sweep*.tgz)
echo "all done"
