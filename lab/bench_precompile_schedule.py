"""How `parity.exec.precompile` spreads the compiles over a run's processes, simulated on the CPU (no GPU, no Triton
compile): each variant's compile is a sleep of `--compile-s` under the real `SharedCompileCache` lock, an oracle
unit first builds its case (the builder variant of its dtypes, a lock of its own), as `materialize` does. The 16
processes start together at the places run 79's children started (their lowering names). Two schedules:

- `wait`: one pass that leaves held variants for later, then a pass that waits for each (H200 run 79: every
  precompile took 15.4-16.2 s, one process compiled 13 entries in a row while the others waited);
- `poll`: passes that skip held variants until none is left (`parity.exec.precompile.run_pending`; H200 run 84: 9.0-10.0 s,
  every process loading every variant another compiled);
- `markers`: `precompile` since session 24: variants another process marked are skipped (not loaded); the
  process goes over what is left until every variant is marked (`run_pending(done=, mark=)`);
- `markers+leave`: the same, but those still held once nothing else is left are left to their holders
  (`leave_held=True`): measured here, not what `precompile` does (an oracle variant is held whenever the builder
  variant its case needs is, so half the processes left at once and the others compiled everything).

A variant another process compiled costs `--load-s` to load (a sleep; 0 by default: the schedule alone). Prints
each schedule's makespan (the slowest process), how many variants each process compiled, and for `markers` how
many were left to their holders. `python3 lab/bench_precompile_schedule.py [--procs 16] [--compile-s 0.3]
[--load-s 0]`"""

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


def _child(schedule: str, start: str, compile_s: float, load_s: float, marks: str, barrier, out) -> None:
    leave_held = schedule == "markers+leave"
    import zlib

    from parity.exec import precompile as pc
    from parity.exec import shared_compile_cache as scc
    from parity.front.config import CheckConfig  # noqa: F401  (the same imports as a check child)
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
        else:
            time.sleep(load_s)  # loaded: compiled by another process

    def run_unit(kind, case):
        cache_step(f"build-{case.dtype}-{case.kv_dtype}-{case.values if kind == 'build' else 'plain'}")
        if kind == "oracle":
            cache_step(f"oracle-{zlib.crc32(case.to_json(None).encode())}")

    i = zlib.crc32(start.encode()) % len(units)
    order = units[i:] + units[:i]
    barrier.wait()
    t0 = time.monotonic()
    left = 0
    if schedule == "poll":
        errors = pc.run_pending(order, run_unit, clock=time.monotonic)
    elif schedule.startswith("markers"):
        def path(kind, case):
            return Path(marks) / f"{kind}-{zlib.crc32(case.to_json(None).encode())}"

        errors = pc.run_pending(order, run_unit, clock=time.monotonic, done=lambda k, c: path(k, c).exists(),
                                mark=lambda k, c: path(k, c).touch(), leave_held=leave_held)
        left = sum(1 for k, c in order if not path(k, c).exists())
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
    out.put((start, len(compiled), time.monotonic() - t0, len(errors), left))


def run(schedule: str, procs: int, compile_s: float, load_s: float) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["TRITON_CACHE_DIR"] = tmp
        marks = Path(tmp) / "markers"
        marks.mkdir()
        ctx = mp.get_context("fork")
        barrier, out = ctx.Barrier(procs), ctx.Queue()
        ps = [ctx.Process(target=_child, args=(schedule, STARTS[j % len(STARTS)], compile_s, load_s, str(marks),
                                               barrier, out))
              for j in range(procs)]
        for p in ps:
            p.start()
        got = [out.get(timeout=600) for _ in ps]
        for p in ps:
            p.join()
    counts = sorted((n for _, n, *_ in got), reverse=True)
    left = f"; left to their holders at the end: {max(g[4] for g in got)} at most" if schedule.startswith("markers") else ""
    print(f"{schedule}: {procs} processes, makespan {max(g[2] for g in got):.2f} s, fastest "
          f"{min(g[2] for g in got):.2f} s; variants compiled per process {counts} "
          f"({sum(counts)} in all, {compile_s} s each, a load {load_s} s; errors {sum(g[3] for g in got)}){left}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--procs", type=int, default=16)
    ap.add_argument("--compile-s", type=float, default=0.3)
    ap.add_argument("--load-s", type=float, default=0.0)
    a = ap.parse_args()
    for schedule in ("wait", "poll", "markers", "markers+leave"):
        run(schedule, a.procs, a.compile_s, a.load_s)


if __name__ == "__main__":
    main()
