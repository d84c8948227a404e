"""What `check` would draw, per lowering, without running a case (no GPU needed).

    python scripts/draw_distribution.py [--device cuda] [--profile gpu] [--max-examples N] [--seed S]
                                        [--gpu-gib 139] [--limit FIELD=V ...] [LOWERING ...]

Runs `check_lowering` exactly as `dflash-parity check` does (the same strategy, boundary cases and
hypothesis test function, hence the same draws) with an executor that answers "pass" at once, and
prints each lowering's drawn histogram (`parity.engine.drawn`): the share of cases with a context past 4096
keys, of fp8 KV pools, of each head dim, pools past 2**31 elements, and how far it reached the extremes
(`drawn.extremes`). `--gpu-gib` stands in for the GPU's memory on a machine without one (the per-case
budget is a share of it).
"""

from __future__ import annotations

import argparse
import sys

import lowerings
from oracle.case import Case
from parity.engine import drawn
from oracle import footprint
from parity.engine.policy import load
from parity.engine.runner import CaseOutcome, RunOptions, check_lowering
from strategies import check_cases, limit_overrides, profile_settings


class Available:
    """A lowering as it would be on the device: available, everything else its own."""

    def __init__(self, lowering) -> None:
        self._lw = lowering

    def __getattr__(self, name: str):
        return getattr(self._lw, name)

    def available(self, device: str) -> tuple[bool, str]:
        return True, ""


class DrawOnly:
    """An executor that runs nothing: every supported case passes."""

    def run(self, lowering_name: str, case: Case) -> CaseOutcome:
        return CaseOutcome(lowering_name, case, "pass")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", choices=("cpu", "cuda"))
    ap.add_argument("--profile", default="gpu")
    ap.add_argument("--max-examples", type=int, default=None)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--gpu-gib", type=float, default=139.0, help="the GPU's memory where torch sees none")
    ap.add_argument("--limit", action="append", default=[])
    ap.add_argument("lowering", nargs="*")
    args = ap.parse_args(argv)
    real = footprint.device_case_bytes

    def budget(device: str, share: float = footprint.CUDA_SHARE) -> int:
        import torch
        if str(device).startswith("cuda") and not torch.cuda.is_available():
            return int(args.gpu_gib * footprint.GIB * share)
        return real(device, share)

    footprint.device_case_bytes = budget
    settings = profile_settings(args.profile, max_examples=args.max_examples, seed=args.seed)
    overrides = limit_overrides(args.limit)
    for name in args.lowering or lowerings.names():
        lw = lowerings.get(name)
        plan = check_cases(lw, args.device, profile=args.profile, overrides=overrides)
        rep = check_lowering(Available(lw), load(), strategy=plan.strategy, boundaries=plan.boundaries, settings=settings,
                             opts=RunOptions(device=args.device), executor=DrawOnly(), seed=args.seed)
        d = rep.drawn
        long, total = drawn.long_share(d)
        pct = (lambda n: f"{100 * n / total:.0f}%") if total else (lambda n: "-")
        print(f"{name:36s} {total:4d} cases  >{drawn.LONG}: {pct(long):>4s}  fp8: {pct(d['kv_dtype'].get('fp8', 0)):>4s}  "
              f"fp16: {pct(d['dtype'].get('fp16', 0)):>4s}  D=64: {pct(d['head_dim'].get('64', 0)):>4s}  "
              f"pools>2^31: {d[drawn.POOL_KEY]}  context {d['context']}")
        e = d[drawn.EXTREMES]
        print(f"{'':36s} extremes: |stored fp8| {e['fp8_stored_max']:g}, K x G {e['rows_per_kv_head_max']} "
              f"({e['rows_per_kv_head_max_cases']} cases), last key of L {e['heaviest_last_context_key_longest']}, "
              f"heaviest key {e['heaviest_key']}, window edges {e['window_edges']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
