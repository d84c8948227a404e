# Run 63 (session 18): one H200 call over main at the commit named in the record; .fib/ carried; a fresh machine
# (cold Triton/inductor caches, as run 8's were).
# Issue 18, after run 62 (every --jobs child CPU-bound: its CPU seconds within 1-3% of its wall; 408.8 CPU-s in
# all for run 11's command, 25.6 s on 16 cores at best):
# 1. The host's CPU (lscpu: physical cores behind the 16), and what a child's imports cost on it (-X importtime).
# 2. The profiler's first start again, by variant (scripts/gpu_profiler_first_start.py: plain, 40 kernels loaded,
#    no external correlation, kineto asked for kernels only, raw CUPTI enable first).
# 3. The GPU tests that read real kernel names (test_kernel_names.py, the fa3_silently_fa2 mutant): session 17's
#    refactors (df6b2fb, 6e8cde0) on the GPU.
# 4. Run 8's command under --mps with the production dimension off, on cold caches as run 8 ran (SIGTERM at 240 s):
#    the rate per lowering against run 8's 2.2-3.2 cases/s; the compiled merges now with inductor's compile pool
#    capped (child_env).
set -u
export PYTHONUNBUFFERED=1
STEPS=setup NO_FINAL_PACK=1 bash scripts/gpu_session.sh > /dev/null 2>&1
mv $OUT/gpu_session.log $OUT/setup.log 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD TRITON_CACHE_DIR=/tmp/jit/triton TORCHINDUCTOR_CACHE_DIR=/tmp/jit/inductor
{
  echo "== lscpu"; lscpu | grep -E "^(Model name|CPU\(s\)|Thread|Core|Socket|CPU max MHz|CPU MHz|NUMA node\(s\))"
  echo "== python3 -X importtime: a fa2 child's imports (parity.session, lowerings, strategies, hypothesis, flashinfer)"
  python3 -X importtime -c "import parity.session, lowerings, strategies, hypothesis, parity.case_run; lowerings.get('context[flashinfer-fa2]'); import flashinfer" 2> /tmp/imp.txt
  python3 - <<'PY'
rows = []
for line in open("/tmp/imp.txt"):
    if line.startswith("import time:") and "|" in line:
        parts = line[len("import time:"):].split("|")
        try:
            rows.append((int(parts[1]), int(parts[0]), parts[2].rstrip("\n")))
        except ValueError:
            pass
tops = [c for c, s, n in rows if not n.startswith("  ")]
print(f"total {sum(tops) / 1e6:.2f} s over {len(rows)} modules")
for c, s, n in sorted(rows, reverse=True)[:30]:
    print(f"{c / 1e6:7.3f} s cumulative {s / 1e6:6.3f} s self {n}")
PY
} > $OUT/host.txt 2>&1
cat $OUT/host.txt | head -45
start=$(date +%s)
timeout -s TERM -k 5 ${FS_LIMIT:-75} python3 scripts/gpu_profiler_first_start.py --procs 1 2>&1 | grep -v "_warn_once\|UserWarning" > $OUT/first-start.txt
echo "== first start: $(( $(date +%s) - start )) s"; cut -c1-600 $OUT/first-start.txt
start=$(date +%s)
timeout -s TERM -k 10 ${TEST_LIMIT:-150} python3 -m pytest -q -p no:cacheprovider -rs \
  tests/lowerings/test_kernel_names.py tests/lowerings/test_gpu_mutants.py -k "kernel_names or fa3_silently_fa2" \
  > $OUT/pytest.txt 2>&1
echo "== GPU tests: exit $? after $(( $(date +%s) - start )) s"; tail -6 $OUT/pytest.txt
rm -rf /tmp/report
STEPS=check CHECK_ARGS="--jobs 16 --mps --limit max_production_context=0 --limit max_production_batch=2 --limit models=none" \
  CHECK_TIMEOUT=${CHECK_LIMIT:-240} NO_FINAL_PACK=1 bash scripts/gpu_session.sh > /dev/null 2>&1
mv $OUT/gpu_session.log $OUT/hardened-small.log
grep -E "^== |exit code|^lowering|^---|pass |fail |FAIL|unavailable|INTERRUPTED|stopp|cases in|\[mps\]|done in|retried|waited" $OUT/hardened-small.log | cut -c1-220 | head -75
echo "all done"
