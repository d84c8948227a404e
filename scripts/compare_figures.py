"""Compare the per-lowering figures of check reports with a baseline report (H200 records: did a change move any
figure?). `python3 scripts/compare_figures.py BASE.json[.gz|.xz] OTHER.json[.gz|.xz] ...`: for each other report, each
lowering's status, cases, passed, unsupported, worst ulp, worst relative L2 and worst margin, equal or not (a
lowering missing from either side is said). Exit 0 when every report matches the baseline, 1 otherwise."""

from __future__ import annotations

import gzip
import json
import lzma
import sys

KEYS = ("status", "cases", "passed", "unsupported", "worst_ulp", "worst_rel_l2", "worst_margin")


def load(path: str) -> dict[str, tuple]:
    opener = {".gz": gzip.open, ".xz": lzma.open}.get(path[-3:], open)  # records: gzip, or xz (runs/RECOMPRESSED.md)
    with opener(path, "rt") as f:
        data = json.load(f)
    return {name: tuple(v.get(k) for k in KEYS) for name, v in data["lowerings"].items()}


def main(argv: list[str]) -> int:
    base = load(argv[0])
    same = True
    for path in argv[1:]:
        try:
            other = load(path)
        except (OSError, ValueError) as err:
            print(f"{path}: no report ({err})")
            same = False
            continue
        diff = {k: (other.get(k), base.get(k)) for k in sorted(set(base) | set(other)) if other.get(k) != base.get(k)}
        cases = sum(v[1] or 0 for v in other.values())
        if diff:
            same = False
            print(f"{path}: {len(other)} lowerings, {cases} cases; differs from {argv[0]} in {len(diff)}:")
            for k, (o, b) in diff.items():
                print(f"  {k}: {dict(zip(KEYS, o)) if o else None} != {dict(zip(KEYS, b)) if b else None}")
        else:
            print(f"{path}: {len(other)} lowerings, {cases} cases; the same figures as {argv[0]}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
