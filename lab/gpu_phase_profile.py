"""Where a case's time goes on the GPU itself: each phase synchronized at its end, then the kernels by device time.

    python lab/gpu_phase_profile.py [--cases N] [--kernel-cases M] [--seed S] [--min-keys L] LOWERING [...]

First the profiler's start-up (CUPTI, seconds, once per process), timed on its own so that the first
lowering's kernel-names phase does not carry it. Then for each lowering, alone on the GPU (run it when
nothing else uses the device):

1. N cases of `check --device cuda --profile gpu --seed S --no-hardening --no-isolate --warm-up`, with
   `torch.cuda.synchronize()` at the end of every phase of `parity.engine.case_run`: each phase's seconds then
   hold the device work it launched. Without it, asynchronous kernels are charged to whichever later
   call waits for them (a flashinfer `plan()` copying its page indices, the judge reading its scalars),
   which is how time lines read under `--jobs`. Prints the time line.
2. M more cases under `torch.profiler` (kernel names off: one profiler at a time): the device time of
   every CUDA kernel and copy, summed per name; prints the total per case and the 20 largest.

`--cprofile N` runs 1 under cProfile and prints its N largest functions by own time (the host's share of each
phase: Python, launches, the allocator's `cudaMalloc`s inside the ops that need them). `--keep-cache` makes
`torch.cuda.empty_cache()` a no-op for the run, which `parity.exec.memory.device_lease` otherwise calls after every case
past `LARGE_SHARE` of the device: then the next large case's tensors come from the allocator's cache instead of
fresh `cudaMalloc`s. Each run prints the allocator's counters (device allocations and frees, `empty_cache` calls).

`--hardening` keeps the hardening checks in run 1 (the `gpu` record's default; still in process). Each run of 1
also prints, per case, the device memory the case peaked at (`torch.cuda.max_memory_allocated` over `run_case`)
against `oracle.footprint.run_bytes` (the draw budget) and `oracle.footprint.lease_bytes` (what a large case leases
from the other processes on the GPU, `parity.exec.memory.device_lease`; `run_bytes` itself until session 16's run 55):
how much of a hardened run's waiting for memory the estimates' margin costs.
`--kernel-cases 0` skips run 2.

`--min-keys L` profiles only cases with a context of at least L keys: the lowering refuses shorter ones
(`supports`), so the strategy repairs or redraws them (on the CPU, 40 `ci`-profile draws of `decode_rows` with
L=200: 51 cases judged, none shorter, none unsupported). The production-scale cases alone, which the first
cases of the profile mostly are not.

The sum of 2's device time per case, against the cases per second that `check --jobs` reaches on one
GPU, says whether a sweep is bound by the device (their product near 1) or by the processes' host work.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


HARDENING = False  # --hardening: the synchronized run keeps every hardening check (still in process)


def _check(lowering: str, n: int, seed: int, report: str, *extra: str) -> dict:
    from parity.front import cli

    cli.main(["check", "--device", "cuda", "--profile", "gpu", "--seed", str(seed), "--max-examples", str(n),
              *([] if HARDENING else ["--no-hardening"]), "--no-isolate", "--quiet", "--warm-up",
              "--lowering", lowering, "--report", report, *extra])
    return json.load(open(os.path.join(report, "parity.json")))["lowerings"][lowering]


class LongOnly:
    """A lowering that supports only cases with a context of at least `min_keys` keys; otherwise the same."""

    def __init__(self, lowering, min_keys: int) -> None:
        self._lw, self._min = lowering, min_keys

    def __getattr__(self, name: str):
        return getattr(self._lw, name)

    def supports(self, case):
        if max(case.context_lens, default=0) < self._min:
            return f"context shorter than {self._min} keys (gpu_phase_profile.py --min-keys)"
        return self._lw.supports(case)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=60)
    ap.add_argument("--kernel-cases", type=int, default=30)
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--min-keys", type=int, default=0, help="judge only cases with a context this long or longer")
    ap.add_argument("--cprofile", type=int, default=0, metavar="N",
                    help="run the synchronized cases under cProfile and print its N largest functions by own time")
    ap.add_argument("--keep-cache", action="store_true",
                    help="torch.cuda.empty_cache() a no-op: large cases reuse the allocator's cached blocks")
    ap.add_argument("--hardening", action="store_true", help="keep the hardening checks in the synchronized run")
    ap.add_argument("lowering", nargs="+")
    args = ap.parse_args(argv)
    global HARDENING
    HARDENING = args.hardening
    if args.min_keys:
        import lowerings
        from lowerings import registry

        for name in args.lowering:
            registry.register(LongOnly(lowerings.get(name), args.min_keys), replace=True)
    import torch
    from torch.profiler import ProfilerActivity, profile

    from parity.engine import case_run

    if not torch.cuda.is_available():
        print("gpu_phase_profile: no CUDA device visible to torch", file=sys.stderr)
        return 2
    # The profiler's first use in a process starts CUPTI (seconds, once per process): paid here, before
    # the first lowering, so that its kernel-names phase holds what every sampled case costs.
    t0 = time.perf_counter()
    with profile(activities=[ProfilerActivity.CUDA]):
        torch.cuda.synchronize()
    print(f"== the profiler's start-up, once per process: {time.perf_counter() - t0:.2f} s (not charged to any phase)")
    tmp = tempfile.mkdtemp(prefix="phase-profile-")
    empties = [0, 0.0]
    real_empty = torch.cuda.empty_cache

    def counted_empty() -> None:
        t = time.perf_counter()
        if not args.keep_cache:
            real_empty()
        empties[0] += 1
        empties[1] += time.perf_counter() - t

    torch.cuda.empty_cache = counted_empty
    per_case: dict[int, dict[str, float]] = {}  # id(outcome) -> phase -> seconds, in the order the cases ran

    def record_phase(outcome, phase: str, seconds: float) -> None:
        row = per_case.setdefault(id(outcome), {})
        row[phase] = row.get(phase, 0.0) + seconds

    case_run.phase_observer = record_phase
    peaks: list[tuple[int, int, str, int]] = []  # (peak bytes over the case, run_bytes, case, lease_bytes)

    def measured(judged, case, opts):
        from oracle import footprint

        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        try:
            return judged()
        finally:
            torch.cuda.synchronize()
            profiled = bool(opts.profile_every) and case.seed % opts.profile_every == 0
            peaks.append((torch.cuda.max_memory_allocated() - base,
                          footprint.run_bytes(case, hardening=opts.check_determinism, profiled=profiled), case.short(),
                          footprint.lease_bytes(case, hardening=opts.check_determinism)))

    case_run.around_case = measured
    for name in args.lowering:
        case_run.phase_barrier = torch.cuda.synchronize
        empties[:] = [0, 0.0]
        per_case.clear()
        peaks.clear()
        stats0 = torch.cuda.memory_stats()
        prof_host = None
        if args.cprofile:
            import cProfile

            prof_host = cProfile.Profile()
            prof_host.enable()
        try:
            entry = _check(name, args.cases, args.seed, os.path.join(tmp, "synced"))
        finally:
            if prof_host is not None:
                prof_host.disable()
            case_run.phase_barrier = None
        stats1 = torch.cuda.memory_stats()
        grew = {k: stats1.get(k, 0) - stats0.get(k, 0) for k in ("num_device_alloc", "num_device_free", "num_alloc_retries")}
        print(f"== {name}: allocator: {grew['num_device_alloc']} cudaMalloc, {grew['num_device_free']} cudaFree, "
              f"{grew['num_alloc_retries']} retries; empty_cache called {empties[0]} times, {empties[1]:.2f} s"
              f"{' (made a no-op by --keep-cache)' if args.keep_cache else ''}")
        if peaks:
            total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
            from parity.exec.memory import LARGE_SHARE

            leased = [p for p in peaks if p[3] > LARGE_SHARE * total]
            ratios = sorted(p[0] / p[1] for p in peaks if p[1])  # against run_bytes
            print(f"== {name}: device memory per case, peak / footprint.run_bytes: median {ratios[len(ratios) // 2]:.2f}, "
                  f"max {ratios[-1]:.2f} over {len(ratios)} cases; {len(leased)} past LARGE_SHARE (leased)")
            for peak, est, short, lease in sorted(peaks, key=lambda p: -p[1])[:8]:
                print(f"   peak {peak / 2**30:7.2f} GiB of {est / 2**30:7.2f} GiB estimated ({peak / est:.2f}), "
                      f"{lease / 2**30:7.2f} GiB leased ({peak / lease:.2f})  {short[:90]}")
        rows = list(per_case.values())
        for ph in sorted({k for r in rows for k in r}, key=lambda k: -sum(r.get(k, 0.0) for r in rows)):
            xs = sorted(r.get(ph, 0.0) for r in rows)
            print(f"   {ph:<13} per case: median {1000 * xs[len(xs) // 2]:7.1f} ms, max {1000 * xs[-1]:7.1f} ms, "
                  f"first case {1000 * rows[0].get(ph, 0.0):7.1f} ms, sum {sum(xs):6.2f} s over {len(xs)} cases")
        if prof_host is not None:
            import io
            import pstats

            buf = io.StringIO()
            pstats.Stats(prof_host, stream=buf).sort_stats("tottime").print_stats(args.cprofile)
            pstats.Stats(prof_host, stream=buf).sort_stats("cumulative").print_stats(r"(parity|lowerings|oracle)/", 40)
            print("\n".join(line for line in buf.getvalue().splitlines() if line.strip())[:16000])
        phases = entry.get("phase_seconds") or {}
        cases = entry.get("cases", 0)
        total = sum(phases.values()) or 1.0
        line = ", ".join(f"{k} {1000 * v / max(1, cases):.1f} ms ({100 * v / total:.0f}%)"
                         for k, v in sorted(phases.items(), key=lambda kv: -kv[1]))
        print(f"== {name}: {cases} cases, phases synchronized: {1000 * total / max(1, cases):.1f} ms per case; {line}")
        if not args.kernel_cases:
            continue
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            entry = _check(name, args.kernel_cases, args.seed + 1, os.path.join(tmp, "kernels"), "--kernel-names-every", "0")
        cases = max(1, entry.get("cases", 0))
        per: dict[str, float] = {}
        for evt in prof.key_averages():
            us = getattr(evt, "device_time_total", None)
            if us is None:
                us = getattr(evt, "cuda_time_total", 0.0)
            if us:
                per[evt.key] = per.get(evt.key, 0.0) + us
        dev_total = sum(per.values())
        print(f"   device time: {dev_total / 1000 / cases:.2f} ms per case over {cases} cases (kernels and copies)")
        for key, us in sorted(per.items(), key=lambda kv: -kv[1])[:20]:
            print(f"   {100 * us / dev_total:5.1f}%  {us / 1000 / cases:8.3f} ms/case  {key[:110]}")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
