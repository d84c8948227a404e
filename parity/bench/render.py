"""Bench output: terminal tables, Markdown, JSON (schema `dflash-parity-bench/1`) and one PNG per table.

bench.json:

    {"schema": "dflash-parity-bench/1", "device": "...", "torch": "...", "date": "...", "timing": "...",
     "versions": {...}, "settings": {...}, "png": {"<table>": "<table>.png" | null}, "png_note": "...",
     "failed": bool,
     "tables": [{"id", "title", "unit": "ratio" | "us", "x": "B", "columns": [B, ...], "complete",
                 "failed", "notes": [...],
                 "rows": [{"label", "head": {...}, "cells": {"<B>": {"value", "text"}}, "tail": {...},
                           "parity", "failed", "notes", "group"}],
                 "measurements": [{"table", "label", "shape": {...}, "status", "reason",
                                   "timing": {"mode", "median_us", "p10_us", "p90_us", "samples", "sets",
                                              "l2_flush", "note"} | null,
                                   "verdict": {"passed", "margin", "failures", "judged"} | null,
                                   "seconds"}]}]}

`value` is a number only where the cell is a result (timed and its parity passed).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from parity.bench.measure import Measurement
from parity.bench.tables import Table, fmt_us
from parity.report.escape import md_text
from parity.report.files import format_table

PNG_SKIPPED = "matplotlib not installed: PNG skipped"


def grid(t: Table) -> list[list[str]]:
    rows = [t.head_names + [f"B={x}" for x in t.columns] + t.tail_names + ["parity", "notes"]]
    for r in t.rows:
        rows.append(r.head + [r.cells[x].text if x in r.cells else "" for x in t.columns] + r.tail
                    + [r.parity, r.notes])
    return rows


def terminal(t: Table) -> str:
    head = t.title + ("" if t.complete else "  [INCOMPLETE]")
    body = format_table(grid(t)) if t.rows else "(no rows)"
    return f"{head}\n{body}"


def _md_escape(text: str) -> str:
    """A table cell's text made inert (lowering labels and reasons come from plugins: `parity.report.escape`)."""
    return md_text(text, table=True)


def md_table(rows: Sequence[Sequence[str]]) -> str:
    out = ["| " + " | ".join(_md_escape(c) for c in rows[0]) + " |", "|" + "---|" * len(rows[0])]
    out += ["| " + " | ".join(_md_escape(c) for c in r) + " |" for r in rows[1:]]
    return "\n".join(out)


def measurement_rows(ms: Sequence[Measurement]) -> list[list[str]]:
    rows = [["what", "shape", "median us", "p10 us", "p90 us", "replays", "timing", "result"]]
    for m in ms:
        if m.status == "unavailable":  # said once per row in the table above
            continue
        t = m.timing
        nums = [fmt_us(t.median_us), fmt_us(t.p10_us), fmt_us(t.p90_us), str(t.samples), t.describe()] if t else \
            ["-", "-", "-", "-", "-"]
        result = m.verdict.text() if (m.verdict and m.status == "ok") else f"{m.status}: {m.reason}"
        rows.append([m.label, m.shape_label] + nums + [result])
    return rows


def markdown(meta: dict[str, Any], tables: Sequence[Table], png: dict[str, str | None], png_note: str) -> str:
    parts = [f"# dflash-parity bench: {'FAIL' if any(t.failed for t in tables) else 'pass'}", "",
             f"- device: {meta['device']}", f"- torch {meta['torch']}"
             + "".join(f", {k} {v}" for k, v in meta.get("versions", {}).items() if v and k != "python"),
             f"- date: {meta['date']}", f"- timing: {meta['timing']}"]
    if png_note:
        parts.append(f"- {png_note}")
    for t in tables:
        parts += ["", f"## {t.id}", "", f"{t.title}{'' if t.complete else ' [INCOMPLETE]'}", ""]
        parts.append(md_table(grid(t)) if t.rows else "(no rows)")
        if png.get(t.id):
            parts += ["", f"![{t.id}]({png[t.id]})"]
        parts += [""] + [f"- {md_text(n)}" for n in t.notes]
        if t.measurements:
            parts += ["", f"### {t.id}: every measurement", "", md_table(measurement_rows(t.measurements))]
    return "\n".join(parts) + "\n"


def jsonable(x: Any) -> Any:
    if isinstance(x, float):
        if math.isnan(x):
            return "nan"
        return x if math.isfinite(x) else ("inf" if x > 0 else "-inf")
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    return x


def write_png(t: Table, path) -> str | None:
    """Plot `t` (value against B on a log2 axis, one line per row, one panel per row group) to `path`.
    Returns None when written, else the reason it was skipped (matplotlib missing, nothing to plot)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return PNG_SKIPPED
    groups: list[str] = []  # panels with something to plot, in row order
    for r in t.rows:
        if r.group not in groups and any(c.value is not None for c in r.cells.values()):
            groups.append(r.group)
    if not groups:
        return "no measured value to plot: PNG skipped"
    fig, axes = plt.subplots(1, len(groups), figsize=(6.5 * len(groups), 4.8), squeeze=False)
    for ax, g in zip(axes[0], groups):
        for r in (r for r in t.rows if r.group == g):
            pts = sorted((x, c.value) for x, c in r.cells.items() if c.value is not None)
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", linewidth=1.2, label=r.label)
        ax.set_xscale("log", base=2)
        ax.set_xticks(t.columns)
        ax.set_xticklabels([str(x) for x in t.columns])
        if t.hline is not None:
            ax.axhline(t.hline, color="gray", linestyle="--", linewidth=0.8)
        if t.vline is not None:
            ax.axvline(t.vline, color="gray", linestyle=":", linewidth=0.8)
        ax.set_yscale("log")
        ax.set_xlabel("B (batch size)")
        ax.set_ylabel(t.y_label or t.unit)
        if g:
            ax.set_title(g, fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=6, loc="best")
    fig.suptitle(t.title, fontsize=8, wrap=True)
    fig.tight_layout()
    fig.savefig(str(path), dpi=130)
    plt.close(fig)
    return None
