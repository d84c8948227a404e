"""The `dflash-parity bench` verb, added to the command line by this package's entry point
(`[project.entry-points."dflash_parity.verbs"] bench = "parity.bench.verb:VERB"`; `parity.front.cli` reads the group).

A verb is an object with `help`, `machinery` (whether the front end's start-up runs before it, as for `check`),
`add_arguments(parser)` (its own options; the front end adds the common ones, `--plugin`, `--device`, ...) and
`run(args, setup) -> exit code`, `setup(args) -> (device, policy)` loading the plugins, the device and the policy
as every verb does.

Public: `VERB`.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Callable

from parity.bench import TABLES, parse_max_gib
from parity.engine import ranges


def _positive_int(flag: str, most: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            v = 0
        if v < 1:
            raise argparse.ArgumentTypeError(f"{flag} must be a positive integer, got {text!r}")
        if v > most:
            raise argparse.ArgumentTypeError(f"{flag} must be at most {most}, got {text!r}")
        return v
    return parse


def _positive_seconds(flag: str) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            v = float("nan")
        problem = ranges.seconds_problem(v)
        if problem is not None:
            raise argparse.ArgumentTypeError(f"{flag} must be {problem}, got {text!r}")
        return v
    return parse


class BenchVerb:
    """`dflash-parity bench` (see the module docstring)."""

    help = "timing tables (CUDA graphs, median of replays), each row with its parity verdict"
    machinery = True

    def add_arguments(self, sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--table", choices=TABLES + ("all",), default="all", help="which table (default: all)")
        sp.add_argument("--quick", action="store_true", help="a tiny shape subset (CPU runs, smoke runs)")
        sp.add_argument("--out", default="bench-report", metavar="DIR",
                        help="writes bench.json, bench.md and <table>.png here (default: bench-report)")
        sp.add_argument("--replays", type=_positive_int("--replays", ranges.MAX_REPLAYS), default=None,
                        help="timed replays per measurement (default: 50 on cuda, 5 on a cpu)")
        sp.add_argument("--max-gib", type=parse_max_gib, default=100.0, metavar="GIB",
                        help="skip shapes whose inputs and oracle would need more memory (default: 100)")
        sp.add_argument("--time-cap", type=_positive_seconds("--time-cap"), default=None, metavar="SECONDS",
                        help="fewer replays for slow shapes: timed replays stop past this (default: 1 on cuda, 0.5 "
                             "on a cpu)")
        sp.add_argument("--lowering", action="append", default=[], metavar="NAME",
                        help="also time this lowering in the hybrid table (repeatable; e.g. a plugin's)")
        sp.add_argument("--quiet", action="store_true", help="no progress lines")

    def run(self, args: argparse.Namespace, setup: Callable) -> int:
        """Time the tables; exit 1 when a timed lowering fails parity (or raises), 0 otherwise."""
        import lowerings
        from oracle.errors import InvalidInput
        from parity.bench.run import BenchOptions, run_bench

        device, pol = setup(args)
        if device == "cuda":
            import torch
            if not torch.cuda.is_available():
                raise InvalidInput("--device", "'cuda' was asked for but torch sees no CUDA device here")
        tables = TABLES if args.table == "all" else (args.table,)
        for name in args.lowering:
            lowerings.get(name)  # unknown -> "--lowering: unknown lowering ..."
        if args.lowering and "hybrid" not in tables:
            raise InvalidInput("--lowering", f"adds a lowering to the hybrid table, which --table {args.table} "
                                             f"leaves out")
        out = Path(args.out)
        if out.exists() and not out.is_dir():
            raise InvalidInput("--out", f"{out} exists and is not a directory")
        opts = BenchOptions(device=device, tables=tables, quick=args.quick, replays=args.replays,
                            max_gib=args.max_gib, time_cap=args.time_cap, out_dir=str(out),
                            extra_lowerings=tuple(args.lowering), quiet=args.quiet)
        return 1 if run_bench(opts, pol).failed else 0


VERB = BenchVerb()
