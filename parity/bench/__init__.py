"""`dflash-parity bench`: timing tables of the lowerings, each row with its parity verdict.

A fast wrong kernel is not a result: every timed lowering is also run once on the timed inputs and
judged against the oracle with its tolerance (as `dflash-parity check` judges a case), and a cell
whose verdict fails shows FAIL instead of a number.

Modules (imported lazily: this one stays light, the CLI imports it to build its parser):

- `timing`: CUDA-graph replays over rotating input sets (median, p10, p90), CPU wall-clock timing;
- `shapes`: bench shapes, their memory, the shared KV pool and the input sets built over it;
- `measure`: one lowering (or merge function) on one shape: availability, memory, supports, eager
  check run, timing, verdict; `force_rows` (the decode-row form at every batch size);
- `tables`: the table model, the decode rows / context ratio and hybrid tables, the
  dispatch-threshold verdict; `merge_table`: the merge forms' table;
- `render`: terminal tables, Markdown, JSON, PNG;
- `run`: the driver (`BenchOptions`, `run_bench`).
"""

from __future__ import annotations

import argparse
import math

SCHEMA = "dflash-parity-bench/1"
TABLES = ("decode-rows", "merge", "hybrid")


def parse_max_gib(text: str) -> float:
    """argparse type of `--max-gib`: a finite positive number of GiB."""
    try:
        v = float(text)
    except ValueError:
        v = math.nan
    if not (v > 0 and math.isfinite(v)):
        raise argparse.ArgumentTypeError(f"--max-gib must be a positive number of GiB, got {text!r}")
    return v
