"""What reading one case's kernel names costs: `parity.engine.hardening.KernelNames` (torch.profiler started and stopped
around the call) around a short CUDA call, against the same call unprofiled; one process alone, then P side by side.

    python lab/gpu_profiler_cost.py [--procs 1 15] [--iters 40] [--launches 40] [--mps] [--dry]

Each of P child processes makes its CUDA context, pays the profiler's first start (CUPTI, seconds), waits for
the others (a file barrier, so that the timed part runs side by side), then times `--iters` calls of
`--launches` small elementwise kernels each, unprofiled and profiled in turn (synchronized at both ends, as
`run_case` does). Prints per P the medians over processes of: the first start, a call unprofiled, a call
profiled, and their difference (the profiler's cost per profiled case). `--mps`: the children run under a
private CUDA MPS daemon (`parity.exec.mps.mps_session`), as `check --jobs N --mps` runs them. `--dry`: the CPU, no
profiler (checks the orchestration only).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def child(args: argparse.Namespace) -> None:
    import torch

    from parity.engine.hardening import KernelNames

    dev = "cpu" if args.dry else "cuda"
    sync = (lambda: None) if args.dry else torch.cuda.synchronize
    x = torch.randn(1 << 16, device=dev)

    def call() -> None:
        y = x
        for _ in range(args.launches):
            y = y * 1.0001
        sync()

    def profiled() -> int:
        if args.dry:
            call()
            return 0
        kn = KernelNames()
        kn.start()
        try:
            call()
        finally:
            kn.stop()
        return len(kn.seen or [])

    call()
    t0 = time.perf_counter()
    names = profiled()
    first = time.perf_counter() - t0
    open(os.path.join(args.barrier, f"ready-{os.getpid()}"), "w").close()
    while len([f for f in os.listdir(args.barrier) if f.startswith("ready-")]) < args.procs_now:
        time.sleep(0.01)
    plain, prof = [], []
    for _ in range(args.iters):
        sync()
        t = time.perf_counter()
        call()
        plain.append(time.perf_counter() - t)
        t = time.perf_counter()
        names = profiled()
        prof.append(time.perf_counter() - t)
    print(json.dumps(dict(first=first, plain=statistics.median(plain), profiled=statistics.median(prof),
                          profiled_max=max(prof), names=names)), flush=True)


def run(p: int, args: argparse.Namespace, env: dict) -> list[dict]:
    from child_json import json_children

    with tempfile.TemporaryDirectory() as barrier:
        cmd = [sys.executable, os.path.abspath(__file__), "--child", "--barrier", barrier, "--procs-now", str(p),
               "--iters", str(args.iters), "--launches", str(args.launches), *(["--dry"] if args.dry else [])]
        return json_children(cmd, p, env)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--procs", type=int, nargs="+", default=[1, 15])
    ap.add_argument("--iters", type=int, default=40)
    ap.add_argument("--launches", type=int, default=40)
    ap.add_argument("--mps", action="store_true")
    ap.add_argument("--dry", action="store_true")
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--barrier", default="")
    ap.add_argument("--procs-now", type=int, default=1)
    args = ap.parse_args()
    if args.child:
        child(args)
        return 0
    import contextlib

    for p in args.procs:
        ctx = contextlib.nullcontext(None)
        if args.mps:
            from parity.exec.mps import mps_session

            ctx = mps_session(p, print)
        t0 = time.perf_counter()
        with ctx as state:
            env = dict(os.environ, **(getattr(state, "env", None) or {}))
            res = run(p, args, env)
        if not res:
            print(f"== {p} process(es): no result")
            continue
        med = {k: statistics.median(r[k] for r in res) for k in ("first", "plain", "profiled", "profiled_max")}
        print(f"== {p} process(es){' under MPS' if args.mps else ''}, {len(res)} reported, {args.iters} calls of "
              f"{args.launches} launches each ({time.perf_counter() - t0:.1f} s): first profiler start "
              f"{med['first']:.2f} s; a call {1000 * med['plain']:.2f} ms unprofiled, {1000 * med['profiled']:.2f} ms "
              f"profiled (max {1000 * med['profiled_max']:.1f}); the profiler's cost {1000 * (med['profiled'] - med['plain']):.2f} "
              f"ms per profiled call; {res[0]['names']} kernel names read (medians over processes)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
