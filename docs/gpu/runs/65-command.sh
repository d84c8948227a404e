# Run 65 (session 19): one H200 call over main at the commit named in the record; .fib/ carried; a fresh machine.
# Issue 18: each of run 11's 15 children paid 3.3-4.5 s of imports (run 62). `--jobs-start prefork` (the new
# default) forks the children from one process that imported torch, triton, hypothesis, flashinfer, inductor and
# this project once. Questions: does the prefork hold on the GPU host (no import initializes CUDA: flashinfer's?),
# do its children give the same figures, and how much CPU and wall does it save? And where the profiler's first
# start goes (cProfile of the first enter; each CUPTI activity kind kineto enables, timed through ctypes).
# 1. The prefork alone: modules, seconds, refused or not.
# 2. scripts/gpu_profiler_first_start.py --modes cprofile cupti (one process each).
# 3. Run 11's command (production off, --mps, as runs 57 and 62): pass 1 cold with the prefork (fills the caches),
#    then warm passes alternating --jobs-start spawn / prefork / spawn / prefork; figures compared pass by pass.
set -u
export PYTHONUNBUFFERED=1
STEPS=setup NO_FINAL_PACK=1 bash scripts/gpu_session.sh > /dev/null 2>&1
mv $OUT/gpu_session.log $OUT/setup.log 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD TRITON_CACHE_DIR=/tmp/jit/triton TORCHINDUCTOR_CACHE_DIR=/tmp/jit/inductor
timeout -s TERM -k 5 60 python3 - > $OUT/prefork.txt 2>&1 <<'PY'
import os, time
from parity.prefork import Prefork, PreforkError, cuda_initialized
print("this process, CUDA initialized before:", cuda_initialized())
t = time.perf_counter()
try:
    p = Prefork().start(dict(os.environ))
    print(f"ready in {p.ready_seconds:.2f} s, {p.ready_cpu:.2f} s of CPU (parent saw {time.perf_counter() - t:.2f} s)")
    print("modules:", p.modules, "skipped:", p.skipped)
    p.close()
except PreforkError as err:
    print("refused:", err)
PY
echo "== prefork"; cat $OUT/prefork.txt
start=$(date +%s)
timeout -s TERM -k 5 ${FS_LIMIT:-50} python3 scripts/gpu_profiler_first_start.py --procs 1 --modes cprofile cupti \
  2>&1 | grep -v "_warn_once\|UserWarning" > $OUT/first-start.txt
echo "== first start: $(( $(date +%s) - start )) s"; cut -c1-700 $OUT/first-start.txt
SX="--shards windowed_merge[flashinfer-compiled]=5 --mps --limit max_production_context=0 --limit max_production_batch=2 --limit models=none"
: > $OUT/sweeps.log
for spec in "1 prefork" "2 spawn" "3 prefork" "4 spawn" "5 prefork"; do
  set -- $spec
  lim=90; [ "$1" = 1 ] && lim=${SWEEP_LIMIT:-240}
  STEPS=sweep SWEEP_FIRST_PASS=$1 SWEEP_PASSES=$1 SWEEP_JOBS=15 SWEEP_TIMEOUT=$lim SWEEP_EXTRA="$SX --jobs-start $2" \
    NO_FINAL_PACK=1 bash scripts/gpu_session.sh > /dev/null 2>&1
  cat $OUT/gpu_session.log >> $OUT/sweeps.log
done
grep -E "^== (fast|GPU|CPU)|exit code|\[jobs\] (children|[0-9]+ process)|check's|cases in|INTERRUPTED|\[mps\]" $OUT/sweeps.log | cut -c1-250
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
base = runs.get(2)
for n, r in runs.items():
    diff = {k: (v, (base or {}).get(k)) for k, v in r.items() if base is not None and base.get(k) != v}
    print(f"pass {n}: {len(r)} lowerings, {sum(v[1] or 0 for v in r.values())} cases; "
          + ("the same figures as pass 2" if not diff else f"differs from pass 2: {diff}"))
PY
(cd $OUT && tar -cf sweeps.tar sweep*.tgz && rm -f sweep*.tgz)
ls $OUT; echo "all done"
