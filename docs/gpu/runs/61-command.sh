# Run 61 (session 17): one H200 call over main at the commit named in the record; no flashinfer needed (nothing
# carried); a fresh machine; the session's last device time (about 260 s).
# Issue 18: in run 57's warm sweep (small shapes, 15 processes under MPS) the kernel-names phase was 21-35% of the
# flashinfer lowerings' time, and in run 56's synchronized profile, alone, 3.1-3.4 ms per case. What does
# `parity.hardening.KernelNames` (torch.profiler started and stopped around the judged call) cost per profiled call,
# alone and with 15 processes side by side, with and without MPS? scripts/gpu_profiler_cost.py.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
timeout -s TERM -k 5 ${COST_LIMIT:-40} python3 scripts/gpu_profiler_cost.py --procs 1 15 --iters 40 2>&1 | grep -v "_warn_once\|UserWarning" | tee $OUT/cost.txt
timeout -s TERM -k 5 ${COST_LIMIT:-40} python3 scripts/gpu_profiler_cost.py --procs 15 --iters 40 --mps 2>&1 | grep -v "_warn_once\|UserWarning" | tee -a $OUT/cost.txt
echo "all done"
