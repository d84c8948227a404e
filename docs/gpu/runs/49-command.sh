# Run 49 (session 15): one H200 call over main at the commit named in the record; .fib/ carried.
# Issue 13: windowed_merge[compiled] (torch.compile merge, torch part A, CUDA) to 2,000 production-profile cases:
# seed 3, run 11's fast-sweep flags, the default `gpu` profile, 16 shards (split by compile family), SIGTERM at the
# limit (partial report kept).
set -u
export PYTHONUNBUFFERED=1
STEPS=setup NO_FINAL_PACK=1 bash scripts/gpu_session.sh > /dev/null 2>&1
mv $OUT/gpu_session.log $OUT/setup.log 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD TRITON_CACHE_DIR=/tmp/jit/triton TORCHINDUCTOR_CACHE_DIR=/tmp/jit/inductor
start=$(date +%s)
timeout -s TERM -k 60 ${SWEEP_LIMIT:-480} python3 -m parity.cli check --device cuda --profile gpu --seed 3 --max-examples 2000 \
  --jobs 16 --warm-up --no-hardening --no-isolate --report /tmp/compiled3 \
  --lowering 'windowed_merge[compiled]' --shards 'windowed_merge[compiled]=16' > /tmp/compiled3.log 2>&1
echo "exit code: $? after $(( $(date +%s) - start )) s"
grep -v "cases, .* unsupported, .* failed\|_warn_once\|UserWarning\|case(s)/\|warm-up [0-9]" /tmp/compiled3.log | tail -40
cp /tmp/compiled3.log /tmp/compiled3/check.log; tar -C /tmp -czf $OUT/compiled3.tgz compiled3
echo "all done"
