# Run 42 (session 13): one H200 call over main at the commit named in the record; .fib/ carried (flashinfer
# bundle, the pack of all 42 modules, fa3's 8 from session 12's CPU build).
# Issue 13: fa3, the windowed merges (four flashinfer forms, the Triton one) and both hybrid paged kernels, 2,000
# production-profile cases each (seed 3, the default `gpu` profile), run 11's fast-sweep flags (no hardening,
# in process, warm-up), 18 processes (shards); SIGINT at the limit keeps each partial report.
set -u
export PYTHONUNBUFFERED=1
STEPS=sweep SWEEP_N=2000 SWEEP_JOBS=18 \
  SWEEP_LOWERINGS="context[flashinfer-fa3] windowed_merge[flashinfer-eager] windowed_merge[flashinfer-compiled] windowed_merge[flashinfer-triton] windowed_merge[flashinfer-merge_state] hybrid_paged hybrid_paged[splits=4] windowed_merge[triton]" \
  SWEEP_EXTRA='--shards context[flashinfer-fa3]=2 --shards windowed_merge[flashinfer-eager]=2 --shards windowed_merge[flashinfer-compiled]=3 --shards windowed_merge[flashinfer-triton]=2 --shards windowed_merge[flashinfer-merge_state]=2 --shards hybrid_paged=2 --shards hybrid_paged[splits=4]=2 --shards windowed_merge[triton]=3' \
  SWEEP_TIMEOUT=${SWEEP_LIMIT:-530} NO_FINAL_PACK=1 bash scripts/gpu_session.sh
