# Run 38 (session 12): one H200 call. The tree is main at the new host-work commits; .head/ is main before them
# (d5d7814, `git archive`), carried with .fib/ (flashinfer bundle, the CPU-built module pack).
# 1. Issue 14: the two fa2 wrappers of examples/plugin_wrapped_flashinfer.py to 2,000 cases under the kernel-keyed
#    bounds of d5d7814 (run 35's command and seed; each shard stops at a failure).
# 2. The new code on CUDA: its GPU tests (format 3's device build, the batched yardstick, the oracle engine).
# 3. The phase time line, before (.head) and after (this tree), alone on the GPU; (cProfile: a later call).
set -u
ln -sfn ../.fib .head/.fib
( cd .head && STEPS=sweep SWEEP_N=2000 SWEEP_JOBS=14 SWEEP_LOWERINGS="my_fa2_context my_direct_fa2_context" \
  SWEEP_EXTRA='--plugin examples/plugin_wrapped_flashinfer.py --shards my_fa2_context=7 --shards my_direct_fa2_context=7' \
  SWEEP_TIMEOUT=${SWEEP_TIMEOUT:-300} NO_FINAL_PACK=1 bash scripts/gpu_session.sh )
mv $OUT/gpu_session.log $OUT/head_session.log
STEPS=tests,phase PYTEST_TARGETS="tests/oracle/test_values.py tests/lowerings/test_protocol.py tests/oracle/test_fast_engine.py" \
  PYTEST_K="cuda or gpu or yardstick or fast" TESTS_TIMEOUT=90 PHASE_BEFORE=.head \
  PHASE_LOWERINGS="context[flashinfer-fa2] decode_rows[flashinfer-tc] windowed_merge[flashinfer-eager]" PHASE_N=40 PHASE_M=16 \
  PHASE_TIMEOUT=75 NO_FINAL_PACK=1 \
  bash scripts/gpu_session.sh
