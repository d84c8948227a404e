# Run 56 (session 17): one H200 call over main at the commit named in the record; .fib/ carried; a fresh machine.
# Issue 18, measuring what session 16 built but could not run:
# 1. Run 8's command, the hardened `gpu` record (every lowering, isolated, every hardening check, --jobs 16), under
#    `--mps` (SIGTERM at 240 s), now with `footprint.lease_bytes` (3 input sets leased, not run_bytes' 5) and the
#    out-of-memory retry: compare the wait for device memory, the rate and `retried` with run 54.
# 2. `gpu_phase_profile.py --hardening` on two more lowerings (decode_rows[flashinfer-tc],
#    windowed_merge[flashinfer-eager]), production-scale cases alone: peak against run_bytes and lease_bytes.
# Since the scripts were written, also in this code: kernel names read from the judged call itself (no second run).
# 3. `gpu_yardstick_ab.py` on run 53's 30 cases: today's yardstick (one index-vector copy per case) against the
#    b6d5375 form (run 53: 20.6 -> 18.6 ms mean with one copy per batch).
set -u
export PYTHONUNBUFFERED=1
STEPS=setup NO_FINAL_PACK=1 bash scripts/gpu_session.sh > /dev/null 2>&1
mv $OUT/gpu_session.log $OUT/setup.log 2>/dev/null
STEPS=check CHECK_ARGS="--jobs 16 --mps" CHECK_TIMEOUT=${CHECK_LIMIT:-240} NO_FINAL_PACK=1 bash scripts/gpu_session.sh > /dev/null 2>&1
mv $OUT/gpu_session.log $OUT/hardened.log
grep -E "^== |exit code|^lowering|^---|pass |fail |FAIL|unavailable|INTERRUPTED|stopp|cases in|MPS|mps|retried|waited" $OUT/hardened.log | head -70
export PYTHONPATH=/tmp/site:$PWD TRITON_CACHE_DIR=/tmp/jit/triton TORCHINDUCTOR_CACHE_DIR=/tmp/jit/inductor
start=$(date +%s)
timeout -s TERM -k 5 ${PHASE_LIMIT:-90} python3 scripts/gpu_phase_profile.py --hardening --cases 16 --kernel-cases 0 \
  --min-keys 4097 'decode_rows[flashinfer-tc]' 'windowed_merge[flashinfer-eager]' > $OUT/hardened-profile.txt 2>&1
echo "== phase profile, hardened: exit $? after $(( $(date +%s) - start )) s"
grep -E "^==|per case|peak " $OUT/hardened-profile.txt | grep -v "warm-up"
start=$(date +%s)
timeout -s TERM -k 10 ${AB_LIMIT:-80} python3 scripts/gpu_yardstick_ab.py --cases 30 --min-keys 4097 > $OUT/ab.txt 2>&1
echo "== yardstick A/B: exit $? after $(( $(date +%s) - start )) s"; grep -v "_warn_once\|UserWarning" $OUT/ab.txt | tail -4
echo "all done"
