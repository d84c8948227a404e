# Run 39 (session 12): one H200 call over main at the commit named in the record (`yardstick_score_rel`, format 3,
# the batched yardstick, cached strategies and page lists), .fib/ carried (flashinfer bundle, the 34-module pack).
# 1. Issue 14: the two fa2 wrappers of examples/plugin_wrapped_flashinfer.py, 2,000 cases each (seed 3, as runs 35
#    and 38), under the kernel-keyed bounds that now follow the score size.
# 2. Where a case's host time goes now: cProfile of one `check` process, alone on the GPU.
set -u
STEPS=sweep,profile SWEEP_N=2000 SWEEP_JOBS=15 SWEEP_LOWERINGS="my_fa2_context my_direct_fa2_context" \
  SWEEP_EXTRA='--plugin examples/plugin_wrapped_flashinfer.py --shards my_fa2_context=7 --shards my_direct_fa2_context=8' \
  SWEEP_TIMEOUT=${WRAP_TIMEOUT:-240} PROFILE_LOWERINGS="decode_rows[flashinfer-tc]" PROFILE_N=400 PROFILE_TIMEOUT=50 \
  NO_FINAL_PACK=1 bash scripts/gpu_session.sh
