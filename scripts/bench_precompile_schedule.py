"""How `parity.precompile` spreads the compiles over a run's processes, simulated on the CPU (no GPU, no Triton
compile): each variant's compile is a sleep of `--compile-s` under the real `SharedCompileCache` lock, an oracle
unit first builds its case (the builder variant of its dtypes, a lock of its own), as `materialize` does. The 16
processes start together at the places run 79's children started (their lowering names). Two schedules:

- `wait`: one pass that leaves held variants for later, then a pass that waits for each (H200 run 79: every
  precompile took 15.4-16.2 s, one process compiled 13 entries in a row while the others waited);
- `poll`: passes that skip held variants until none is left (`parity.precompile.run_pending`, this tree).

Prints each schedule's makespan (the slowest process) and how many variants each process compiled.
`python3 scripts/bench_precompile_schedule.py [--procs 16] [--compile-s 0.3]`"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

STARTS = ["context None", "context[flashinfer-fa2] None", "context[flashinfer-fa3] None", "decode_rows None",
          "decode_rows[flashinfer-tc] None", "decode_rows[flashinfer] None", "hybrid_paged None",
          "hybrid_paged[splits=4] None", "sdpa None", "trtllm_gen[context] None", "trtllm_gen[decode] None",
          "windowed_merge[compiled] None", "windowed_merge[eager] None", "windowed_merge[flashinfer-compiled] None",
          "windowed_merge[flashinfer-eager] None", "windowed_merge[flashinfer-merge_state] None"]


def _child(schedule: str, start: str, compile_s: float, barrier, out) -> None:
    import zlib

    from parity import precompile as pc
    from parity import shared_compile_cache as scc
    from parity.config import CheckConfig  # noqa: F401  (the same imports as a check child)
    from strategies import limits_for
    import lowerings

    lim = limits_for(lowerings.get("context"), "cuda", profile="gpu",
                     overrides=dict(max_production_context=0, max_production_batch=2, models=()))
    units = pc.variant_cases(lim)
    compiled = []

    def cache_step(key: str) -> None:
        m = scc.SharedCompileCache(key)
        if m.get_group("k.json") is None:
            time.sleep(compile_s)
            m.put_group("k.json", {"k.json": m.put("{}", "k.json")})
            compiled.append(key)

    def run_unit(kind, case):
        cache_step(f"build-{case.dtype}-{case.kv_dtype}-{case.values if kind == 'build' else 'plain'}")
        if kind == "oracle":
            cache_step(f"oracle-{zlib.crc32(case.to_json(None).encode())}")

    i = zlib.crc32(start.encode()) % len(units)
    order = units[i:] + units[:i]
    barrier.wait()
    t0 = time.monotonic()
    if schedule == "poll":
        errors = pc.run_pending(order, run_unit, clock=time.monotonic)
    else:  # run 79's tree: one pass leaving held variants for later, one pass waiting for each
        errors, later = [], []
        for kind, case in order:
            try:
                with scc.not_waiting():
                    run_unit(kind, case)
            except scc.Busy:
                later.append((kind, case))
        for kind, case in later:
            run_unit(kind, case)
    out.put((start, len(compiled), time.monotonic() - t0, len(errors)))


def run(schedule: str, procs: int, compile_s: float) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["TRITON_CACHE_DIR"] = tmp
        ctx = mp.get_context("fork")
        barrier, out = ctx.Barrier(procs), ctx.Queue()
        ps = [ctx.Process(target=_child, args=(schedule, STARTS[j % len(STARTS)], compile_s, barrier, out))
              for j in range(procs)]
        for p in ps:
            p.start()
        got = [out.get(timeout=600) for _ in ps]
        for p in ps:
            p.join()
    counts = sorted((n for _, n, _, _ in got), reverse=True)
    print(f"{schedule}: {procs} processes, makespan {max(t for _, _, t, _ in got):.2f} s, fastest "
          f"{min(t for _, _, t, _ in got):.2f} s; variants compiled per process {counts} "
          f"({sum(counts)} in all, {compile_s} s each; errors {sum(e for *_, e in got)})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--procs", type=int, default=16)
    ap.add_argument("--compile-s", type=float, default=0.3)
    a = ap.parse_args()
    for schedule in ("wait", "poll"):
        run(schedule, a.procs, a.compile_s)


if __name__ == "__main__":
    main()
