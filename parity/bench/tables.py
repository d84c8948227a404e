"""The bench tables' model and two of them: decode rows / context ratio, hybrid kernel (merge forms:
`parity.bench.merge_table`).

Each spec lists its shapes and the lowerings (or merge forms) it times, measures them through
`parity.bench.measure`, and folds the measurements into a `Table` of rows: one row per shape (or per
lowering), one column per batch size `B`, a parity column, a notes column. A cell holds a number only
when its measurement is a result: timed, and its lowering's verdict passed. A wrong kernel's cell
says FAIL and counts nowhere (not in a ratio, a plot or a threshold verdict).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

from lowerings.protocol import Lowering
from oracle.rules import DECODE_ROWS_MAX_BATCH
from parity.bench import measure as ms
from parity.bench.shapes import Shape

DISPATCH_THRESHOLD = DECODE_ROWS_MAX_BATCH  # seed 002's: decode rows when B <= 32, the context form above


# ---- table model ------------------------------------------------------------------------------------------
@dataclass
class Cell:
    value: float | None
    text: str


@dataclass
class Row:
    label: str  # legend / plot label
    head: list[str]
    cells: dict[int, Cell]
    tail: list[str]
    parity: str
    notes: str
    failed: bool = False
    group: str = ""  # rows of one group share a plot panel

    def to_json(self, head_names: list[str], tail_names: list[str]) -> dict[str, Any]:
        return {"label": self.label, "head": dict(zip(head_names, self.head)),
                "cells": {str(x): {"value": None if c.value is None else round(c.value, 4), "text": c.text}
                          for x, c in self.cells.items()},
                "tail": dict(zip(tail_names, self.tail)), "parity": self.parity, "failed": self.failed,
                "notes": self.notes, "group": self.group}


@dataclass
class Table:
    id: str
    title: str
    unit: str  # "ratio" or "us"
    columns: list[int]
    head_names: list[str]
    tail_names: list[str] = field(default_factory=list)
    rows: list[Row] = field(default_factory=list)
    measurements: list[ms.Measurement] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    complete: bool = True
    y_label: str = ""
    hline: float | None = None
    vline: int | None = None

    @property
    def failed(self) -> bool:
        return any(m.failed for m in self.measurements)

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "title": self.title, "unit": self.unit, "x": "B", "columns": self.columns,
                "complete": self.complete, "failed": self.failed, "notes": self.notes,
                "rows": [r.to_json(self.head_names, self.tail_names) for r in self.rows],
                "measurements": [m.to_json() for m in self.measurements]}


# ---- helpers ------------------------------------------------------------------------------------------------
def fmt_len(n: int) -> str:
    return f"{n // 1024}K" if n >= 1024 and n % 1024 == 0 else str(n)


def fmt_us(us: float) -> str:
    return f"{us:.1f}" if us < 1000 else f"{us:.0f}"


def threshold_verdict(ratios: dict[int, float | None], threshold: int = DISPATCH_THRESHOLD) -> tuple[str, str]:
    """From rows/context time ratios by batch size (None: not measured, or not a result), return
    `(largest B where rows are faster, verdict on the dispatch threshold)`.

    The threshold (rows when `B <= threshold`) is right when the rows win (ratio < 1) at every measured
    `B <= threshold` and lose at every measured `B > threshold`; "too low" when they still win above
    it, "too high" when they lose at or below it ("rows lose above B=8": they win up to 8).
    """
    pts = sorted((b, r) for b, r in ratios.items() if r is not None and math.isfinite(r))
    if not pts:
        return "-", "no data"
    wins = [b for b, r in pts if r < 1.0]
    largest = f"B={max(wins)}" if wins else "none"
    below = [(b, r) for b, r in pts if b <= threshold]
    above = [(b, r) for b, r in pts if b > threshold]
    lose_below = [b for b, r in below if r >= 1.0]
    win_above = [b for b, r in above if r < 1.0]
    if lose_below and win_above:
        return largest, f"wrong both ways: rows lose at B={min(lose_below)} but win at B={max(win_above)}"
    if win_above:
        return largest, f"too low: rows still win at B={max(win_above)}"
    if lose_below:
        first = min(lose_below)
        ok = [b for b, _ in below if b < first]
        return largest, (f"too high: rows lose above B={max(ok)}" if ok else f"too high: rows lose from B={first}")
    if not above:
        return largest, f"not too high; nothing measured above B={threshold}"
    if not below:
        return largest, f"not too low; nothing measured at B<={threshold}"
    return largest, "right"


def row_parity(measurements: Sequence[ms.Measurement]) -> tuple[str, bool]:
    """One row's parity column from its measurements: the first failure, else pass with the worst
    margin, then what was not measured and why (grouped, with the batch sizes it concerns)."""
    for m in measurements:
        if m.failed:
            why = m.verdict.failures[0] if m.verdict and m.verdict.failures else m.reason
            return f"FAIL at B={m.shape.batch} ({m.label}): {why}", True
    parts = []
    measured = [m for m in measurements if m.status == ms.OK and m.verdict is not None]
    if measured:
        parts.append(f"pass (margin {ms.fmt_margin(max(m.verdict.margin or 0.0 for m in measured))})")
    all_b = sorted({m.shape.batch for m in measurements})
    labels = {m.label for m in measurements}
    groups: dict[tuple[str, str], tuple[set[int], set[str]]] = {}
    for m in measurements:
        if m.status in (ms.UNAVAILABLE, ms.UNSUPPORTED, ms.SKIPPED):
            bs, who = groups.setdefault((m.status, m.reason), (set(), set()))
            bs.add(m.shape.batch)
            who.add(m.label)
    for (status, reason), (bs, who) in groups.items():
        where = "" if sorted(bs) == all_b else "B=" + ",".join(str(b) for b in sorted(bs)) + " "
        names = "" if who == labels else f" ({', '.join(sorted(who))})"
        parts.append(f"{where}{status}{names}: {reason}")
    return "; ".join(parts) if parts else "-", False


def timing_notes(measurements: Sequence[ms.Measurement]) -> str:
    """The timing modes of a row's measurements: `cuda graph, 1-8 sets, L2 flush at B=1,2`."""
    timed = [m for m in measurements if m.timing is not None]
    if not timed:
        return ""
    modes = sorted({m.timing.mode for m in timed})
    sets = sorted({m.timing.sets for m in timed})
    parts = ["/".join(modes)]
    if sets[-1] > 1:
        parts.append(f"{sets[0]}-{sets[-1]} sets" if len(sets) > 1 else f"{sets[0]} sets")
    flushed = sorted({m.shape.batch for m in timed if m.timing.l2_flush})
    if flushed:
        parts.append("L2 flush at B=" + ",".join(map(str, flushed)))
    parts += sorted({_clip(m.timing.note) for m in timed if m.timing.note})
    return ", ".join(parts)


def _clip(text: str, n: int = 110) -> str:
    return text if len(text) <= n else text[: n - 3] + "..."


def cell_from(m: ms.Measurement) -> Cell:
    v = m.value_us
    return Cell(v, fmt_us(v)) if v is not None else Cell(None, m.cell())


def _group_by_pool(shapes: Sequence[Shape]) -> list[Shape]:
    """`shapes` reordered so that each pool family is measured in one stretch (first-seen order)."""
    order: dict[tuple, list[Shape]] = {}
    for s in shapes:
        order.setdefault(s.pool_key, []).append(s)
    return [s for group in order.values() for s in group]


def _available(lowering: Lowering, device: str) -> bool:
    try:
        return bool(lowering.available(device)[0])
    except Exception:
        return False


# ---- (a) decode rows / context ------------------------------------------------------------------------------
@dataclass
class DecodeRowsSpec:
    """Rows form (forced at every B) against the context form, per shape and batch size."""

    bases: list[Shape]  # batch ignored
    batches: tuple[int, ...]
    context: Lowering
    kernels: list[tuple[str, Lowering]]  # (decode kernel label, decode-rows lowering)
    context_note: str = ""
    threshold: int = DISPATCH_THRESHOLD
    id: str = "decode-rows"

    def count(self, env: ms.BenchEnv) -> int:
        per_shape = sum(_available(lw, env.device) for lw in [self.context] + [k for _, k in self.kernels])
        return per_shape * len(self.bases) * len(self.batches)

    def title(self, timing: str) -> str:
        return (f"decode rows / context time ratio (context = {self.context.name}{self.context_note}; "
                f"below 1: the rows are faster; {timing})")

    def run(self, env: ms.BenchEnv, timing: str, table: Table | None = None) -> Table:
        t = table or self.empty(timing)
        forced = [(label, ms.force_rows(lw)) for label, lw in self.kernels]
        runs = {(b, B): ms.ShapeRun(env, self.id, b.with_batch(B)) for b in self.bases for B in self.batches}
        for r in runs.values():
            r.plan()
        ctx: dict[tuple, ms.Measurement] = {}
        rows: dict[tuple, ms.Measurement] = {}
        try:
            for base in _group_by_pool(self.bases):
                for B in self.batches:
                    run = runs[(base, B)]
                    ctx[(base, B)] = m = ms.measure_lowering(env, run, self.context)
                    t.measurements.append(m)
                    for label, lw in forced:
                        rows[(base, label, B)] = m = ms.measure_lowering(env, run, lw)
                        t.measurements.append(m)
                    run.release()
                self._fold(t, ctx, rows)
        finally:
            env.pools.release()
        return t

    def empty(self, timing: str) -> Table:
        return Table(self.id, self.title(timing), "ratio", list(self.batches),
                     ["heads", "D", "L", "decode kernel"], ["rows faster up to", f"threshold {self.threshold}"],
                     y_label="decode-row time / context time", hline=1.0, vline=self.threshold, complete=False,
                     notes=[f"Each cell: the decode-row form's time over the context form's for the same block "
                            f"attention, medians. The rows form is forced at every B (the registered lowering "
                            f"takes the context form above B={self.threshold}); the registered object is unchanged.",
                            "The block's K/V sit in the pool already (appended storage): the two attention "
                            "kernels alone, as seed 002's sweep compares them.",
                            f"threshold {self.threshold}: right when the rows win (ratio < 1) at every measured "
                            f"B <= {self.threshold} and lose at every measured B > {self.threshold}.",
                            "FAIL: the lowering's output failed parity; such a cell is not a result and counts "
                            "nowhere. skip: over --max-gib. unsup.: outside what the lowering expresses.",
                            "*: the two forms were not timed the same way (one in a CUDA graph, the other eagerly "
                            "with its host work: see the notes column); that ratio is biased."])

    def _fold(self, t: Table, ctx: dict, rows: dict) -> None:
        t.rows = []
        for base in self.bases:
            cms = [ctx[(base, B)] for B in self.batches if (base, B) in ctx]
            if not cms:
                continue
            for label, _ in self.kernels:
                rms = [rows[(base, label, B)] for B in self.batches if (base, label, B) in rows]
                cells, ratios = {}, {}
                for B in self.batches:
                    c, r = ctx.get((base, B)), rows.get((base, label, B))
                    if c is None or r is None:
                        continue
                    if r.value_us is not None and c.value_us is not None:
                        ratios[B] = r.value_us / c.value_us
                        same = r.timing.mode == c.timing.mode  # a graph against an eager call is biased: flag it
                        cells[B] = Cell(ratios[B], f"{ratios[B]:.2f}" + ("" if same else "*"))
                    elif r.value_us is None:
                        cells[B] = Cell(None, r.cell())
                    else:  # the rows are a result, the context is not
                        cells[B] = Cell(None, "ctx " + c.cell())
                largest, verdict = threshold_verdict(ratios, self.threshold)
                # the context's measurements count where the rows were measured (the ratio needs both)
                both = rms if all(r.status == ms.UNAVAILABLE for r in rms) else cms + rms
                parity, failed = row_parity(both)
                t.rows.append(Row(f"{base.heads} D={base.head_dim} L={fmt_len(base.context)} {label}",
                                  [base.heads, str(base.head_dim), fmt_len(base.context), label], cells,
                                  [largest, verdict], parity, timing_notes(both), failed, group=label))


# ---- (c) hybrid --------------------------------------------------------------------------------------------
@dataclass
class HybridSpec:
    """The hybrid Triton kernel against the context and decode-row lowerings, us per call."""

    base: Shape
    batches: tuple[int, ...]
    lowerings: list[Lowering]
    reference: str = "hybrid_paged"
    context_note: str = ""
    id: str = "hybrid"

    def count(self, env: ms.BenchEnv) -> int:
        return sum(_available(lw, env.device) for lw in self.lowerings) * len(self.batches)

    def empty(self, timing: str) -> Table:
        b = self.base
        return Table(self.id, f"hybrid_paged vs context and decode rows, us per call ({b.heads} heads, D={b.head_dim}, "
                     f"K={b.block} (R={b.block * b.group} query rows), L={b.context}, page {b.page_size}, {b.layout}"
                     f"{self.context_note}; {timing})", "us", list(self.batches), ["lowering"],
                     [f"time / {self.reference}"], y_label="us per call", complete=False,
                     notes=["The block comes dense (as the drafter produces it): each lowering's whole production "
                            "sequence is timed, the block's append into the pool included where the lowering "
                            "needs one (context, decode rows); the hybrid kernel reads it in place.",
                            f"B={self.batches[0]} is seed 003's shape."])

    def run(self, env: ms.BenchEnv, timing: str, table: Table | None = None) -> Table:
        t = table or self.empty(timing)
        cells: dict[tuple, ms.Measurement] = {}
        runs = [ms.ShapeRun(env, self.id, self.base.with_batch(B)) for B in self.batches]
        for r in runs:
            r.plan()
        try:
            for r in runs:
                for lw in self.lowerings:
                    cells[(lw.name, r.shape.batch)] = m = ms.measure_lowering(env, r, lw)
                    t.measurements.append(m)
                r.release()
                self._fold(t, cells)
        finally:
            env.pools.release()
        return t

    def _fold(self, t: Table, cells: dict) -> None:
        t.rows = []
        ref = {B: cells[(self.reference, B)].value_us for B in self.batches if (self.reference, B) in cells}
        for lw in self.lowerings:
            mss = [cells[(lw.name, B)] for B in self.batches if (lw.name, B) in cells]
            ratios = [m.value_us / ref[m.shape.batch] for m in mss
                      if m.value_us is not None and ref.get(m.shape.batch)]
            rel = "-" if not ratios else (f"{min(ratios):.2f}x" if len(ratios) == 1 or min(ratios) == max(ratios)
                                          else f"{min(ratios):.2f}-{max(ratios):.2f}x")
            parity, failed = row_parity(mss)
            t.rows.append(Row(lw.name, [lw.name], {m.shape.batch: cell_from(m) for m in mss}, [rel], parity,
                              timing_notes(mss), failed))
