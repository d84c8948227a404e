# Run 50 (session 15): one H200 call over main at the commit named in the record; .fib/ carried.
# Issue 18: do the side-by-side processes take turns on the GPU? The same sweep twice, 16 processes
# (fa2 context, both flashinfer decodes, the flashinfer eager merge, 4 shards each; seed 3, the default `gpu`
# profile, run 11's fast-sweep flags), SIGTERM at 150 s: first as always, then under CUDA MPS (MPS=1).
set -u
export PYTHONUNBUFFERED=1
STEPS=setup NO_FINAL_PACK=1 bash scripts/gpu_session.sh > /dev/null 2>&1
mv $OUT/gpu_session.log $OUT/setup.log 2>/dev/null
L="context[flashinfer-fa2] decode_rows[flashinfer-tc] decode_rows[flashinfer] windowed_merge[flashinfer-eager]"
X="--shards context[flashinfer-fa2]=4 --shards decode_rows[flashinfer-tc]=4 --shards decode_rows[flashinfer]=4 --shards windowed_merge[flashinfer-eager]=4"
STEPS=sweep SWEEP_N=3000 SWEEP_JOBS=16 SWEEP_LOWERINGS="$L" SWEEP_EXTRA="$X" SWEEP_TIMEOUT=${SWEEP_LIMIT:-150} \
  NO_FINAL_PACK=1 bash scripts/gpu_session.sh > /dev/null 2>&1
mv $OUT/gpu_session.log $OUT/plain.log; mv $OUT/sweep1.tgz $OUT/plain.tgz
STEPS=sweep SWEEP_N=3000 SWEEP_JOBS=16 SWEEP_LOWERINGS="$L" SWEEP_EXTRA="$X" SWEEP_TIMEOUT=${SWEEP_LIMIT:-150} \
  NO_FINAL_PACK=1 MPS=1 bash scripts/gpu_session.sh > /dev/null 2>&1
mv $OUT/gpu_session.log $OUT/mps.log; mv $OUT/sweep1.tgz $OUT/mps.tgz
for f in plain mps; do echo "#### $f"; grep -E "^== (fast|GPU|CUDA)|exit code|^lowering|^---|pass |fail |INTERRUPTED|time |cases in" $OUT/$f.log; done
echo "all done"
