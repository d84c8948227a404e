"""The torch paged attention's two gather shortcuts (`lowerings.paged`), each against what it replaced (CPU).

    PYTHONPATH=. python lab/bench_paged_gather.py

B=4, L up to 32,768, K=8, 16/4 heads, D=128, twice each way, the seconds of `lowering.run`:
1. `windowed_merge[eager]` (part A: one-query rows under a (4095, 4095) window), with one gather per row:
   all of a row's keys against only the keys its window shows (`GATHER_WINDOW_ONLY`);
2. `decode_rows` (no window) and `windowed_merge[eager]`, with the window gather: one gather per row against
   one per request (`GROUP_DECODE_ROWS`), and the largest difference between the two ways' outputs and LSEs.
"""
import time

import torch

import lowerings
from lowerings import paged
from oracle.inputs import materialize
from tests.oracle.oracle_cases import build_case

torch.set_num_threads(2)
LENS = (32768, 20000, 32768, 5)
WINDOWED = build_case(LENS, 8, 4, 4, 128, 64, window=(4095, 4095), seed=5)
FULL = build_case(LENS, 8, 4, 4, 128, 64, seed=5)


def timed(name, case, flag, ways):
    """`lowering.run` of `case` twice each way, `flag` of `lowerings.paged` off then on; the last results."""
    lw = lowerings.get(name)
    results = {}
    for on in (False, True, False, True):
        setattr(paged, flag, on)
        x = materialize(case, "cpu")
        t = time.perf_counter()
        results[on] = lw.run(x)
        print(f"{name:22s} {ways[on]:28s} {time.perf_counter() - t:.2f} s")
    setattr(paged, flag, True)
    return results


paged.GROUP_DECODE_ROWS = False  # 1: as measured before one-gather-per-request existed
timed("windowed_merge[eager]", WINDOWED, "GATHER_WINDOW_ONLY", {False: "full gather", True: "window gather"})
paged.GROUP_DECODE_ROWS = True
for name, case in (("decode_rows", FULL), ("windowed_merge[eager]", WINDOWED)):
    r = timed(name, case, "GROUP_DECODE_ROWS", {False: "one gather per row", True: "one gather per request"})
    a, b = r[True], r[False]
    fin = torch.isfinite(b.lse)
    print(f"{name:22s} max |out difference| {float((a.out.float() - b.out.float()).abs().max()):.3g}, "
          f"max |LSE difference| {float((a.lse[fin] - b.lse[fin]).abs().max()):.3g}")
