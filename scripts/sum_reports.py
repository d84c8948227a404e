"""Totals per lowering over several reports (runs topped up with other seeds), as a markdown table.

    python scripts/sum_reports.py REPORT [REPORT ...]     # parity.json or parity.json.gz files

For each lowering in any report: the cases judged in each (and its seed), their sum, the failures, the worst
margin of any, and the shares of cases past 4,096 keys and with an fp8 KV pool (from each report's drawn
histogram). A partial (interrupted) report counts the cases it judged; its lowering is marked `*`.
Used for the totals in docs/gpu/ records.
"""

from __future__ import annotations

import gzip
import json
import lzma
import sys
from pathlib import Path

LONG_BUCKETS = ("4097-32768", "32769-131072")


def load(path: str) -> dict:
    p = Path(path)
    opener = {".gz": gzip.open, ".xz": lzma.open}.get(p.suffix, open)  # records: gzip, or xz (runs/RECOMPRESSED.md)
    with opener(p, "rt") as f:
        return json.load(f)


def totals(reports: list[tuple[str, dict]]) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for label, data in reports:
        seed = (data.get("settings") or {}).get("seed")
        for name, v in data["lowerings"].items():
            if v.get("status") == "unavailable":
                continue
            t = out.setdefault(name, {"cases": 0, "failures": 0, "parts": [], "worst": None, "long": 0, "fp8": 0,
                                      "interrupted": False})
            t["cases"] += v["cases"]
            t["failures"] += len(v.get("failures", []))
            t["parts"].append(f"{label}: {v['cases']:,} (seed {seed})")
            m = v.get("worst_margin")
            if m is not None and (t["worst"] is None or m > t["worst"]):
                t["worst"] = m
            drawn = v.get("drawn") or {}
            t["long"] += sum(drawn.get("context", {}).get(b, 0) for b in LONG_BUCKETS)
            t["fp8"] += drawn.get("kv_dtype", {}).get("fp8", 0)
            t["interrupted"] |= bool(v.get("interrupted"))
    return out


def table(tot: dict[str, dict]) -> str:
    rows = ["| lowering | cases (report: cases, seed) | failures | worst margin | past 4,096 keys | fp8 KV |",
            "|---|---|---|---|---|---|"]
    for name, t in tot.items():
        n = t["cases"] or 1
        worst = "-" if t["worst"] is None else f"{t['worst']:.2f}"
        rows.append(f"| {name}{' *' if t['interrupted'] else ''} | **{t['cases']:,}** ({'; '.join(t['parts'])}) | "
                    f"{t['failures']} | {worst} | {100 * t['long'] / n:.0f}% | {100 * t['fp8'] / n:.0f}% |")
    return "\n".join(rows) + "\n\n`*`: counts cases of a run stopped at its limit (a partial report).\n"


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__, file=sys.stderr if not argv else sys.stdout)
        return 2 if not argv else 0
    reports = []
    for path in argv:
        try:
            reports.append((Path(path).name.split("-parity")[0], load(path)))
        except (OSError, ValueError, KeyError) as err:
            print(f"sum_reports: {path}: not a readable parity.json ({err})", file=sys.stderr)
            return 2
    sys.stdout.write(table(totals(reports)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
