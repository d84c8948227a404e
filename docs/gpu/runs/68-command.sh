# Run 68 (session 20): one H200 call over main at the commit named in the record; .fib/ carried; a fresh machine.
# Issue 18. The prefork's 8.7 s of imports came before the first child (run 67), and torch's bytecode is compiled
# from source in every process on that host (run 65). This tree launches the prefork when `check` starts (its
# imports overlap the parent's) and caches the bytecode of a torch that has none (`parity.bytecode`).
# 1. Why torch's bytecode is not cached there (who we are, the flag, the folder), and what parity.bytecode decides.
# 2. The prefork's imports alone: no cache, a cold cache, a warm cache.
# 3. Run 11's full command (production off, --mps, the compiled merge in 5 shards, --jobs 15): pass 1 cold
#    (fills the JIT caches and the bytecode cache), then warm: prefork (this tree), spawn, prefork; figures compared.
# 4. cProfile of hybrid_paged and windowed_merge[flashinfer-eager] side by side, production off, warm.
set -u
export PYTHONUNBUFFERED=1
STEPS=setup NO_FINAL_PACK=1 bash scripts/gpu_session.sh > /dev/null 2>&1
mv $OUT/gpu_session.log $OUT/setup.log 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD TRITON_CACHE_DIR=/tmp/jit/triton TORCHINDUCTOR_CACHE_DIR=/tmp/jit/inductor
{
echo "== who: $(id -u) $(id -un 2>/dev/null) HOME=$HOME PYTHONDONTWRITEBYTECODE=${PYTHONDONTWRITEBYTECODE-unset} PYTHONPYCACHEPREFIX=${PYTHONPYCACHEPREFIX-unset}"
python3 - <<'PY'
import importlib.util, os, sys
spec = importlib.util.find_spec("torch"); d = os.path.dirname(spec.origin)
print("torch at", d, "| dont_write_bytecode", sys.flags.dont_write_bytecode, "| pycache_prefix", sys.pycache_prefix)
print("torch/__pycache__ exists:", os.path.isdir(d + "/__pycache__"), "| W_OK(torch):", os.access(d, os.W_OK))
try:
    open(d + "/.dflash_write_probe", "w").close(); os.remove(d + "/.dflash_write_probe"); print("a file can be written there")
except OSError as err:
    print("writing there:", err)
from parity import bytecode
print("parity.bytecode decides:", bytecode.cache_bytecode({"DFLASH_PARITY_PYCACHE": "/tmp/pyc-probe"}))
PY
grep -E " /opt| / " /proc/mounts | head -5
for mode in off /tmp/pyc-a /tmp/pyc-a; do
  DFLASH_PARITY_PYCACHE=$mode python3 -c "
import time, os; t0 = time.perf_counter(); c0 = sum(os.times()[:2])
from parity import bytecode; w = bytecode.cache_bytecode()
from parity.prefork import preload, PRELOAD; r = preload(PRELOAD, ())
print('prefork imports, cache $mode:', w, round(time.perf_counter() - t0, 2), 's,', round(sum(os.times()[:2]) - c0, 2), 's CPU; refused:', r[2])" 2>&1 | grep -v Warn
done
} > $OUT/bytecode.txt 2>&1
echo "== bytecode"; cat $OUT/bytecode.txt
SX="--shards windowed_merge[flashinfer-compiled]=5 --mps --limit max_production_context=0 --limit max_production_batch=2 --limit models=none"
: > $OUT/sweeps.log
for spec in "1 prefork" "2 prefork" "3 spawn" "4 prefork"; do
  set -- $spec
  lim=90; [ "$1" = 1 ] && lim=${SWEEP_LIMIT:-240}
  STEPS=sweep SWEEP_FIRST_PASS=$1 SWEEP_PASSES=$1 SWEEP_JOBS=15 SWEEP_TIMEOUT=$lim SWEEP_EXTRA="$SX --jobs-start $2" \
    NO_FINAL_PACK=1 bash scripts/gpu_session.sh > /dev/null 2>&1
  cat $OUT/gpu_session.log >> $OUT/sweeps.log; rm -f $OUT/gpu_session.log
done
grep -E "^== (fast|GPU|CPU)|exit code|\[jobs\] (children|[0-9]+ process|.*done in)|cases in|INTERRUPTED|\[mps\]|dflash-parity: torch" $OUT/sweeps.log | cut -c1-250
python3 - <<'PY'
import json
keys = ("status", "cases", "passed", "unsupported", "worst_ulp", "worst_rel_l2", "worst_margin")
runs = {}
for n in range(1, 5):
    try:
        d = json.load(open(f"/tmp/sweep{n}/parity.json"))
    except OSError as err:
        print(f"pass {n}: no report ({err})"); continue
    runs[n] = {k: tuple(v.get(x) for x in keys) for k, v in d["lowerings"].items()}
    print(f"pass {n} time lines:"); [print("  ", k, v.get("seconds"), v.get("phase_seconds")) for k, v in d["lowerings"].items()]
base = runs.get(3)
for n, r in runs.items():
    diff = {k: (v, (base or {}).get(k)) for k, v in r.items() if base is not None and base.get(k) != v}
    print(f"pass {n}: {len(r)} lowerings, {sum(v[1] or 0 for v in r.values())} cases; "
          + ("the same figures as pass 3 (spawn)" if not diff else f"differs from pass 3: {diff}"))
PY
STEPS=profile PROFILE_LOWERINGS="hybrid_paged windowed_merge[flashinfer-eager]" PROFILE_TIMEOUT=60 \
  PROFILE_EXTRA="--limit max_production_context=0 --limit max_production_batch=2 --limit models=none" \
  NO_FINAL_PACK=1 bash scripts/gpu_session.sh > /dev/null 2>&1
grep -E "^== profile|^########" $OUT/gpu_session.log $OUT/profile.txt | cut -c1-300
(cd $OUT && tar -cf sweeps.tar sweep*.tgz && rm -f sweep*.tgz)
