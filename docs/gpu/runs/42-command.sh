# Run 42 (session 13): one H200 call over main at the commit named in the record; .fib/ carried (flashinfer
# bundle, the pack of the 34 page/cascade/decode/fa2 modules built on the CPU).
# Issue 13: the windowed merges (four flashinfer forms, the Triton one) and both hybrid paged kernels, 2,000
# production-profile cases each (seed 3, the default `gpu` profile), run 11's fast-sweep flags (no hardening,
# in process, warm-up), 16 processes (shards); SIGINT at the limit keeps each partial report.
set -u
export PYTHONUNBUFFERED=1
STEPS=sweep SWEEP_N=2000 SWEEP_JOBS=16 \
  SWEEP_LOWERINGS="windowed_merge[flashinfer-eager] windowed_merge[flashinfer-compiled] windowed_merge[flashinfer-triton] windowed_merge[flashinfer-merge_state] hybrid_paged hybrid_paged[splits=4] windowed_merge[triton]" \
  SWEEP_EXTRA='--shards windowed_merge[flashinfer-eager]=2 --shards windowed_merge[flashinfer-compiled]=3 --shards windowed_merge[flashinfer-triton]=2 --shards windowed_merge[flashinfer-merge_state]=2 --shards hybrid_paged=2 --shards hybrid_paged[splits=4]=2 --shards windowed_merge[triton]=3' \
  SWEEP_TIMEOUT=${SWEEP_LIMIT:-530} NO_FINAL_PACK=1 bash scripts/gpu_session.sh
