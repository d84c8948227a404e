# Run 71 (session 20): the machine of runs 69-70, still warm, the same tree (c0b8d2a). Three more warm passes,
# as run 70. (Run as one line through the device tool; written out here.)
export PYTHONPATH=/tmp/site:$PWD TRITON_CACHE_DIR=/tmp/jit/triton TORCHINDUCTOR_CACHE_DIR=/tmp/jit/inductor DFLASH_PARITY_PYCACHE=/tmp/dflash-pycache
SX="--shards windowed_merge[flashinfer-compiled]=5 --mps --limit max_production_context=0 --limit max_production_batch=2 --limit models=none"
for n in 9 10 11; do
  STEPS=sweep SWEEP_FIRST_PASS=$n SWEEP_PASSES=$n SWEEP_JOBS=15 SWEEP_TIMEOUT=90 SWEEP_EXTRA="$SX --jobs-start prefork" NO_FINAL_PACK=1 bash scripts/gpu_session.sh > /dev/null 2>&1
  grep -E "^== fast|exit code|== CPU|== GPU|\[jobs\] (children|[0-9]+ process)|cases in" $OUT/gpu_session.log | cut -c1-220
  mv $OUT/gpu_session.log $OUT/pass$n.log
done
(cd $OUT && tar -cf sweeps.tar sweep*.tgz && rm -f sweep*.tgz)
nproc; uptime
