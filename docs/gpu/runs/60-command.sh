# Run 60 (session 17): one H200 call over main at the commit named in the record; .fib/ carried; a fresh machine.
# The fix of run 59's finding: the guarded output views start a whole number of 512 bytes into their allocation
# (oracle.inputs.VIEW_ALIGN_BYTES), so Triton no longer sees an LSE pointer whose 16-byte alignment follows the batch
# size. Run 59's first command again (hybrid_paged[splits=4], run 8's hardened flags, production off, in process,
# kernel names on), with each new Triton variant printed: the bound of 2 per family should hold.
set -u
export PYTHONUNBUFFERED=1
STEPS=setup NO_FINAL_PACK=1 bash scripts/gpu_session.sh > /dev/null 2>&1
mv $OUT/gpu_session.log $OUT/setup.log 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD TRITON_CACHE_DIR=/tmp/jit/triton TORCHINDUCTOR_CACHE_DIR=/tmp/jit/inductor
ARGS=(check --device cuda --profile gpu --no-isolate --lowering 'hybrid_paged[splits=4]' --limit max_production_context=0
      --limit max_production_batch=2 --limit models=none)
start=$(date +%s)
timeout -s TERM -k 10 ${KEYS_LIMIT:-220} python3 docs/gpu/runs/59-compile-keys.py "${ARGS[@]}" --report /tmp/r60 > $OUT/keys.txt 2>&1
echo "== with kernel names: exit $? after $(( $(date +%s) - start )) s"
grep -c "^COMPILE" $OUT/keys.txt; grep -E "hybrid_paged\[splits=4\] |compiled [0-9]+ times|cases in" $OUT/keys.txt | head
grep -A3 "family=('float16', 'float16', 128, 1, 7, 3, 3, 'int32')" $OUT/keys.txt | cut -c1-200
echo "all done"
