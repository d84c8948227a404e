# Run 46 (session 14): one H200 call over main at the commit named in the record; .fib/ carried.
# Issue 13, top-up with seed 5 (run 11's fast-sweep flags, the default `gpu` profile, SIGTERM at the limit):
# windowed_merge[triton] (8 shards), context (2), decode_rows (4), sdpa (2), 900 cases each.
set -u
export PYTHONUNBUFFERED=1
STEPS=setup NO_FINAL_PACK=1 bash scripts/gpu_session.sh > /dev/null 2>&1
mv $OUT/gpu_session.log $OUT/setup.log 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD TRITON_CACHE_DIR=/tmp/jit/triton TORCHINDUCTOR_CACHE_DIR=/tmp/jit/inductor
start=$(date +%s)
timeout -s TERM -k 60 ${SWEEP_LIMIT:-400} python3 -m parity.cli check --device cuda --profile gpu --seed 5 --max-examples 900 \
  --jobs 16 --warm-up --no-hardening --no-isolate --report /tmp/seed5 \
  --lowering 'windowed_merge[triton]' --lowering context --lowering decode_rows --lowering sdpa \
  --shards 'windowed_merge[triton]=8' --shards context=2 --shards decode_rows=4 --shards sdpa=2 > /tmp/seed5.log 2>&1
echo "exit code: $? after $(( $(date +%s) - start )) s"
grep -v "cases, .* unsupported, .* failed\|_warn_once\|UserWarning\|case(s)/\|warm-up [0-9]" /tmp/seed5.log | tail -30
cp /tmp/seed5.log /tmp/seed5/check.log; tar -C /tmp -czf $OUT/seed5.tgz seed5
echo "all done"
