"""The torch paged attention of one-query rows, one gather per row against one per request (`lowerings.paged`).

    PYTHONPATH=. python scripts/bench_decode_rows_gather.py

Two cases of the torch lowerings whose rows are one query each (B*K decode rows, K per request on the same
page-table row): `decode_rows` (no window, every row over its request's L+K keys) and `windowed_merge[eager]`
(part A: row i over the window ending at L+i), B=4, L up to 32,768, K=8, 16/4 heads, D=128, on the CPU, twice
each way; prints the seconds of `lowering.run` and the largest difference between the two ways' outputs/LSEs.
"""
import time

import torch

import lowerings
from lowerings import paged
from oracle.inputs import materialize
from tests.oracle.oracle_cases import build_case

torch.set_num_threads(2)
CASES = {"decode_rows": build_case((32768, 20000, 32768, 5), 8, 4, 4, 128, 64, seed=5),
         "windowed_merge[eager]": build_case((32768, 20000, 32768, 5), 8, 4, 4, 128, 64, window=(4095, 4095), seed=5)}
for name, case in CASES.items():
    lw = lowerings.get(name)
    results = {}
    for flag in (False, True, False, True):
        paged.GROUP_DECODE_ROWS = flag
        x = materialize(case, "cpu")
        t = time.perf_counter()
        r = lw.run(x)
        dt = time.perf_counter() - t
        results[flag] = r
        print(f"{name:22s} {'one gather per request' if flag else 'one gather per row   '} {dt:.2f} s")
    a, b = results[True], results[False]
    fin = torch.isfinite(b.lse)
    print(f"{name:22s} max |out difference| {float((a.out.float() - b.out.float()).abs().max()):.3g}, "
          f"max |LSE difference| {float((a.lse[fin] - b.lse[fin]).abs().max()):.3g}")
