# Run 59 (session 17): one H200 call over main at the commit named in the record; .fib/ carried; a fresh machine.
# Issue 18 follow-up: in run 58 (run 8's hardened command, production off, --mps) hybrid_paged[splits=4] failed its
# compile bound: 3 Triton variants in one shape family ('float16', 'float16', 128, 1, 7, 3, 3, 'int32'), bound 2.
# 1. The same lowering and arguments in one process (--no-isolate), with docs/gpu/runs/59-compile-keys.py printing
#    each new variant's case and Triton cache key.
# 2. The same with --kernel-names-every 0: does profiling the judged call (session 17) play a part?
set -u
export PYTHONUNBUFFERED=1
STEPS=setup NO_FINAL_PACK=1 bash scripts/gpu_session.sh > /dev/null 2>&1
mv $OUT/gpu_session.log $OUT/setup.log 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD TRITON_CACHE_DIR=/tmp/jit/triton TORCHINDUCTOR_CACHE_DIR=/tmp/jit/inductor
ARGS=(check --device cuda --profile gpu --no-isolate --lowering 'hybrid_paged[splits=4]' --limit max_production_context=0
      --limit max_production_batch=2 --limit models=none)
start=$(date +%s)
timeout -s TERM -k 10 ${KEYS_LIMIT:-200} python3 docs/gpu/runs/59-compile-keys.py "${ARGS[@]}" --report /tmp/r59a > $OUT/keys.txt 2>&1
echo "== 1. with kernel names: exit $? after $(( $(date +%s) - start )) s"
grep -c "^COMPILE" $OUT/keys.txt; grep -E "hybrid_paged\[splits=4\] |compiled [0-9]+ times" $OUT/keys.txt | head
start=$(date +%s)
timeout -s TERM -k 10 ${KEYS_LIMIT:-200} python3 docs/gpu/runs/59-compile-keys.py "${ARGS[@]}" --kernel-names-every 0 --report /tmp/r59b > $OUT/keys-no-names.txt 2>&1
echo "== 2. kernel names off: exit $? after $(( $(date +%s) - start )) s"
grep -c "^COMPILE" $OUT/keys-no-names.txt; grep -E "hybrid_paged\[splits=4\] |compiled [0-9]+ times" $OUT/keys-no-names.txt | head
echo "all done"
