"""Reports of a `check` run: `parity.json` (versioned schema), `junit.xml`, `summary.md`, one
`failures/<lowering>-<n>.json` per shrunk failure, and the terminal table. Every file is written
atomically (a temporary file renamed into place), so a crash never leaves half a report.

`parity.json` schema (version 1):

    {"schema": "dflash-parity/report", "version": 1, "created": ISO-8601, "device": str,
     "profile": str, "torch": str, "tolerances": path,
     "lowerings": {NAME: {"status": "pass"|"fail"|"unavailable", "reason": str, "cases": int,
        "passed": int, "unsupported": int, "calls_checked": int, "seconds": float,
        "worst_margin": float, "worst_case": CASE|null, "worst_figures": {...},
        "worst_ulp": float, "worst_ulp_case": CASE|null, "worst_rel_l2": float, "worst_rel_l2_case": CASE|null,
        "compiles": {kernel: int}, "compile_families": int, "max_compiles_in_a_family": int,
        "max_compiles": int|null (the bound per shape family),
        "classes": {CLASS: {"cases": int, "failed": int}}, "notes": [str],
        "phase_seconds": {PHASE: float} (summed over cases; PHASE in parity.runner.PHASES; optional),
        "drawn": {"context": {BUCKET: int}, "dtype": {...}, "kv_dtype": {...}, "head_dim": {...},
                  "pools_past_2^31": int} (what was drawn, parity.drawn; optional),
        "skipped": {CHECK: {"cases": int, "why": str}} (hardening steps left out for lack of device
                  memory, parity.memory; optional),
        "shards": int (optional: the lowering ran in this many shard processes, parity.shards),
        "failures": [{"file": str, "shrunk": bool, "case": CASE, "failures": [str], "example": str}]}}}

CASE is a case's JSON object (oracle.case.Case.to_json_dict); CLASS is `dtype/kv_dtype/kind/layout/storage`.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import tempfile
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape, quoteattr

import torch

from parity.drawn import summary_lines as drawn_summary_lines
from parity.runner import LoweringReport, _jsonable

SCHEMA = "dflash-parity/report"
SCHEMA_VERSION = 1


def atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def dumps(data: Any, indent: int = 2, _level: int = 0) -> str:
    """JSON like `json.dumps(data, indent=2)`, but a list of numbers or strings stays on one line: a
    case's context lengths and page table read as one row each (a 200-case report is 2.1 MB and
    tens of thousands of lines otherwise)."""
    pad, inner = " " * (indent * _level), " " * (indent * (_level + 1))
    if isinstance(data, dict):
        if not data:
            return "{}"
        items = [f"{inner}{json.dumps(str(k))}: {dumps(v, indent, _level + 1)}" for k, v in data.items()]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(data, (list, tuple)):
        if all(not isinstance(x, (dict, list, tuple)) for x in data):
            return json.dumps(list(data))
        return "[\n" + ",\n".join(inner + dumps(x, indent, _level + 1) for x in data) + "\n" + pad + "]"
    return json.dumps(data)


def example_line(case_json: dict[str, Any]) -> str:
    """A ready `@example(...)` line that replays a case in a hypothesis test."""
    return f"@example(case=Case.from_json_dict({json.dumps(case_json)}))"


def lowering_stem(lowering: str) -> str:
    """A lowering's name as a file name stem (its failure files are `<stem>-<n>.json`)."""
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in lowering)


def failure_filename(lowering: str, n: int) -> str:
    return f"{lowering_stem(lowering)}-{n}.json"


def to_json(reports: list[LoweringReport], *, device: str, profile: str, tolerances: str) -> dict[str, Any]:
    out: dict[str, Any] = {
        "schema": SCHEMA, "version": SCHEMA_VERSION,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "device": device, "profile": profile, "torch": torch.__version__, "tolerances": tolerances, "lowerings": {},
    }
    for r in reports:
        fails = []
        for n, f in enumerate(r.failures, 1):
            cj = f.outcome.case.to_json_dict()
            fails.append({"file": f"failures/{failure_filename(r.lowering, n)}", "shrunk": f.shrunk, "case": cj,
                          "failures": f.outcome.failures, "example": example_line(cj)})
        out["lowerings"][r.lowering] = _jsonable({
            "status": r.status, "reason": r.reason, "cases": r.cases, "passed": r.passed,
            "unsupported": r.unsupported, "calls_checked": r.calls_checked, "seconds": round(r.seconds, 3),
            "worst_margin": r.worst_margin,
            "worst_case": r.worst.case.to_json_dict() if r.worst else None,
            "worst_figures": r.worst.main.figures if r.worst and r.worst.main else {},
            "worst_ulp": r.worst_ulp, "worst_ulp_case": r.worst_ulp_case.to_json_dict() if r.worst_ulp_case else None,
            "worst_rel_l2": r.worst_rel_l2,
            "worst_rel_l2_case": r.worst_rel_l2_case.to_json_dict() if r.worst_rel_l2_case else None,
            "compiles": dict(r.compiles), "compile_families": len(r.compile_families),
            "max_compiles_in_a_family": max(r.compile_families.values(), default=0), "max_compiles": r.max_compiles,
            "classes": r.classes, "notes": list(r.extra), "failures": fails,
            "phase_seconds": {k: round(v, 3) for k, v in r.phases.items()},
            "drawn": r.drawn, "skipped": r.skipped,
        })
    return out


def write_reports(report_dir: str | Path, reports: list[LoweringReport], *, device: str, profile: str,
                  tolerances: str, part: Path | None = None, amend_part=None) -> dict[str, Any]:
    """Failure files, then `parity.json`, `junit.xml` and `summary.md`; with `part` (a `--jobs` child),
    the failure files and the report data at `part` only (parity.jobs merges the parts), each entry
    passed through `amend_part(entry) -> entry` first when given (a shard's, `parity.shards`)."""
    d = Path(report_dir)
    data = to_json(reports, device=device, profile=profile, tolerances=tolerances)
    for r in reports:
        for n, f in enumerate(r.failures, 1):
            payload = {"lowering": r.lowering, "device": device, "shrunk": f.shrunk,
                       "failures": f.outcome.failures, "case": f.outcome.case.to_json_dict()}
            atomic_write(d / "failures" / failure_filename(r.lowering, n), dumps(payload) + "\n")
    if part is not None:
        if amend_part is not None:
            data["lowerings"] = {k: amend_part(v) for k, v in data["lowerings"].items()}
        atomic_write(Path(part), dumps(data) + "\n")
        return data
    write_merged(d, data)
    return data


def write_merged(report_dir: str | Path, data: dict[str, Any]) -> None:
    """`parity.json`, `junit.xml` and `summary.md` from report data (one run's, or merged parts)."""
    d = Path(report_dir)
    atomic_write(d / "parity.json", dumps(data) + "\n")
    atomic_write(d / "junit.xml", junit_xml(data))
    atomic_write(d / "summary.md", summary_md(data))


def junit_xml(data: dict[str, Any]) -> str:
    lows = data["lowerings"]
    n_fail = sum(1 for v in lows.values() if v["status"] == "fail")
    n_skip = sum(1 for v in lows.values() if v["status"] == "unavailable")
    lines = ['<?xml version="1.0" encoding="utf-8"?>',
             f'<testsuite name="dflash-parity" tests="{len(lows)}" failures="{n_fail}" skipped="{n_skip}" errors="0">']
    for name, v in lows.items():
        attrs = f'classname="dflash-parity.{escape(data["device"])}" name={quoteattr(name)} time="{v["seconds"]}"'
        if v["status"] == "fail":
            msg = "; ".join(f for fl in v["failures"] for f in fl["failures"]) or "; ".join(v["notes"])
            lines.append(f"  <testcase {attrs}><failure message={quoteattr(msg[:500])}>{escape(msg)}</failure></testcase>")
        elif v["status"] == "unavailable":
            lines.append(f"  <testcase {attrs}><skipped message={quoteattr(v['reason'])}/></testcase>")
        else:
            lines.append(f"  <testcase {attrs}/>")
    lines.append("</testsuite>")
    return "\n".join(lines) + "\n"


def _short_case(cj: dict[str, Any] | None) -> str:
    if not cj:
        return "-"
    w = cj["window"]
    return (f"B={cj['batch_size']} L={cj['context_lens'][:4]}{'...' if len(cj['context_lens']) > 4 else ''} "
            f"K={cj['block_size']} {cj['num_q_heads']}/{cj['num_kv_heads']} D={cj['head_dim']} "
            f"{cj['dtype']}{'/' + cj['kv_dtype'] if cj['kv_dtype'] != cj['dtype'] else ''} w={tuple(w)}")


def table_rows(data: dict[str, Any]) -> list[list[str]]:
    rows = [["lowering", "status", "cases", "fail", "unsup", "worst ulp", "worst rel L2", "margin", "calls", "compiles"]]
    for name, v in data["lowerings"].items():
        if v["status"] == "unavailable":
            rows.append([name, "unavailable", "-", "-", "-", "-", "-", "-", "-", "-"])
            continue
        rows.append([name, v["status"].upper() if v["status"] == "fail" else v["status"], str(v["cases"]),
                     str(len(v["failures"])), str(v["unsupported"]), f"{v['worst_ulp']:.2f}",
                     f"{v['worst_rel_l2']:.2e}", f"{v['worst_margin']:.2f}" if isinstance(v['worst_margin'], float) else str(v['worst_margin']),
                     f"{v['calls_checked']} ok" if v["status"] == "pass" else str(v["calls_checked"]),
                     f"{v['max_compiles_in_a_family']}/{v['max_compiles']} per family" if v["max_compiles"] else "-"])
    return rows


def format_table(rows: list[list[str]]) -> str:
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
    if wall > timed and "draw" not in ph:  # merged shards carry their own draw (parity.shards)
        ph["draw"] = wall - timed
    total = max(wall, timed)
    run = v.get("cases", 0) - v.get("unsupported", 0)
    rate = f"{run / wall:.1f} cases/s; " if wall else ""
    return rate + ", ".join(f"{k} {100 * x / total:.0f}%" for k, x in sorted(ph.items(), key=lambda kv: -kv[1]))


def summary_md(data: dict[str, Any]) -> str:
    lows = data["lowerings"]
    failed = [n for n, v in lows.items() if v["status"] == "fail"]
    head = "FAIL" if failed else "PASS"
    lines = [f"# dflash-parity: {head}", "",
             f"device `{data['device']}`, profile `{data['profile']}`, torch {data['torch']}, {data['created']}", ""]
    rows = table_rows(data)
    lines.append("| " + " | ".join(rows[0]) + " |")
    lines.append("|" + "---|" * len(rows[0]))
    for r in rows[1:]:
        lines.append("| " + " | ".join(r) + " |")
    lines.append("")
    lines.append("margin = worst error as a fraction of its tolerance (1.0 = at the bound).")
    lines.append("")
    for name, v in lows.items():
        if v["status"] == "unavailable":
            lines.append(f"- `{name}`: not run here: {v['reason']}")
    for name, v in lows.items():
        if v["status"] == "pass" and v.get("worst_case"):
            lines.append(f"- `{name}`: worst margin {v['worst_margin']:.2f} on {_short_case(v['worst_case'])}")
    for name, v in lows.items():
        if v.get("shards"):
            lines.append(f"- `{name}`: checked in {v['shards']} shard processes (each ran one in {v['shards']} of the "
                         f"drawn cases; compile counts are per process)")
    for name, v in lows.items():
        line = phase_line(v)
        if line:
            lines.append(f"- `{name}` time: {line}")
    for name, v in lows.items():
        for check, sk in (v.get("skipped") or {}).items():
            lines.append(f"- `{name}`: {check} skipped on {sk['cases']} case(s) for lack of device memory "
                         f"(first: {sk['why']})")
    lines += drawn_summary_lines(lows)
    for name in failed:
        v = lows[name]
        lines += ["", f"## `{name}` failed", ""]
        for note in v["notes"]:
            lines.append(f"- {note}")
        for fl in v["failures"]:
            lines.append(f"- shrunk case `{fl['file']}`: {_short_case(fl['case'])}")
            for msg in fl["failures"]:
                lines.append(f"  - {msg}")
            lines.append(f"  - replay: `dflash-parity repro {fl['file']}`")
            lines.append(f"  - `{fl['example'][:300]}{'...' if len(fl['example']) > 300 else ''}`")
    return "\n".join(lines) + "\n"
