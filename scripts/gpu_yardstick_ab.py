"""The yardstick's SDPA calls before and after the fp32 form, on the GPU: the same bits? how much faster?

    python scripts/gpu_yardstick_ab.py [--cases N] [--min-keys L] [--device cuda]

Draws `gpu`-profile cases for `sdpa` with the device's limits (derandomized: the same cases every run), keeps
those with a context of at least L keys (default 4097: production scale), builds each on the device and runs
the yardstick both ways: `previous_sdpa_batch` (tests/lowerings/test_yardstick_calls.py, the form that passed
working-dtype tensors to SDPA) and today's `sdpa_batch`. For each form: its wall time per case, synchronized
(the median of 3 runs after one unmeasured run), and whether the output and the LSE (`Sdpa.run`) are equal bit for bit.
Prints one line per case and a summary.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def _previous():
    spec = importlib.util.spec_from_file_location("yardstick_calls", os.path.join(ROOT, "tests", "lowerings",
                                                                                   "test_yardstick_calls.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.previous_sdpa_batch


def _draw(n: int, min_keys: int, device: str) -> list:
    from hypothesis import given

    from lowerings.torch_emulation import Sdpa
    from strategies import cases, profile_settings
    from strategies._plan import limits_for

    lim = limits_for(Sdpa(), device, profile="gpu")
    got: list = []

    @profile_settings("gpu", max_examples=50 * n)
    @given(case=cases(Sdpa(), limits=lim))
    def draw(case):
        if len(got) < n and max(case.context_lens, default=0) >= min_keys and case not in got:
            got.append(case)

    from strategies._determinism import seed_only_draws

    with seed_only_draws():  # as `check` draws: the same cases whatever modules are loaded
        draw()
    return got


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=30)
    ap.add_argument("--min-keys", type=int, default=4097)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args(argv)
    import torch

    from lowerings import torch_emulation
    from lowerings.torch_emulation import Sdpa, sdpa_batches
    from oracle.inputs import materialize

    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    now_batch, before_batch = torch_emulation.sdpa_batch, _previous()

    def timed(form, fn):
        torch_emulation.sdpa_batch = form
        try:
            fn()
            sync()
            ts = []
            for _ in range(3):
                t0 = time.perf_counter()
                out = fn()
                sync()
                ts.append(time.perf_counter() - t0)
            return out, statistics.median(ts)
        finally:
            torch_emulation.sdpa_batch = now_batch

    t0 = time.perf_counter()
    drawn = _draw(args.cases, args.min_keys, args.device)
    print(f"drew {len(drawn)} cases of >= {args.min_keys} keys in {time.perf_counter() - t0:.1f} s")
    rows, equal_out, equal_lse = [], 0, 0
    for case in drawn:
        inputs = materialize(case, args.device)
        lw = Sdpa()
        o_new, t_new = timed(now_batch, lambda: lw.run_output(inputs))
        o_old, t_old = timed(before_batch, lambda: lw.run_output(inputs))
        same_out = bool(torch.equal(o_new, o_old))
        r_new, _ = timed(now_batch, lambda: lw.run(inputs))
        r_old, _ = timed(before_batch, lambda: lw.run(inputs))
        same_lse = bool(torch.equal(r_new.lse, r_old.lse)) and bool(torch.equal(r_new.out, o_new))
        equal_out += same_out
        equal_lse += same_lse
        rows.append((t_old, t_new))
        print(f"{case.short()[:90]:<90} batches {len(sdpa_batches(case)):3d}  before {1000 * t_old:7.1f} ms  "
              f"after {1000 * t_new:7.1f} ms  output {'same bits' if same_out else 'DIFFERS'}  "
              f"LSE {'same bits' if same_lse else 'DIFFERS'}")
        del inputs, o_new, o_old, r_new, r_old
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()
    if rows:
        before = sum(r[0] for r in rows) / len(rows)
        after = sum(r[1] for r in rows) / len(rows)
        print(f"== {len(rows)} cases on {args.device}: output the same bits in {equal_out}, LSE in {equal_lse}; "
              f"yardstick {1000 * before:.1f} -> {1000 * after:.1f} ms per case (mean; medians "
              f"{1000 * statistics.median(r[0] for r in rows):.1f} -> {1000 * statistics.median(r[1] for r in rows):.1f})")
    return 0 if equal_out == equal_lse == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
