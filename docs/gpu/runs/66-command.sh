# Run 66 (session 19): one H200 call over main at the commit named in the record; .fib/ carried; a fresh machine;
# the session's last device time (about 740 s, a start included).
# Run 65 found: (a) the prefork was refused on the GPU host, "importing torch._inductor.compile_fx initialized
# CUDA", so its passes started fresh interpreters; (b) the profiler's first start is imports: 893 modules
# (torch._dynamo, sympy, torch.distributed.fsdp, ...) compiled from source (torch's bytecode is not cached on this
# host), 5.8 s. This tree preloads torch._dynamo and triton_kernel_wrap (that set) instead of compile_fx, and
# starts a second prefork without a module that initialized CUDA.
# 1. The prefork alone: modules, seconds, refused or not.
# 2. The 10 GPU lowerings that do not torch.compile (run 11's command without the two compiled merges, whose cold
#    compiles alone took 240 s in run 65), 500 cases each, --jobs 10 --mps, production off: pass 1 cold with the
#    prefork, then warm passes alternating --jobs-start spawn / prefork / spawn / prefork; figures compared.
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
    print("refused:", err, "module:", err.module)
PY
echo "== prefork"; cat $OUT/prefork.txt
SX="--mps --limit max_production_context=0 --limit max_production_batch=2 --limit models=none"
export SWEEP_LOWERINGS="context[flashinfer-fa2] context[flashinfer-fa3] decode_rows[flashinfer] decode_rows[flashinfer-tc] windowed_merge[flashinfer-eager] windowed_merge[flashinfer-triton] windowed_merge[flashinfer-merge_state] hybrid_paged hybrid_paged[splits=4] windowed_merge[triton]"
: > $OUT/sweeps.log
for spec in "1 prefork" "2 spawn" "3 prefork" "4 spawn" "5 prefork"; do
  set -- $spec
  lim=60; [ "$1" = 1 ] && lim=${SWEEP_LIMIT:-150}
  STEPS=sweep SWEEP_FIRST_PASS=$1 SWEEP_PASSES=$1 SWEEP_JOBS=10 SWEEP_TIMEOUT=$lim SWEEP_EXTRA="$SX --jobs-start $2" \
    NO_FINAL_PACK=1 bash scripts/gpu_session.sh > /dev/null 2>&1
  cat $OUT/gpu_session.log >> $OUT/sweeps.log; rm -f $OUT/gpu_session.log
done
grep -E "^== (fast|GPU|CPU)|exit code|\[jobs\] (children|the prefork|[0-9]+ process)|cases in|INTERRUPTED" $OUT/sweeps.log | cut -c1-250
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
