"""The table of a report's lowerings (the terminal, `summary.md`, the pytest terminal summary) and the
one-line facts beside it, pure functions of report data (`parity.report.files`'s JSON).

- `table_rows(data)`: a header row and one row per lowering: its status (`INTERRUPTED` for one a signal
  stopped before any case failed; "LSE unchecked" marked, `parity.report.lse`), counts, worst figures (a
  failing lowering's: its first failure's own), kernel calls, compilations per shape family.
- `format_table(rows)`: the rows as aligned text columns.
- `phase_line(entry)`, `oracle_line(entry)`: where a lowering's time went, how the golden reference judged
  its cases ('' when the entry has none).
- `short_case(case JSON)`: a case in one short line.

Public: `table_rows`, `format_table`, `phase_line`, `oracle_line`, `short_case`, `stopped_with_nothing_failed`.
"""

from __future__ import annotations

from typing import Any

from parity.report import lse as lse_report


def short_case(cj: dict[str, Any] | None) -> str:
    """`B=2 L=[3, 7] K=2 4/1 D=64 bfloat16 w=(-1, -1)` of a case's JSON object ("-" for none)."""
    if not cj:
        return "-"
    w = cj["window"]
    return (f"B={cj['batch_size']} L={cj['context_lens'][:4]}{'...' if len(cj['context_lens']) > 4 else ''} "
            f"K={cj['block_size']} {cj['num_q_heads']}/{cj['num_kv_heads']} D={cj['head_dim']} "
            f"{cj['dtype']}{'/' + cj['kv_dtype'] if cj['kv_dtype'] != cj['dtype'] else ''} w={tuple(w)}")


def stopped_with_nothing_failed(v: dict[str, Any]) -> bool:
    """A lowering entry a signal stopped before any case failed (its status is "fail": a partial run)."""
    return v["status"] == "fail" and bool(v.get("interrupted")) and not v["failures"]


def table_rows(data: dict[str, Any]) -> list[list[str]]:
    """The header row and one row per lowering of report `data` (see the module docstring)."""
    rows = [["lowering", "status", "cases", "fail", "unsup", "worst ulp", "worst rel L2", "margin", "calls", "compiles"]]
    for name, v in data["lowerings"].items():
        if v["status"] == "unavailable":
            rows.append([name, "unavailable", "-", "-", "-", "-", "-", "-", "-", "-"])
            continue
        ulp, rel, margin = v["worst_ulp"], v["worst_rel_l2"], v["worst_margin"]
        status = v["status"].upper() if v["status"] == "fail" else v["status"]
        if stopped_with_nothing_failed(v) and v.get("judged"):
            status = "INTERRUPTED"  # what ran, not a verdict
        elif v["status"] == "fail":  # the failing case's own figures ("-": it crashed, raised, or none failed)
            figs = (v["failures"][0].get("figures") or {}) if v["failures"] else {}
            ulp, rel, margin = figs.get("out_ulp", "-"), figs.get("out_rel_l2", "-"), figs.get("margin", "-")
        rows.append([name, lse_report.status_cell(v, status), str(v["cases"]),
                     str(len(v["failures"])), str(v["unsupported"]), _fmt(ulp, ".2f"), _fmt(rel, ".2e"),
                     _fmt(margin, ".2f"),
                     f"{v['calls_checked']} ok" if v["status"] == "pass" else str(v["calls_checked"]),
                     f"{v['max_compiles_in_a_family']}/{v['max_compiles']} per family" if v["max_compiles"] else "-"])
    return rows


def _fmt(x: Any, spec: str) -> str:
    return format(x, spec) if isinstance(x, (int, float)) and not isinstance(x, bool) else str(x)


def format_table(rows: list[list[str]]) -> str:
    """`rows` (the first one the header) as text columns, each as wide as its widest cell."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = []
    for n, r in enumerate(rows):
        out.append("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
        if n == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def phase_line(v: dict[str, Any]) -> str:
    """`"5.1 cases/s; lowering 40%, draw 25%, build 12%, ..."` from a lowering's report entry ('' if none).

    Percentages are of the lowering's wall seconds; `draw` is the part no case phase timed (hypothesis
    generating and shrinking cases, progress and bookkeeping, worker round trips when isolated)."""
    ph = {k: float(x) for k, x in (v.get("phase_seconds") or {}).items() if float(x) > 0}
    timed = sum(ph.values())
    if not timed:
        return ""
    wall = float(v.get("seconds") or 0.0)
    if wall > timed and "draw" not in ph:  # merged shards carry their own draw (parity.exec.shards)
        ph["draw"] = wall - timed
    total = max(wall, timed)
    run = v.get("cases", 0) - v.get("unsupported", 0)
    rate = f"{run / wall:.1f} cases/s; " if wall else ""
    return rate + ", ".join(f"{k} {100 * x / total:.0f}%" for k, x in sorted(ph.items(), key=lambda kv: -kv[1]))


def oracle_line(v: dict[str, Any]) -> str:
    """`"12 case(s) in fp32, 71 in fp64; its error bound at most 0.031 of the tightest bound"` ('' if none): how the
    golden reference (`parity.engine.golden`) judged a lowering's cases."""
    tally = v.get("oracle") or {}
    n32, n64 = int(tally.get("float32", 0)), int(tally.get("float64", 0))
    if not n32 + n64:
        return ""
    worst = tally.get("worst_share")
    return (f"{n32} case(s) in fp32, {n64} in fp64; its error bound at most {float(worst):.2g} of the tightest bound"
            if worst is not None else f"{n32} case(s) in fp32, {n64} in fp64")
