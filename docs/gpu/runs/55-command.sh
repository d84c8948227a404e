# Run 55 (session 16): one H200 call over main at the commit named in the record; .fib/ carried; the session's last
# device time (about 290 s, a fresh machine).
# Issue 18: run 54's hardened record waited for device memory 33-73% of its time (parity.memory.device_lease: a large
# case leases footprint.run_bytes from the other processes). How close is that estimate to what a hardened case
# peaks at? scripts/gpu_phase_profile.py --hardening on production-scale cases of context[flashinfer-fa2] (the
# lowering that waited most, 73%), alone on the GPU: per case, torch.cuda.max_memory_allocated against run_bytes.
set -u
export PYTHONUNBUFFERED=1
STEPS=setup NO_FINAL_PACK=1 bash scripts/gpu_session.sh > /dev/null 2>&1
mv $OUT/gpu_session.log $OUT/setup.log 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD TRITON_CACHE_DIR=/tmp/jit/triton TORCHINDUCTOR_CACHE_DIR=/tmp/jit/inductor
start=$(date +%s)
timeout -s TERM -k 5 ${PHASE_LIMIT:-80} python3 scripts/gpu_phase_profile.py --hardening --cases 25 --kernel-cases 0 \
  --min-keys 4097 'context[flashinfer-fa2]' > $OUT/fa2-hardened.txt 2>&1
echo "== phase profile fa2, hardened: exit $? after $(( $(date +%s) - start )) s"
grep -E "^==|per case|peak " $OUT/fa2-hardened.txt | grep -v "warm-up"
echo "all done"
