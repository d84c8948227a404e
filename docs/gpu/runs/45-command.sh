# Run 45 (session 14): one H200 call over main at the commit named in the record; .fib/ carried (flashinfer
# bundle, the pack of all 42 modules).
# Issue 13, three checks side by side (run 11's fast-sweep flags, the default `gpu` profile), SIGTERM at the
# limit keeps each partial report:
# A. run 44's two lowerings topped up with seed 4, 900 cases each: windowed_merge[flashinfer-compiled] in 9
#    shards (split by compile family), windowed_merge[triton] in 4;
# B. the torch lowerings on CUDA, never run at production scale: context, decode_rows, sdpa, 2,000 cases each,
#    seed 3, one process each.
set -u
export PYTHONUNBUFFERED=1
STEPS=setup NO_FINAL_PACK=1 bash scripts/gpu_session.sh > /dev/null 2>&1
mv $OUT/gpu_session.log $OUT/setup.log 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD TRITON_CACHE_DIR=/tmp/jit/triton TORCHINDUCTOR_CACHE_DIR=/tmp/jit/inductor
LIMIT=${SWEEP_LIMIT:-440}
nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader,nounits -lms 500 > /tmp/smi.csv & SMI=$!
start=$(date +%s)
timeout -s TERM -k 60 $LIMIT python3 -m parity.cli check --device cuda --profile gpu --seed 4 --max-examples 900 \
  --jobs 13 --warm-up --no-hardening --no-isolate --report /tmp/topup \
  --lowering 'windowed_merge[flashinfer-compiled]' --lowering 'windowed_merge[triton]' \
  --shards 'windowed_merge[flashinfer-compiled]=9' --shards 'windowed_merge[triton]=4' > /tmp/topup.log 2>&1 &
A=$!
timeout -s TERM -k 60 $LIMIT python3 -m parity.cli check --device cuda --profile gpu --seed 3 --max-examples 2000 \
  --jobs 3 --warm-up --no-hardening --no-isolate --report /tmp/torch \
  --lowering context --lowering decode_rows --lowering sdpa > /tmp/torch.log 2>&1 &
B=$!
wait $A; echo "top-up exit code: $? after $(( $(date +%s) - start )) s"
wait $B; echo "torch exit code: $? after $(( $(date +%s) - start )) s"
kill $SMI
python3 - <<'PY'
us=[float(r.split(",")[0]) for r in open("/tmp/smi.csv") if r.strip() and r.split(",")[0].strip().isdigit()]
print(f"GPU utilization: mean {sum(us)/len(us):.0f}% over {len(us)} samples")
PY
for r in topup torch; do
  echo "== $r"; grep -v "cases, .* unsupported, .* failed\|_warn_once\|UserWarning\|case(s)/" /tmp/$r.log | tail -30
  cp /tmp/$r.log /tmp/$r/check.log
done
tar -C /tmp -czf $OUT/reports.tgz topup torch
echo "all done"
