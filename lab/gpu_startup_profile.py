"""What a `check --jobs` process pays once before and around its cases, part by part, for each lowering.

    python lab/gpu_startup_profile.py [--device cuda] [--side-by-side] [--mps] LOWERING [...]

In session 17's warm sweep of run 11's command at small shapes (docs/gpu/2026-12-03-h200-session17.md run 57), each
job finished 23.8-34.8 s after it started while its 500 cases took 9.9-22.3 s; the kernel-names phase held the
profiler's first start, 4.5-6 s (run 61). This splits the rest. Each lowering runs in a fresh child process (a cold
process, as a `--jobs` child is), which times in order:

1. the imports (`parity.front.session`, `lowerings`, `strategies`, hypothesis, torch);
2. the device's context (the first tensor on it, synchronized);
3. the case builder's warm-up (`oracle.inputs.warm_build`: format 3's device build);
4. `--warm-up`'s units for the lowering with its `gpu`-profile limits (`parity.exec.warmup.warm_up`): each unit's
   seconds (the lowering on a tiny case, loading its JIT modules), and their sum;
5. the profiler's first start and stop (`parity.engine.hardening.KernelNames`, CUDA only);

and prints one line. `--side-by-side` starts every lowering's child at once (15 of them: as `check --jobs 15`),
`--mps` under a private CUDA MPS daemon (`parity.exec.mps.mps_session`); else one after another. `--device cpu` checks the
script's plumbing on a machine without a GPU (no profiler there).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def child(name: str, device: str) -> dict:
    t = {}
    t0 = time.perf_counter()
    import hypothesis  # noqa: F401
    import torch

    import lowerings
    import parity.front.session  # noqa: F401
    import strategies  # noqa: F401
    t["imports"] = time.perf_counter() - t0

    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    t1 = time.perf_counter()
    torch.zeros(1, device=device)
    sync()
    t["context"] = time.perf_counter() - t1

    from oracle.inputs import warm_build

    t1 = time.perf_counter()
    warm_build(device)
    sync()
    t["case builder"] = time.perf_counter() - t1

    from parity.exec.warmup import warm_up
    from strategies._plan import limits_for

    lw = lowerings.get(name)
    t1 = time.perf_counter()
    rep = warm_up([lw], limits_for(lw, device, profile="gpu"), device, progress=None)
    t["modules"] = time.perf_counter() - t1
    units = [(u.variant.describe(), round(u.seconds or 0.0, 2), u.error) for u in rep.units]

    if device.startswith("cuda"):
        from parity.engine.hardening import KernelNames

        t1 = time.perf_counter()
        kn = KernelNames()
        kn.start()
        kn.stop()
        t["profiler's first start"] = time.perf_counter() - t1
    t["total"] = time.perf_counter() - t0
    return {"lowering": name, "seconds": t, "units": units}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("lowering", nargs="*")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--side-by-side", action="store_true")
    ap.add_argument("--mps", action="store_true")
    ap.add_argument("--child", default="")
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.device)), flush=True)
        return 0
    if not args.lowering:
        ap.error("name at least one lowering (e.g. 'context[flashinfer-fa2]')")
    import contextlib

    ctx = contextlib.nullcontext(None)
    if args.mps:
        from parity.exec.mps import mps_session

        ctx = mps_session(len(args.lowering), print)
    with ctx as state:
        env = dict(os.environ, **(getattr(state, "env", None) or {}))

        def start(name: str) -> subprocess.Popen:
            return subprocess.Popen([sys.executable, os.path.abspath(__file__), "--child", name, "--device", args.device],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)

        t0 = time.perf_counter()
        if args.side_by_side:
            kids = [(n, start(n)) for n in args.lowering]
        else:
            kids = []
            for n in args.lowering:
                k = start(n)
                k.wait()
                kids.append((n, k))
        for name, k in kids:
            so, se = k.communicate()
            lines = [ln for ln in so.splitlines() if ln.startswith("{")]
            if k.returncode or not lines:
                print(f"== {name}: the child failed (exit {k.returncode}): {(se.strip().splitlines() or ['-'])[-1]}")
                continue
            r = json.loads(lines[-1])
            parts = ", ".join(f"{k_} {v:.2f} s" for k_, v in r["seconds"].items())
            print(f"== {name}: {parts}", flush=True)
            for desc, secs, err in r["units"]:
                print(f"   warm-up unit {desc}: {secs:.2f} s{' ' + err if err else ''}")
        print(f"== {len(kids)} lowering(s) {'side by side' if args.side_by_side else 'one after another'}"
              f"{' under MPS' if args.mps else ''}: {time.perf_counter() - t0:.1f} s in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
