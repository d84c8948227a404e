# run 110's call (fresh machine, one H100): the fill of both trees, then one warm pass each
echo "fresh: $([ -d /tmp/phases-runs ] && echo no || echo yes)"; nvidia-smi --query-gpu=name --format=csv,noheader; OUT=$OUT FILL=210 PASSES=1 bash lab/gpu_issue48_phases.sh 2>&1 | tail -30; ls /tmp/phases-runs
