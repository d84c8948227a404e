# Run 58 (session 17): one H200 call over main at the commit named in the record; .fib/ carried; run 57's machine,
# still warm.
# Issue 18:
# 1. The kernel names of the judged call itself (session 17: no second run, no copy): the GPU tests that read real
#    kernel names (tests/lowerings/test_kernel_names.py; test_gpu_mutants.py's fa3_silently_fa2, a silent
#    fallback only kernel names catch).
# 2. Run 8's command (the hardened, isolated `gpu` record, --jobs 16) under `--mps` with the production dimension
#    off (the small shapes of run 8's day), SIGTERM at 240 s: the rate per lowering against run 8's 2.2-3.2 cases/s.
set -u
export PYTHONUNBUFFERED=1
STEPS=setup NO_FINAL_PACK=1 bash scripts/gpu_session.sh > /dev/null 2>&1
mv $OUT/gpu_session.log $OUT/setup.log 2>/dev/null
export TRITON_CACHE_DIR=/tmp/jit/triton TORCHINDUCTOR_CACHE_DIR=/tmp/jit/inductor
start=$(date +%s)
PYTHONPATH=/tmp/site:$PWD timeout -s TERM -k 10 ${TEST_LIMIT:-150} python3 -m pytest -q -p no:cacheprovider -rs \
  tests/lowerings/test_kernel_names.py tests/lowerings/test_gpu_mutants.py -k "kernel_names or fa3_silently_fa2" \
  > $OUT/pytest.txt 2>&1
echo "== GPU tests: exit $? after $(( $(date +%s) - start )) s"; tail -12 $OUT/pytest.txt
rm -rf /tmp/report  # run 56's report on this machine
STEPS=check CHECK_ARGS="--jobs 16 --mps --limit max_production_context=0 --limit max_production_batch=2 --limit models=none" \
  CHECK_TIMEOUT=${CHECK_LIMIT:-240} NO_FINAL_PACK=1 bash scripts/gpu_session.sh > /dev/null 2>&1
mv $OUT/gpu_session.log $OUT/hardened-small.log
grep -E "^== |exit code|^lowering|^---|pass |fail |FAIL|unavailable|INTERRUPTED|stopp|cases in|MPS|mps|retried|waited" $OUT/hardened-small.log | head -70
echo "all done"
