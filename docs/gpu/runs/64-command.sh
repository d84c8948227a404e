# Run 64 (session 18): one H200 call over main at the commit named in the record; .fib/ carried; a fresh machine;
# the session's last device time (about 460 s, a start included), so the most useful first.
# Issue 18: run 63 saw the profiler's first start at 3.76 s with kineto's external correlation off against
# 4.42-6.20 s plain (one sample each). This tree's KernelNames turns it off (parity.hardening.profiler_options).
# 1. scripts/gpu_profiler_first_start.py, plain and without the correlation in turn, three times each.
# 2. The GPU tests that read real kernel names (now through the new options): test_kernel_names.py and the
#    fa3_silently_fa2 mutant.
# 3. A small isolated `check --jobs 2 --mps` (sdpa, context[flashinfer-fa2], 30 cases, production off): the
#    children's "done" lines now add their isolated workers' CPU seconds (run 63 undercounted them).
set -u
export PYTHONUNBUFFERED=1
STEPS=setup NO_FINAL_PACK=1 bash scripts/gpu_session.sh > /dev/null 2>&1
mv $OUT/gpu_session.log $OUT/setup.log 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD TRITON_CACHE_DIR=/tmp/jit/triton TORCHINDUCTOR_CACHE_DIR=/tmp/jit/inductor
start=$(date +%s)
timeout -s TERM -k 5 ${FS_LIMIT:-80} python3 scripts/gpu_profiler_first_start.py --procs 1 \
  --modes plain nocorr plain nocorr plain nocorr 2>&1 | grep -v "_warn_once\|UserWarning" > $OUT/first-start.txt
echo "== first start: $(( $(date +%s) - start )) s"; cut -c1-260 $OUT/first-start.txt
start=$(date +%s)
timeout -s TERM -k 10 ${TEST_LIMIT:-70} python3 -m pytest -q -p no:cacheprovider -rs \
  tests/lowerings/test_kernel_names.py tests/lowerings/test_gpu_mutants.py -k "kernel_names or fa3_silently_fa2" \
  > $OUT/pytest.txt 2>&1
echo "== GPU tests: exit $? after $(( $(date +%s) - start )) s"; tail -3 $OUT/pytest.txt
start=$(date +%s)
timeout -s TERM -k 10 ${JOBS_LIMIT:-90} python3 -m parity.cli check --device cuda --profile gpu --jobs 2 --mps \
  --lowering sdpa --lowering 'context[flashinfer-fa2]' --max-examples 30 --limit max_production_context=0 \
  --limit max_production_batch=2 --limit models=none --report /tmp/jobs > $OUT/jobs.log 2>&1
echo "== isolated jobs: exit $? after $(( $(date +%s) - start )) s"
grep -E "\[jobs\]|isolated:|\[mps\]|cases in|^sdpa|^context" $OUT/jobs.log | cut -c1-200
echo "all done"
