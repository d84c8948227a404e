"""Where the profiler's first start goes (`parity.engine.hardening.KernelNames`: 4.5-6 s once per process in
session 17's run 61), and whether it can run beside other work.

    python lab/gpu_profiler_first_start.py [--procs 1 15] [--mps] [--dry]

Each child makes its CUDA context, then, by `--mode`:
- `plain`: times the first profiled call step by step, wall and CPU seconds (`time.process_time`, every
  thread of the process): importing `torch.profiler`, entering `profile(activities=[CUDA])`, the call, leaving
  it, reading the names (`cuda_kernel_names`); then a second profiled call the same way.
- `modules`: `plain` after 40 distinct kernels have been loaded (does the first start grow with the
  modules loaded before it? CUPTI instruments loaded modules).
- `nocorr`, `kernel-only`: `plain` with `_ExperimentalConfig(disable_external_correlation=True)`, or with
  kineto's own config asking for kernels only (`custom_profiler_config="ACTIVITY_TYPES=kernel"`).
- `kernelnames`: `parity.engine.hardening.KernelNames` itself, names read in its stop.
- `cprofile`: the first entering under cProfile: the 14 functions with the most cumulative time (is it
  Python, an import, or one call into torch's C++ profiler?).
- `cupti`: CUPTI alone first, through ctypes (load libcupti, enable and disable the concurrent-kernel
  activity), then `plain`: is the first start CUPTI's own cost or kineto's?
- `thread` (not in the default list: in run 62 the thread modes did not finish within the 70 s limit): the first start and stop in a background thread while the main thread counts pure-Python loop
  iterations: the main thread's rate against its rate alone is the share of the interpreter the start left
  free (1.0: it holds no GIL).
- `thread-cuda`: the same, the main thread launching small kernels and synchronizing (like `--warm-up`).
Each child prints one JSON line; the parent prints a table (medians over children). `--env K=V` sets a
variable in the children (e.g. TEARDOWN_CUPTI=0). `--dry`: the CPU, no profiler (the plumbing only).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def _clock() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def _since(t: tuple[float, float]) -> tuple[float, float]:
    w, c = _clock()
    return round(w - t[0], 4), round(c - t[1], 4)


def _profile_kwargs(mode: str) -> dict:
    """The `torch.profiler.profile` keyword arguments of a config variant (`nocorr`, `kernel-only`)."""
    if mode not in ("nocorr", "kernel-only"):
        return {}
    from torch._C._profiler import _ExperimentalConfig

    if mode == "nocorr":
        return {"experimental_config": _ExperimentalConfig(disable_external_correlation=True)}
    return {"experimental_config": _ExperimentalConfig(custom_profiler_config="ACTIVITY_TYPES=kernel")}


def raw_cupti() -> dict:
    """CUPTI itself, through ctypes (libcupti of the nvidia-cuda-cupti package torch depends on): the seconds
    (wall, cpu) of loading it, of `cuptiActivityEnable` for each activity kind kineto enables for CUDA (wall,
    cpu, return code), and of disabling them all again."""
    import ctypes
    import glob

    out = {}
    t = _clock()
    paths = []
    for base in sys.path:
        paths += glob.glob(os.path.join(base, "nvidia", "cu*", "lib", "libcupti.so*"))
        paths += glob.glob(os.path.join(base, "nvidia", "cuda_cupti", "lib", "libcupti.so*"))
    if not paths:
        return {"error": "no libcupti found"}
    lib = ctypes.CDLL(sorted(paths)[-1])
    out["load"] = _since(t)
    kinds = {"concurrent_kernel": 10, "memcpy": 1, "memset": 2, "driver": 4, "runtime": 5, "overhead": 17,
             "cuda_event": 36, "synchronization": 38, "external_correlation": 39}  # CUpti_ActivityKind
    for name, kind in kinds.items():  # the kinds kineto enables for CUDA activities, one at a time
        t = _clock()
        rc = lib.cuptiActivityEnable(kind)
        out[f"enable_{name}"] = _since(t) + (rc,)
    t = _clock()
    out["disable_rc"] = [lib.cuptiActivityDisable(kind) for kind in kinds.values()]
    out["disable"] = _since(t)
    out["lib"] = os.path.basename(sorted(paths)[-1])
    return out


def profiled_call(dry: bool, call, mode: str = "plain") -> dict:
    """One profiled call, step by step: {step: (wall s, cpu s)} and the names read."""
    steps = {}
    t = _clock()
    if dry:
        call()
        steps["import"] = steps["enter"] = steps["exit"] = steps["names"] = (0.0, 0.0)
        steps["call"] = _since(t)
        return {"steps": steps, "names": 0}
    from torch.profiler import ProfilerActivity, profile

    from parity.engine.hardening import KernelNames, cuda_kernel_names
    steps["import"] = _since(t)
    if mode == "kernelnames":  # the check's own path: start, the call, stop (names read in stop)
        kn = KernelNames()
        begin, end, count = kn.start, kn.stop, (lambda: len(kn.seen or []))
    else:
        prof = profile(activities=[ProfilerActivity.CUDA], **_profile_kwargs(mode))
        begin, end = prof.__enter__, (lambda: prof.__exit__(None, None, None))
        count = lambda: len(cuda_kernel_names(prof))  # noqa: E731
    for step, fn in (("enter", begin), ("call", call), ("exit", end)):
        t = _clock()
        fn()
        steps[step] = _since(t)
    t = _clock()
    names = count()
    steps["names"] = _since(t)
    return {"steps": steps, "names": names}


def child(args: argparse.Namespace) -> None:
    import torch

    dev = "cpu" if args.dry else "cuda"
    sync = (lambda: None) if args.dry else torch.cuda.synchronize
    t = _clock()
    x = torch.randn(1 << 16, device=dev)
    sync()
    out: dict = {"mode": args.mode, "context": _since(t)}

    def call() -> None:
        y = x
        for _ in range(20):
            y = y * 1.0001
        sync()

    call()
    if args.mode == "modules":
        t = _clock()
        ops = [torch.sin, torch.cos, torch.exp, torch.log1p, torch.tanh, torch.sigmoid, torch.sqrt, torch.abs,
               torch.neg, torch.floor, torch.ceil, torch.round, torch.erf, torch.expm1, torch.rsqrt, torch.sign]
        for op in ops:
            for dt in (torch.float32, torch.bfloat16):
                op(x.to(dt).abs() + 1)
        for red in (torch.sum, torch.amax, torch.amin, torch.mean, torch.prod, torch.cumsum):
            red(x, 0) if red is torch.cumsum else red(x)
        torch.sort(x)
        torch.topk(x, 5)
        x.view(256, 256) @ x.view(256, 256)
        sync()
        out["load_modules"] = _since(t)
    if args.mode == "cprofile":
        import cProfile
        import io
        import pstats

        first = None
        if not args.dry:
            from torch.profiler import ProfilerActivity, profile

            first = profile(activities=[ProfilerActivity.CUDA])
        pr = cProfile.Profile()
        t = _clock()
        pr.enable()
        if first is not None:
            first.__enter__()
        pr.disable()
        out["enter"] = _since(t)
        if first is not None:
            first.__exit__(None, None, None)
        text = io.StringIO()
        pstats.Stats(pr, stream=text).sort_stats("cumulative").print_stats(14)
        out["top"] = [ln.strip() for ln in text.getvalue().splitlines() if ln.strip()[:1].isdigit()][:14]
    elif args.mode == "cupti":
        out["cupti"] = {} if args.dry else raw_cupti()
        out["first"] = profiled_call(args.dry, call)
        out["second"] = profiled_call(args.dry, call)
    elif args.mode in ("plain", "modules", "nocorr", "kernel-only", "kernelnames"):
        out["first"] = profiled_call(args.dry, call, args.mode)
        out["second"] = profiled_call(args.dry, call, args.mode)
    else:
        def spin(seconds: float) -> int:
            n, end = 0, time.perf_counter() + seconds
            while time.perf_counter() < end:
                n += 1
                if args.mode == "thread-cuda" and n % 2000 == 0:
                    call()
            return n

        alone = spin(1.0)
        box: dict = {}

        def first() -> None:
            t0 = time.perf_counter()
            box["first"] = profiled_call(args.dry, lambda: None)
            box["wall"] = time.perf_counter() - t0

        th = threading.Thread(target=first)
        t0 = time.perf_counter()
        th.start()
        n = 0
        while th.is_alive():
            n += spin(0.05)
        wall = time.perf_counter() - t0
        out.update(first=box.get("first"), thread_wall=round(box.get("wall", 0.0), 3),
                   main_rate_share=round((n / wall) / alone, 3) if wall else None)
        out["second"] = profiled_call(args.dry, call)
    print(json.dumps(out), flush=True)


def run(p: int, args: argparse.Namespace, env: dict, mode: str) -> list[dict]:
    from child_json import json_children

    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--mode", mode, *(["--dry"] if args.dry else [])]
    return json_children(cmd, p, env)


def _med(rows: list[dict], *path: str) -> str:
    vals = []
    for r in rows:
        v = r
        for k in path:
            v = v.get(k) if isinstance(v, dict) else None
        if v is not None:
            vals.append(v)
    if not vals:
        return "-"
    if isinstance(vals[0], list):
        return f"{statistics.median(v[0] for v in vals):.2f}/{statistics.median(v[1] for v in vals):.2f}"
    return f"{statistics.median(vals):.3g}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--procs", type=int, nargs="+", default=[1, 15])
    ap.add_argument("--modes", nargs="+", default=["plain", "modules", "nocorr", "kernel-only", "cupti"])
    ap.add_argument("--mode", default="plain")
    ap.add_argument("--env", action="append", default=[])
    ap.add_argument("--mps", action="store_true")
    ap.add_argument("--dry", action="store_true")
    ap.add_argument("--child", action="store_true")
    args = ap.parse_args()
    if args.child:
        child(args)
        return 0
    import contextlib

    extra = dict(kv.split("=", 1) for kv in args.env)
    print("steps: wall/cpu seconds, medians over the children; cpu counts every thread of the process")
    for p in args.procs:
        ctx = contextlib.nullcontext(None)
        if args.mps and p > 1:
            from parity.exec.mps import mps_session

            ctx = mps_session(p, print)
        with ctx as state:
            env = dict(os.environ, **(getattr(state, "env", None) or {}), **extra)
            for mode in args.modes if p == 1 else args.modes[:1]:
                t0 = time.perf_counter()
                res = run(p, args, env, mode)
                head = f"== {p} proc(s) {mode}{' MPS' if args.mps and p > 1 else ''} {extra or ''} ({time.perf_counter() - t0:.1f} s, {len(res)} ok):"
                if not res:
                    print(head, "no result")
                    continue
                cols = [f"context {_med(res, 'context')}"]
                if mode == "modules":
                    cols.append(f"load 40 kernels {_med(res, 'load_modules')}")
                for which in ("first", "second"):
                    cols.append(which + " " + " ".join(
                        f"{s} {_med(res, which, 'steps', s)}" for s in ("import", "enter", "call", "exit", "names")))
                if mode == "cupti":
                    cols.append("raw CUPTI " + json.dumps(res[0].get("cupti")))
                if mode == "cprofile":
                    print(head, f"enter {_med(res, 'enter')}; by cumulative time (ncalls tottime percall cumtime "
                          f"percall function):", *res[0].get("top", []), sep="\n    ", flush=True)
                    continue
                cols.append(f"names read {_med(res, 'first', 'names')}")
                if mode.startswith("thread"):
                    cols.append(f"thread wall {_med(res, 'thread_wall')}, main thread's rate share {_med(res, 'main_rate_share')}")
                print(head, "; ".join(cols), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
