# Run 39 (session 12): one H200 call over main at the commit named in the record (`yardstick_score_rel`, format 3,
# the batched yardstick, cached strategies), .fib/ carried (flashinfer bundle; packs of all 42 modules, fa3's too).
# 1. Issue 14: the two fa2 wrappers of examples/plugin_wrapped_flashinfer.py, 2,000 cases each (seed 3, as runs 35
#    and 38), under the kernel-keyed bounds that now follow the score size.
# 2. Issue 18: run 11's sweep (the 11 GPU lowerings x 500 cases, --jobs 15, the compiled merge in 5 shards,
#    --warm-up, no hardening, in process): pass 1 on this fresh machine's cold Triton/inductor caches, pass 2 warm.
set -u
STEPS=sweep SWEEP_N=2000 SWEEP_JOBS=15 SWEEP_LOWERINGS="my_fa2_context my_direct_fa2_context" \
  SWEEP_EXTRA='--plugin examples/plugin_wrapped_flashinfer.py --shards my_fa2_context=7 --shards my_direct_fa2_context=8' \
  SWEEP_TIMEOUT=${WRAP_TIMEOUT:-210} NO_FINAL_PACK=1 bash scripts/gpu_session.sh
for f in sweep1.tgz gpu_session.log; do mv "$OUT/$f" "$OUT/wrappers-$f"; done
STEPS=sweep SWEEP_PASSES=2 SWEEP_JOBS=15 SWEEP_EXTRA='--shards windowed_merge[flashinfer-compiled]=5' \
  SWEEP_TIMEOUT=${COLD_TIMEOUT:-200} SWEEP_TIMEOUT_LATER=${WARM_TIMEOUT:-120} NO_FINAL_PACK=1 bash scripts/gpu_session.sh
