# Run 44 (session 14): one H200 call over main at the commit named in the record; .fib/ carried (flashinfer
# bundle, the pack of all 42 modules).
# 1. The SIGINT unblock on the H200: a check in the foreground of the device's shell (SIGINT blocked there,
#    run 43) under `timeout -s INT 20`: it must exit 130 at ~20 s with its report written.
# 2. Issue 13: the two lowerings short of 2,000 production-profile cases (seed 3, the default `gpu` profile,
#    run 11's fast-sweep flags): windowed_merge[flashinfer-compiled] in 10 shards (now split by compile
#    family) and windowed_merge[triton] in 4 (its part A now gathers only the keys a row can see); SIGTERM at
#    the limit keeps each partial report; the Triton/inductor caches packed for the next call.
set -u
export PYTHONUNBUFFERED=1
STEPS=setup NO_FINAL_PACK=1 bash scripts/gpu_session.sh > /dev/null 2>&1
mv $OUT/gpu_session.log $OUT/setup.log 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD
{ echo "bash: $(grep -E 'SigIgn|SigBlk' /proc/$$/status | tr '\n' ' ')"; start=$(date +%s)
  timeout -s INT -k 30 20 python3 -m parity.cli check --device cpu --profile dev --lowering decode_rows \
    --max-examples 100000 --no-isolate --report /tmp/sigint
  echo "exit code: $? after $(( $(date +%s) - start )) s"; ls /tmp/sigint; grep -m3 "interrupted\|verdict" /tmp/sigint/parity.json; } > $OUT/sigint.log 2>&1
STEPS=sweep SWEEP_N=2000 SWEEP_JOBS=14 \
  SWEEP_LOWERINGS="windowed_merge[flashinfer-compiled] windowed_merge[triton]" \
  SWEEP_EXTRA='--shards windowed_merge[flashinfer-compiled]=10 --shards windowed_merge[triton]=4' \
  SWEEP_TIMEOUT=${SWEEP_LIMIT:-440} NO_FINAL_PACK=1 PACK_JIT=1 bash scripts/gpu_session.sh > /dev/null 2>&1
echo "all done"
