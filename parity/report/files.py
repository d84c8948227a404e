"""Reports of a `check` run: `parity.json` (versioned schema), `junit.xml`, `summary.md`, one
`failures/<lowering>-<n>.json` per shrunk failure, and the terminal table. Every file is written
atomically (a temporary file renamed into place), so a crash never leaves half a report; `parity.json`,
the verdict, is written last, so a run that fails to write the others (a full disk) leaves none.
A serial run of several lowerings writes each finished lowering's failure files and `parity.partial.json`
(the report so far, marked partial: never a verdict) before the next lowering starts (`write_progress`).

A failure file (`failures/<lowering>-<n>.json`, `<lowering>` one-to-one with the name:
`parity.report.file_names.lowering_stem`) stands on its own: `{"lowering", "device", "shrunk",
"failures", "case", "figures" (the failing case's main comparison, {} for a crash), "plugins": [{"path",
"sha256"}] (the plugin file that registered the lowering; `repro` loads it again), "replay": the exact
command}`.

`parity.json` schema (version 2; version 1 lacked everything from `run_id` to `verdict`):

    {"schema": "dflash-parity/report", "version": 2, "created": ISO-8601 (= finished), "device": str,
     "profile": str, "torch": str, "tolerances": path,
     "run_id": hex, "started": ISO-8601, "finished": ISO-8601,
     "verdict": "pass"|"fail"|"interrupted"|"nothing judged" (parity.report.provenance.verdict_of),
     "git": {"commit": sha, "dirty": bool}|null,
     "settings": {"lowerings": [NAME], "device", "device_name", "profile", "seed", "derandomized",
        "max_examples", "hardening": bool, "isolation": bool, "case_timeout", "kernel_names_every",
        "limits": [str], "jobs", "shards": [str], "warm_up", "allow_loose_bounds", "allow_nothing_judged", "threads",
        "yardstick",
        "shard": "I/S" (optional: --shard), "flaky_runs": int (optional)},
     "merged_from": [{"report", "run_id", "shard"}] (optional: `dflash-parity merge`),
     "plugins": [{"path": str, "sha256": hex}],
     "policy": {"file": path, "sha256": hex, "max_margin_growth": float, "allow_loose_bounds": bool,
        "ceilings": {KEY: {DTYPE: float}},
        "bounds": {NAME: {DTYPE: {KEY: {"value": float, "source": TABLE, "reason": str}}}},
        "overrides": {TABLE: {"values": {KEY: float}, "reason": str, "measured_in": [str]}}},
     "lowerings": {NAME: {"status": "pass"|"fail"|"unavailable", "reason": str, "cases": int,
        "passed": int, "unsupported": int, "judged": int (cases - unsupported), "calls_checked": int,
        "seconds": float,
        "worst_margin": float, "worst_case": CASE|null, "worst_figures": {...},
        "worst_ulp": float, "worst_ulp_case": CASE|null, "worst_rel_l2": float, "worst_rel_l2_case": CASE|null,
        "compiles": {kernel: int}, "compile_families": int, "max_compiles_in_a_family": int,
        "max_compiles": int|null (the bound per shape family),
        "classes": {CLASS: {"cases": int, "failed": int}}, "notes": [str], "interrupted": true (only when a signal stopped it),
        "phase_seconds": {PHASE: float} (summed over cases; PHASE in parity.engine.outcome.PHASES; optional),
        "lse_checked": false (only when the lowering declares no LSE, `lse_base = None`: its output judged
                  alone; parity.report.lse),
        "drawn": {"context": {BUCKET: int}, "dtype": {...}, "kv_dtype": {...}, "head_dim": {...},
                  "pools_past_2^31": int, "extremes": {...}} (what was drawn, parity.engine.drawn; optional),
        "skipped": {CHECK: {"cases": int, "why": str}} (hardening steps left out for lack of device
                  memory, parity.exec.memory; optional),
        "retried": {"out of device memory": {"cases": int, "why": str}} (cases that ran out of device memory
                  beside other processes and were judged again alone, parity.engine.case_run; only when some were),
        "shards": int (optional: the lowering ran in this many shard processes, parity.exec.shards),
        "bounds": {ENTRY: {"cases": int, "why": str}} (the tolerance entries that set its cases' bounds,
                  parity.engine.policy.ToleranceSource.label, and why they applied; optional),
        "failures": [{"file": str, "shrunk": bool, "case": CASE, "failures": [str], "example": str,
                      "figures": {...} (the failing case's; optional), "replay_args": [str] (optional),
                      "runs": str ("failed k of R runs"; optional), "classification": {...} (optional,
                      parity.engine.flakiness.Classification.to_json), "sanitizer": str (optional), "slip": str
                      (optional: a shrink that slipped from this failure or to it, parity.engine.slips)}]}},
     "tolerances_unmatched": [ENTRY] (optional: tolerances.toml entries that matched no case in this run)}

CASE is a case's JSON object (oracle.case.Case.to_json_dict); CLASS is `dtype/kv_dtype/kind/layout/storage`.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import shlex
import tempfile
from pathlib import Path
from typing import Any

import torch

from parity.report import lse as lse_report
from parity.report.drawn_md import summary_lines as drawn_summary_lines
from parity.report.escape import md_code, md_text
from parity.report.file_names import check_distinct, stem_files
from parity.report.junit import junit_xml  # noqa: F401  (public here too)
from parity.engine.outcome import (LoweringReport, example_line, failure_extras, failure_filename,  # noqa: F401
                            failure_figures as _failure_figures, lowering_stem)

SCHEMA = "dflash-parity/report"
SCHEMA_VERSION = 2


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


def file_sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def plugin_records(paths) -> list[dict[str, str]]:
    """`[{"path": absolute path, "sha256": content hash}]` of plugin files (what `repro` loads back)."""
    return [{"path": str(Path(p).resolve()), "sha256": file_sha256(p)} for p in paths]


def replay_args(device: str, tolerances: str | None) -> list[str]:
    """The options `repro` needs to judge a failure as `check` did (the plugin is in the file itself)."""
    return ["--device", device] + (["--tolerances", str(Path(tolerances).resolve())] if tolerances else [])


def replay_command(failure_path: str | Path, args: list[str] | None = None) -> str:
    """`dflash-parity repro FILE --device cpu ...`, quoted for a shell."""
    return shlex.join(["dflash-parity", "repro", str(failure_path)] + list(args or []))


def to_json(reports: list[LoweringReport], *, device: str, profile: str, tolerances: str,
            replay: list[str] | None = None, header: dict[str, Any] | None = None,
            family_counts: bool = False) -> dict[str, Any]:
    """Report data; `header` (parity.report.provenance.run_header) adds what the run checked; `replay`: the
    options each failure's replay command needs (`replay_args`); `family_counts`: each entry keeps its
    per-family compile counts (a report that is one shard of a run, for `dflash-parity merge`)."""
    out: dict[str, Any] = {
        "schema": SCHEMA, "version": SCHEMA_VERSION,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "device": device, "profile": profile, "torch": torch.__version__, "tolerances": tolerances,
    }
    out.update(header or {})
    out["lowerings"] = {r.lowering: r.to_json(replay, family_counts=family_counts) for r in reports}
    return out


def note_unmatched(data: dict[str, Any], entries: list[str]) -> list[str]:
    """Record in `data` (and return) the tolerance entries no case of this run's lowerings used. An entry
    used by some case is listed in some lowering's `bounds` label (`a + b` when several applied)."""
    used: set[str] = set()
    for v in data.get("lowerings", {}).values():
        for label in v.get("bounds", {}):
            used.update(label.split(" + "))
    unmatched = [e for e in entries if e not in used]
    data["tolerances_unmatched"] = unmatched
    return unmatched


def unmatched_line(source: str, entry: str) -> str:
    return f"{Path(source).name}: {entry} matched no case in this run"


def write_failure_files(report_dir: str | Path, reports: list[LoweringReport], *, device: str,
                        replay: list[str] | None = None, plugins: dict[str, list[dict[str, str]]] | None = None) -> None:
    """Each report's `failures/<stem>-<n>.json` (see the module docstring), after removing the lowering's
    failure files of an earlier run (they were replayed first; this run writes its own)."""
    d = Path(report_dir)
    check_distinct([r.lowering for r in reports], "--lowering")
    for r in reports:
        for old in stem_files(d / "failures", lowering_stem(r.lowering)):
            old.unlink()
        for n, f in enumerate(r.failures, 1):
            path = d / "failures" / failure_filename(r.lowering, n)
            payload = {"lowering": r.lowering, "device": device, "shrunk": f.shrunk,
                       "failures": f.outcome.failures, "case": f.outcome.case.to_json_dict(),
                       "figures": _failure_figures(f.outcome), "plugins": (plugins or {}).get(r.lowering, []),
                       "replay": replay_command(path, replay), **failure_extras(f)}
            atomic_write(path, dumps(payload) + "\n")


PARTIAL_NAME = "parity.partial.json"


def write_progress(report_dir: str | Path, reports: list[LoweringReport], *, device: str, profile: str,
                   tolerances: str, replay: list[str] | None = None,
                   plugins: dict[str, list[dict[str, str]]] | None = None) -> None:
    """The lowerings finished so far: their failure files and `parity.partial.json` (marked partial, never
    a verdict), so that a crash of this process in the next lowering loses none of them."""
    d = Path(report_dir)
    write_failure_files(d, reports, device=device, replay=replay, plugins=plugins)
    data = to_json(reports, device=device, profile=profile, tolerances=tolerances, replay=replay)
    data["partial"] = "the run was still going (or died) after these lowerings: not a verdict"
    atomic_write(d / PARTIAL_NAME, dumps(data) + "\n")


def write_reports(report_dir: str | Path, reports: list[LoweringReport], *, device: str, profile: str,
                  tolerances: str, part: Path | None = None, amend_part=None, replay: list[str] | None = None,
                  plugins: dict[str, list[dict[str, str]]] | None = None,
                  header: dict[str, Any] | None = None, policy_entries: list[str] | None = None,
                  family_counts: bool = False) -> dict[str, Any]:
    """Failure files (the lowerings' old ones removed), then `junit.xml`, `summary.md` and `parity.json`
    (stamped with its verdict, `parity.report.provenance.finish`); with `part` (a `--jobs` child), the failure
    files and the report data at `part` only (parity.exec.jobs merges the parts), each entry passed through
    `amend_part(entry) -> entry` first when given (a shard's, `parity.exec.shards`). `replay`:
    `replay_args(...)`; `plugins`: lowering -> `plugin_records`; `header`: `parity.report.provenance.run_header`;
    `policy_entries` (`Policy.entry_names()`): those no case used are listed (`note_unmatched`), not in a part."""
    from parity.report.provenance import finish

    d = Path(report_dir)
    data = to_json(reports, device=device, profile=profile, tolerances=tolerances, replay=replay, header=header,
                   family_counts=family_counts)
    if policy_entries is not None and part is None:
        note_unmatched(data, policy_entries)
    write_failure_files(d, reports, device=device, replay=replay, plugins=plugins)
    if part is not None:
        if amend_part is not None:
            data["lowerings"] = {k: amend_part(v) for k, v in data["lowerings"].items()}
        atomic_write(Path(part), dumps(data) + "\n")
        return data
    write_merged(d, finish(data, interrupted=any(r.interrupted for r in reports)))
    return data


def write_merged(report_dir: str | Path, data: dict[str, Any]) -> None:
    """`junit.xml`, `summary.md`, then `parity.json` (the verdict, last) from report data (one run's, or
    merged parts); the run's `parity.partial.json`, if any, goes."""
    d = Path(report_dir)
    atomic_write(d / "junit.xml", junit_xml(data))
    atomic_write(d / "summary.md", summary_md(data, report_dir=d))
    atomic_write(d / "parity.json", dumps(data) + "\n")
    (d / PARTIAL_NAME).unlink(missing_ok=True)


def _short_case(cj: dict[str, Any] | None) -> str:
    if not cj:
        return "-"
    w = cj["window"]
    return (f"B={cj['batch_size']} L={cj['context_lens'][:4]}{'...' if len(cj['context_lens']) > 4 else ''} "
            f"K={cj['block_size']} {cj['num_q_heads']}/{cj['num_kv_heads']} D={cj['head_dim']} "
            f"{cj['dtype']}{'/' + cj['kv_dtype'] if cj['kv_dtype'] != cj['dtype'] else ''} w={tuple(w)}")


def _stopped_with_nothing_failed(v: dict[str, Any]) -> bool:
    """A lowering entry a signal stopped before any case failed (its status is "fail": a partial run)."""
    return v["status"] == "fail" and bool(v.get("interrupted")) and not v["failures"]


def table_rows(data: dict[str, Any]) -> list[list[str]]:
    rows = [["lowering", "status", "cases", "fail", "unsup", "worst ulp", "worst rel L2", "margin", "calls", "compiles"]]
    for name, v in data["lowerings"].items():
        if v["status"] == "unavailable":
            rows.append([name, "unavailable", "-", "-", "-", "-", "-", "-", "-", "-"])
            continue
        ulp, rel, margin = v["worst_ulp"], v["worst_rel_l2"], v["worst_margin"]
        status = v["status"].upper() if v["status"] == "fail" else v["status"]
        if _stopped_with_nothing_failed(v) and v.get("judged"):
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


def settings_line(data: dict[str, Any]) -> str:
    """`seed None (derandomized), 60 cases per lowering, hardening on, isolation on, ...` of a v2 report."""
    st = data.get("settings", {})
    on = lambda b: "on" if b else "**off**"  # noqa: E731
    git = data.get("git") or {}
    parts = [f"seed {md_text(st.get('seed'))}{' (derandomized)' if st.get('derandomized') else ''}",
             f"max {md_text(st.get('max_examples'))} cases per lowering", f"hardening {on(st.get('hardening'))}",
             f"isolation {on(st.get('isolation'))}"]
    if st.get("limits"):
        parts.append("limits " + " ".join(md_code(x) for x in st["limits"]))
    if st.get("allow_loose_bounds"):
        parts.append("**bounds past the sanity ceilings allowed**")
    if st.get("mps"):
        parts.append(f"CUDA MPS {md_text(st['mps'])}")
    pol = data.get("policy", {})
    parts.append(f"policy {md_code(pol.get('file', '?'))} sha256 {md_text(str(pol.get('sha256', ''))[:12])}")
    if git.get("commit"):
        parts.append(f"commit {md_text(str(git['commit'])[:12])}{' (dirty)' if git.get('dirty') else ''}")
    return "; ".join(parts)


def summary_md(data: dict[str, Any], report_dir: str | Path | None = None) -> str:
    """The Markdown summary; each failure with its exact replay command (its file under `report_dir` when
    given) and its whole `@example(...)` line. Every text from a plugin or a report read back is escaped
    (`parity.report.escape`): no name, reason or message can add a heading, a row or a verdict."""
    lows = data["lowerings"]
    failed = [n for n, v in lows.items() if v["status"] == "fail"]
    head = md_text(str(data.get("verdict") or ("fail" if failed else "pass")).upper())
    lines = [f"# dflash-parity: {head}", "",
             f"device {md_code(data['device'])}, profile {md_code(data['profile'])}, torch {md_text(data['torch'])}, "
             f"{md_text(data['created'])}", ""]
    if data.get("settings"):
        lines += [settings_line(data), ""]
    if head == "NOTHING JUDGED":
        lines += ["Nothing was judged: every lowering was unavailable here or declined every case.", ""]
    rows = table_rows(data)
    lines.append("| " + " | ".join(rows[0]) + " |")
    lines.append("|" + "---|" * len(rows[0]))
    for r in rows[1:]:
        lines.append("| " + " | ".join(md_text(c, table=True) for c in r) + " |")
    lines.append("")
    lines.append("margin = worst error as a fraction of its tolerance (1.0 = at the bound).")
    lines.append("")
    code, text = md_code, md_text
    for name, v in lows.items():
        if v["status"] == "unavailable":
            lines.append(f"- {code(name)}: not run here: {text(v['reason'])}")
    for name, v in lows.items():
        if v["status"] == "pass" and v.get("cases", 0) - v.get("unsupported", 0) == 0:
            lines.append(f"- {code(name)}: judged no case: {text(v.get('reason') or 'every case drawn was unsupported')}")
    for name, v in lows.items():
        if v["status"] == "pass" and v.get("worst_case"):
            lines.append(f"- {code(name)}: worst margin {v['worst_margin']:.2f} on {text(_short_case(v['worst_case']))}")
    lines += lse_report.summary_lines(lows)
    for name, v in lows.items():
        if v.get("shards"):
            lines.append(f"- {code(name)}: checked in {text(v['shards'])} shard processes (each ran one in "
                         f"{text(v['shards'])} of the drawn cases; compile counts are per process)")
    for name, v in lows.items():
        line = phase_line(v)
        if line:
            lines.append(f"- {code(name)} time: {text(line)}")
    for name, v in lows.items():
        line = oracle_line(v)
        if line:
            lines.append(f"- {code(name)} oracle: {text(line)}")
    for name, v in lows.items():
        if v.get("bounds"):
            lines.append(f"- {code(name)} bounds: " + "; ".join(f"{code(e)} on {text(u['cases'])} case(s) "
                                                              f"({text(u['why'])})" for e, u in v["bounds"].items()))
        for check, sk in (v.get("skipped") or {}).items():
            lines.append(f"- {code(name)}: {text(check)} skipped on {text(sk['cases'])} case(s) for lack of device "
                         f"memory (first: {text(sk['why'])})")
        for _, rt in (v.get("retried") or {}).items():
            lines.append(f"- {code(name)}: judged again alone on {text(rt['cases'])} case(s) that ran out of device "
                         f"memory beside other processes (first: {text(rt['why'])})")
    for entry in data.get("tolerances_unmatched", []):
        lines.append(f"- {text(unmatched_line(data.get('tolerances') or 'tolerances.toml', entry))}")
    lines += drawn_summary_lines(lows)
    for name in failed:
        v = lows[name]
        lines += ["", f"## {code(name)} {'interrupted' if _stopped_with_nothing_failed(v) else 'failed'}", ""]
        for note in v["notes"]:
            lines.append(f"- {text(note)}")
        for fl in v["failures"]:
            lines.append(f"- shrunk case {code(fl['file'])}: {text(_short_case(fl['case']))}")
            for msg in fl["failures"]:
                lines.append(f"  - {text(msg)}")
            if fl.get("runs"):
                lines.append(f"  - re-run: {text(fl['runs'])}")
            path = Path(report_dir) / fl["file"] if report_dir is not None else fl["file"]
            lines.append(f"  - replay: {code(replay_command(path, fl.get('replay_args')))}")
            lines.append(f"  - {code(fl['example'])}")
    return "\n".join(lines) + "\n"
