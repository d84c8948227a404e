# Run 67 (session 19): the machine of run 66, still warm (its caches); the tree with flashinfer out of the
# prefork's preload (it initialized CUDA there, run 66, and the second prefork doubled the serial imports).
# One warm pass with the prefork, then one with spawn, of run 66's 10 lowerings.
set -u
export PYTHONPATH=/tmp/site:$PWD TRITON_CACHE_DIR=/tmp/jit/triton TORCHINDUCTOR_CACHE_DIR=/tmp/jit/inductor
SX="--mps --limit max_production_context=0 --limit max_production_batch=2 --limit models=none"
export SWEEP_LOWERINGS="context[flashinfer-fa2] context[flashinfer-fa3] decode_rows[flashinfer] decode_rows[flashinfer-tc] windowed_merge[flashinfer-eager] windowed_merge[flashinfer-triton] windowed_merge[flashinfer-merge_state] hybrid_paged hybrid_paged[splits=4] windowed_merge[triton]"
for spec in "6 prefork" "7 spawn"; do
  set -- $spec
  STEPS=sweep SWEEP_FIRST_PASS=$1 SWEEP_PASSES=$1 SWEEP_JOBS=10 SWEEP_TIMEOUT=60 SWEEP_EXTRA="$SX --jobs-start $2" \
    NO_FINAL_PACK=1 bash scripts/gpu_session.sh > /dev/null 2>&1
  grep -E "^== (fast|GPU|CPU)|exit code|\[jobs\] (children|the prefork|[0-9]+ process)|cases in|started \(1|: done in" $OUT/gpu_session.log | cut -c1-220
  rm -f $OUT/gpu_session.log
done
