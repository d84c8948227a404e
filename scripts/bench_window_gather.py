"""The torch paged attention under a window, full gather against window gather (`lowerings.paged`), on the CPU.

    PYTHONPATH=. python scripts/bench_window_gather.py

One windowed-merge case (B=4, L up to 32,768, K=8, 16/4 heads, D=128, window (4095, 4095)) through
`windowed_merge[eager]` (its part A is `paged.paged_attention` with a left window), twice each way.
"""
import time, torch
import lowerings
from lowerings import paged
from oracle.inputs import materialize
from tests.oracle.oracle_cases import build_case
torch.set_num_threads(2)
case = build_case((32768, 20000, 32768, 5), 8, 4, 4, 128, 64, window=(4095, 4095), seed=5)
lw = lowerings.get("windowed_merge[eager]")
inp = materialize(case, "cpu")
for flag in (False, True, False, True):
    paged.GATHER_WINDOW_ONLY = flag
    x = materialize(case, "cpu")
    t = time.perf_counter(); r = lw.run(x); dt = time.perf_counter() - t
    print("window gather" if flag else "full gather  ", f"{dt:.2f} s")
