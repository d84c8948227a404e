# Run 48 (session 15): one H200 call over main at the commit named in the record; .fib/ carried.
# 1. Issue 13: windowed_merge[eager] (torch, CUDA) to 2,000 production-profile cases: seed 3, run 11's
#    fast-sweep flags, the default `gpu` profile, 16 shards, SIGTERM at the limit (partial report kept). Its part A
#    now reads each request's keys once (a3a4764, first time on the GPU).
# 2. Issue 18: the phase profile of production-scale cases alone (--min-keys 4097), one lowering per process,
#    alone on the GPU: the device time of a case past 4,096 keys.
set -u
export PYTHONUNBUFFERED=1
STEPS=setup NO_FINAL_PACK=1 bash scripts/gpu_session.sh > /dev/null 2>&1
mv $OUT/gpu_session.log $OUT/setup.log 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD TRITON_CACHE_DIR=/tmp/jit/triton TORCHINDUCTOR_CACHE_DIR=/tmp/jit/inductor
start=$(date +%s)
timeout -s TERM -k 60 ${SWEEP_LIMIT:-360} python3 -m parity.cli check --device cuda --profile gpu --seed 3 --max-examples 2000 \
  --jobs 16 --warm-up --no-hardening --no-isolate --report /tmp/eager3 \
  --lowering 'windowed_merge[eager]' --shards 'windowed_merge[eager]=16' > /tmp/eager3.log 2>&1
echo "exit code: $? after $(( $(date +%s) - start )) s"
grep -v "cases, .* unsupported, .* failed\|_warn_once\|UserWarning\|case(s)/\|warm-up [0-9]" /tmp/eager3.log | tail -40
cp /tmp/eager3.log /tmp/eager3/check.log; tar -C /tmp -czf $OUT/eager3.tgz eager3
for l in 'decode_rows[flashinfer-tc]' 'context[flashinfer-fa2]'; do
  start=$(date +%s)
  timeout -s TERM -k 10 ${PHASE_LIMIT:-85} python3 scripts/gpu_phase_profile.py --cases 12 --kernel-cases 6 --min-keys 4097 "$l" 2>&1 \
    | grep -v "_warn_once\|UserWarning\|warm-up [0-9]" | tee -a $OUT/phase.txt
  echo "phase $l: exit ${PIPESTATUS[0]} after $(( $(date +%s) - start )) s" | tee -a $OUT/phase.txt
done
echo "all done"
