# Run 70 (session 20): the machine of run 69, still warm (its JIT and bytecode caches), the same tree (c0b8d2a).
# Three more warm passes of run 11's full command, prefork, the bytecode cache opted in: the spread of the figure.
# (Run as one line through the device tool; written out here.)
export PYTHONPATH=/tmp/site:$PWD TRITON_CACHE_DIR=/tmp/jit/triton TORCHINDUCTOR_CACHE_DIR=/tmp/jit/inductor DFLASH_PARITY_PYCACHE=/tmp/dflash-pycache
SX="--shards windowed_merge[flashinfer-compiled]=5 --mps --limit max_production_context=0 --limit max_production_batch=2 --limit models=none"
for n in 6 7 8; do
  STEPS=sweep SWEEP_FIRST_PASS=$n SWEEP_PASSES=$n SWEEP_JOBS=15 SWEEP_TIMEOUT=90 SWEEP_EXTRA="$SX --jobs-start prefork" NO_FINAL_PACK=1 bash scripts/gpu_session.sh > /dev/null 2>&1
  grep -E "^== fast|exit code|== CPU|== GPU|\[jobs\] (children|[0-9]+ process|.*done in)|cases in" $OUT/gpu_session.log | cut -c1-220
  grep -h "  time " /tmp/sweep$n/sweep.log
  mv $OUT/gpu_session.log $OUT/pass$n.log
done
(cd $OUT && tar -cf sweeps.tar sweep*.tgz && rm -f sweep*.tgz)
