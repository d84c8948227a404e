"""`summary.md` of a report: the verdict, the settings, the table of lowerings, one line per fact worth a
reader's eye, then a section per failing lowering with each shrunk case, its messages, its exact replay
command and its whole `@example(...)` line.

Every text from a plugin or a report read back is escaped (`parity.report.escape`): no lowering name,
reason or message can add a heading, a row or a verdict.

Public: `summary_md`, `settings_line`, `unmatched_line`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from parity.report.drawn_md import summary_lines as drawn_summary_lines
from parity.report import lse as lse_report
from parity.report.escape import md_code as code, md_text as text
from parity.report.failure_files import replay_command
from parity.report.table import oracle_line, phase_line, short_case, stopped_with_nothing_failed, table_rows


def unmatched_line(source: str, entry: str) -> str:
    """How a tolerance entry no case used is reported."""
    return f"{Path(source).name}: {entry} matched no case in this run"


def settings_line(data: dict[str, Any]) -> str:
    """`seed None (derandomized), 60 cases per lowering, hardening on, isolation on, ...` of a v2 report."""
    st = data.get("settings", {})
    on = lambda b: "on" if b else "**off**"  # noqa: E731
    git = data.get("git") or {}
    parts = [f"seed {text(st.get('seed'))}{' (derandomized)' if st.get('derandomized') else ''}",
             f"max {text(st.get('max_examples'))} cases per lowering", f"hardening {on(st.get('hardening'))}",
             f"isolation {on(st.get('isolation'))}"]
    if st.get("limits"):
        parts.append("limits " + " ".join(code(x) for x in st["limits"]))
    if st.get("allow_loose_bounds"):
        parts.append("**bounds past the sanity ceilings allowed**")
    if st.get("mps"):
        parts.append(f"CUDA MPS {text(st['mps'])}")
    pol = data.get("policy", {})
    parts.append(f"policy {code(pol.get('file', '?'))} sha256 {text(str(pol.get('sha256', ''))[:12])}")
    if git.get("commit"):
        parts.append(f"commit {text(str(git['commit'])[:12])}{' (dirty)' if git.get('dirty') else ''}")
    return "; ".join(parts)


def _head(data: dict[str, Any], head: str) -> list[str]:
    """The title with the verdict, what ran where, the settings, and the table of lowerings."""
    lines = [f"# dflash-parity: {head}", "",
             f"device {code(data['device'])}, profile {code(data['profile'])}, torch {text(data['torch'])}, "
             f"{text(data['created'])}", ""]
    if data.get("settings"):
        lines += [settings_line(data), ""]
    if head == "NOTHING JUDGED":
        lines += ["Nothing was judged: every lowering was unavailable here or declined every case.", ""]
    rows = table_rows(data)
    lines.append("| " + " | ".join(rows[0]) + " |")
    lines.append("|" + "---|" * len(rows[0]))
    for r in rows[1:]:
        lines.append("| " + " | ".join(text(c, table=True) for c in r) + " |")
    return lines + ["", "margin = worst error as a fraction of its tolerance (1.0 = at the bound).", ""]


def _judged_lines(lows: dict[str, dict[str, Any]]) -> list[str]:
    """What ran and what did not: unavailable lowerings, those that judged no case, the worst passing case."""
    lines = []
    for name, v in lows.items():
        if v["status"] == "unavailable":
            lines.append(f"- {code(name)}: not run here: {text(v['reason'])}")
    for name, v in lows.items():
        if v["status"] == "pass" and v.get("cases", 0) - v.get("unsupported", 0) == 0:
            lines.append(f"- {code(name)}: judged no case: {text(v.get('reason') or 'every case drawn was unsupported')}")
    for name, v in lows.items():
        if v["status"] == "pass" and v.get("worst_case"):
            lines.append(f"- {code(name)}: worst margin {v['worst_margin']:.2f} on {text(short_case(v['worst_case']))}")
    return lines


def _how_lines(lows: dict[str, dict[str, Any]]) -> list[str]:
    """How each lowering was checked: shard processes, where the time went, the golden reference."""
    lines = []
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
    return lines


def _bounds_lines(name: str, v: dict[str, Any]) -> list[str]:
    """The tolerance entries that bounded a lowering, the checks skipped and the cases judged again alone."""
    lines = []
    if v.get("bounds"):
        lines.append(f"- {code(name)} bounds: " + "; ".join(f"{code(e)} on {text(u['cases'])} case(s) "
                                                          f"({text(u['why'])})" for e, u in v["bounds"].items()))
    for check, sk in (v.get("skipped") or {}).items():
        lines.append(f"- {code(name)}: {text(check)} skipped on {text(sk['cases'])} case(s) for lack of device "
                     f"memory (first: {text(sk['why'])})")
    for _, rt in (v.get("retried") or {}).items():
        lines.append(f"- {code(name)}: judged again alone on {text(rt['cases'])} case(s) that ran out of device "
                     f"memory beside other processes (first: {text(rt['why'])})")
    return lines


def _failed_section(name: str, v: dict[str, Any], report_dir: str | Path | None) -> list[str]:
    """A failing lowering's section: its notes, then each shrunk case with its messages and replay."""
    lines = ["", f"## {code(name)} {'interrupted' if stopped_with_nothing_failed(v) else 'failed'}", ""]
    for note in v["notes"]:
        lines.append(f"- {text(note)}")
    for fl in v["failures"]:
        lines.append(f"- shrunk case {code(fl['file'])}: {text(short_case(fl['case']))}")
        for msg in fl["failures"]:
            lines.append(f"  - {text(msg)}")
        if fl.get("runs"):
            lines.append(f"  - re-run: {text(fl['runs'])}")
        path = Path(report_dir) / fl["file"] if report_dir is not None else fl["file"]
        lines.append(f"  - replay: {code(replay_command(path, fl.get('replay_args')))}")
        lines.append(f"  - {code(fl['example'])}")
    return lines


def summary_md(data: dict[str, Any], report_dir: str | Path | None = None) -> str:
    """The Markdown summary of report `data` (see the module docstring); each failure's replay command names
    its file under `report_dir` when given."""
    lows = data["lowerings"]
    failed = [n for n, v in lows.items() if v["status"] == "fail"]
    lines = _head(data, text(str(data.get("verdict") or ("fail" if failed else "pass")).upper()))
    lines += _judged_lines(lows) + lse_report.summary_lines(lows) + _how_lines(lows)
    for name, v in lows.items():
        lines += _bounds_lines(name, v)
    for entry in data.get("tolerances_unmatched", []):
        lines.append(f"- {text(unmatched_line(data.get('tolerances') or 'tolerances.toml', entry))}")
    lines += drawn_summary_lines(lows)
    for name in failed:
        lines += _failed_section(name, lows[name], report_dir)
    return "\n".join(lines) + "\n"
