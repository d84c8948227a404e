# Run 52 (session 16): one H200 call over main at the commit named in the record; .fib/ carried.
# Issue 18: where a production-scale case's 40 ms of yardstick goes (run 48 measured the phase, not its cause).
# scripts/gpu_phase_profile.py --min-keys 4097, one lowering per process, alone on the GPU, now with each phase's
# per-case median/max/first case, the allocator's counters, cProfile's largest functions, and --keep-cache
# (empty_cache after a large case made a no-op) against the default.
set -u
export PYTHONUNBUFFERED=1
STEPS=setup NO_FINAL_PACK=1 bash scripts/gpu_session.sh > /dev/null 2>&1
mv $OUT/gpu_session.log $OUT/setup.log 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD TRITON_CACHE_DIR=/tmp/jit/triton TORCHINDUCTOR_CACHE_DIR=/tmp/jit/inductor
run() {  # $1 tag, then the script's arguments
  local tag=$1; shift
  local start=$(date +%s)
  timeout -s TERM -k 10 ${PHASE_LIMIT:-110} python3 scripts/gpu_phase_profile.py "$@" > $OUT/$tag.txt 2>&1
  echo "== $tag: exit $? after $(( $(date +%s) - start )) s: $*"
  grep -v "_warn_once\|UserWarning\|warm-up [0-9]\|^ \+[0-9]\+ \+[0-9.]\+ \+[0-9.]\+ \|^lowering \|^---\|matched no case" $OUT/$tag.txt \
    | grep -E "^==|per case|device time|cudaMalloc|%  " | head -40
}
run tc-default --cases 40 --kernel-cases 6 --min-keys 4097 --cprofile 45 'decode_rows[flashinfer-tc]'
run tc-keep --cases 40 --kernel-cases 6 --min-keys 4097 --keep-cache 'decode_rows[flashinfer-tc]'
run fa2-default --cases 40 --kernel-cases 6 --min-keys 4097 --cprofile 45 'context[flashinfer-fa2]'
echo "all done"
