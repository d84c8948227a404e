"""What each lowering drew (`parity.engine.drawn`'s `drawn` entries) as `summary.md`'s two Markdown tables: the
longest context per case, dtypes, KV dtypes, head dims and pools past 2^31 elements (`summary_lines`), and the
extremes the draws reached (`extremes_lines`). Lowering names and every cell are made inert for a table
(`parity.report.escape`): a plugin's name adds no row, heading or verdict.

Public: `summary_lines`, `extremes_lines`.
"""

from __future__ import annotations

from typing import Any

from parity.engine.drawn import CONTEXT_BUCKETS, EXTREMES, LONG, POOL_KEY, long_share, new_extremes
from parity.report.escape import md_code, md_text


def _pct(n: int, total: int) -> str:
    return f"{100 * n / total:.0f}%" if total else "-"


def _edges(e: dict[str, Any]) -> str:
    """`W 4096: 3/2` (cases inside / past the edge) per window width, widest first; `-` for none."""
    edges = e.get("window_edges") or {}
    return ", ".join(f"W {W}: {s.get('inside', 0)}/{s.get('past', 0)}"
                     for W, s in sorted(edges.items(), key=lambda kv: -int(kv[0]))) or "-"


def extremes_lines(rows: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """The Markdown table of the extremes each lowering's draws reached."""
    out = ["", "Extremes reached: largest |stored fp8| (by construction) and fp8 cases with e4m3 subnormals; most "
           "query rows per KV head (K x G) and cases there; the heaviest key's position (requests of sink/peak "
           "cases) and the longest context whose last key held the mass; window edges (cases inside/past, per W).",
           "", "| lowering | max \\|stored fp8\\| | fp8 subnormal cases | max K x G (cases) | heaviest key "
           "| last key, longest L | window edges |", "|---|---|---|---|---|---|---|"]
    for name, d in rows:
        e = d.get(EXTREMES) or new_extremes()
        hist = sorted(e.get("heaviest_key", {}).items(), key=lambda kv: -kv[1])
        heavy = ", ".join(f"{k} {n}" for k, n in hist) or "-"
        cells = [f"{e.get('fp8_stored_max', 0):g}", f"{e.get('fp8_subnormal_cases', 0)}",
                 f"{e.get('rows_per_kv_head_max', 0)} ({e.get('rows_per_kv_head_max_cases', 0)})", heavy,
                 f"{e.get('heaviest_last_context_key_longest', 0) or '-'}", _edges(e)]
        out.append(f"| {md_code(name, table=True)} | " + " | ".join(md_text(c, table=True) for c in cells) + " |")
    return out


def summary_lines(lowerings: dict[str, dict[str, Any]]) -> list[str]:
    """The Markdown tables of what each lowering drew ([] when no entry has a histogram)."""
    rows = [(name, v["drawn"]) for name, v in lowerings.items() if v.get("drawn") and v["drawn"].get("context")]
    if not rows:
        return []
    heads = [f"{lo}" if lo == hi else f"{lo}-{hi}" for lo, hi in CONTEXT_BUCKETS]
    out = ["", "## Drawn cases", "",
           f"Longest context per case (keys), share past {LONG}, dtypes, KV dtypes, head dims, pools past 2^31 elements.",
           "", "| lowering | " + " | ".join(heads) + f" | >{LONG} | dtype | KV dtype | head dim | pools >2^31 |",
           "|---|" + "---|" * (len(heads) + 5)]
    for name, d in rows:
        ctx = d["context"]
        long, total = long_share(d)

        def mix(key: str) -> str:
            counts = d.get(key, {})
            return ", ".join(f"{md_text(k, table=True)} {_pct(n, total)}"
                             for k, n in sorted(counts.items(), key=lambda kv: -kv[1]))

        out.append(f"| {md_code(name, table=True)} | " + " | ".join(md_text(ctx.get(h, 0), table=True) for h in heads)
                   + f" | {_pct(long, total)} | {mix('dtype')} | {mix('kv_dtype')} | {mix('head_dim')} | "
                   f"{md_text(d.get(POOL_KEY, 0), table=True)} |")
    return out + extremes_lines(rows)
