"""Where a case waits for the GPU: every host-device synchronization of a `check` run, counted by the
project line that caused it (no timing: a census).

    python lab/gpu_sync_census.py [CHECK ARGS ...]      # e.g. --lowering hybrid_paged --max-examples 40

Runs `dflash-parity check --device cuda` in this process with `torch.cuda.set_sync_debug_mode("warn")`:
torch then warns at each synchronizing call (`.item()`, `int(t)`, `bool(t)`, a device-to-host copy, ...).
Each warning is charged to the innermost frame of this repository's own code on the stack. Prints the
synchronizations per case and the 30 lines that cause the most. On a GPU shared by several processes each
synchronization waits for the other processes' work too (time slicing), so their count per case is a cost
that no single process's time line shows.
"""

from __future__ import annotations

import collections
import os
import sys
import traceback
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main(argv: list[str]) -> int:
    import torch

    from parity.front import cli

    if not torch.cuda.is_available():
        print("gpu_sync_census: no CUDA device visible to torch", file=sys.stderr)
        return 2
    counts: collections.Counter[str] = collections.Counter()
    total = 0

    def show(message, category, filename, lineno, file=None, line=None):
        nonlocal total
        if "synchroniz" not in str(message):
            return
        total += 1
        where = "(outside the repository)"
        for fr in reversed(traceback.extract_stack()[:-1]):
            if fr.filename.startswith(ROOT) and "gpu_sync_census" not in fr.filename:
                where = f"{os.path.relpath(fr.filename, ROOT)}:{fr.lineno} {fr.name}: {(fr.line or '').strip()[:90]}"
                break
        counts[where] += 1

    warnings.showwarning = show
    warnings.simplefilter("always")
    torch.cuda.set_sync_debug_mode("warn")
    report = "/tmp/sync-census-report"
    code = cli.main(["check", "--device", "cuda", "--no-isolate", "--report", report, *argv])
    torch.cuda.set_sync_debug_mode("default")
    import json

    data = json.load(open(os.path.join(report, "parity.json")))
    cases = sum(e.get("cases", 0) for e in data["lowerings"].values())
    print(f"\n{total} synchronizations in {cases} cases: {total / max(1, cases):.1f} per case (check exit code {code})")
    for where, n in counts.most_common(30):
        print(f"{n:8d}  {n / max(1, cases):7.1f}/case  {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
