# run 112's call (the same machine, warm, 10 s after run 111): two more warm passes each
nvidia-smi --query-gpu=name --format=csv,noheader; OUT=$OUT FILL=0 PASSES=2 bash lab/gpu_issue48_phases.sh 2>&1 | grep -E "==|cases in|exit code|flashinfer-compiled"
