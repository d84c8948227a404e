# Run 47 (session 14): one H200 call over main at the commit named in the record; .fib/ carried.
# Issue 13, top-up with seed 6 (run 11's fast-sweep flags, the default `gpu` profile, SIGTERM at the limit):
# decode_rows (10 shards) and windowed_merge[eager] (6 shards), 650 cases each.
set -u
export PYTHONUNBUFFERED=1
STEPS=setup NO_FINAL_PACK=1 bash scripts/gpu_session.sh > /dev/null 2>&1
mv $OUT/gpu_session.log $OUT/setup.log 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD TRITON_CACHE_DIR=/tmp/jit/triton TORCHINDUCTOR_CACHE_DIR=/tmp/jit/inductor
start=$(date +%s)
timeout -s TERM -k 60 ${SWEEP_LIMIT:-400} python3 -m parity.cli check --device cuda --profile gpu --seed 6 --max-examples 650 \
  --jobs 16 --warm-up --no-hardening --no-isolate --report /tmp/seed6 \
  --lowering decode_rows --lowering 'windowed_merge[eager]' \
  --shards decode_rows=10 --shards 'windowed_merge[eager]=6' > /tmp/seed6.log 2>&1
echo "exit code: $? after $(( $(date +%s) - start )) s"
grep -v "cases, .* unsupported, .* failed\|_warn_once\|UserWarning\|case(s)/\|warm-up [0-9]" /tmp/seed6.log | tail -30
cp /tmp/seed6.log /tmp/seed6/check.log; tar -C /tmp -czf $OUT/seed6.tgz seed6
echo "all done"
