# run 115's call (the same machine, warm): the oracle's and the yardstick's tests, then the GPU-marked tests not slow
OUT=$OUT bash lab/gpu_issue48_steps.sh
