"""`dflash-parity gate`: compare a new report with a baseline and decide whether a merge may land.

It fails when a lowering that was checked disappears or stops being checked (unavailable now), when
a case class that passed now fails, when a lowering that passed now fails, or when a lowering's worst
error margin grows by more than `[gate] max_margin_growth` of the tolerance. It writes a Markdown
diff fit for a pull-request comment.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from oracle.errors import InvalidInput
from parity.report import SCHEMA, SCHEMA_VERSION


@dataclass
class GateResult:
    passed: bool
    problems: list[str] = field(default_factory=list)
    markdown: str = ""


def load_report(path: str | Path, what: str) -> dict[str, Any]:
    p = Path(path)
    if p.is_dir():
        p = p / "parity.json"
    if not p.is_file():
        raise InvalidInput(f"{what} {path}", "no parity.json there (give a report directory or its parity.json)")
    try:
        data = json.loads(p.read_text())
    except json.JSONDecodeError as err:
        raise InvalidInput(f"{what} {p}", f"not valid JSON ({err.msg} at line {err.lineno})") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise InvalidInput(f"{what} {p}", f"not a dflash-parity report (schema {SCHEMA!r})")
    if data.get("version") != SCHEMA_VERSION:
        raise InvalidInput(f"{what} {p}", f"report version {data.get('version')!r}; this gate reads version {SCHEMA_VERSION}")
    return data


def _margin(v: dict[str, Any]) -> float:
    m = v.get("worst_margin", 0.0)
    return float("inf") if m == "inf" else float(m)


def gate(baseline: dict[str, Any], new: dict[str, Any], *, max_margin_growth: float) -> GateResult:
    problems: list[str] = []
    rows = ["| lowering | before | after | worst margin before -> after | change |", "|---|---|---|---|---|"]
    old_l, new_l = baseline["lowerings"], new["lowerings"]
    for name in sorted(set(old_l) | set(new_l)):
        o, n = old_l.get(name), new_l.get(name)
        if n is None:
            problems.append(f"`{name}` disappeared: the baseline checked it, the new report does not have it")
            rows.append(f"| `{name}` | {o['status']} | missing | - | **removed** |")
            continue
        if o is None:
            rows.append(f"| `{name}` | - | {n['status']} | - -> {_margin(n):.2f} | new |")
            if n["status"] == "fail":
                problems.append(f"`{name}` is new and fails")
            continue
        change = ""
        if o["status"] != "unavailable" and n["status"] == "unavailable":
            problems.append(f"`{name}` stopped being checked: {n.get('reason', '')}")
            change = "**no longer checked**"
        elif o["status"] == "pass" and n["status"] == "fail":
            problems.append(f"`{name}` passed in the baseline and fails now")
            change = "**now fails**"
        for cls, c in n.get("classes", {}).items():
            oc = o.get("classes", {}).get(cls)
            if oc and oc["failed"] == 0 and c["failed"] > 0:
                problems.append(f"`{name}`: case class `{cls}` passed in the baseline and now fails ({c['failed']} case(s))")
        mo, mn = _margin(o), _margin(n)
        if o["status"] == "pass" and n["status"] == "pass" and mn - mo > max_margin_growth:
            problems.append(f"`{name}`: worst error margin grew from {mo:.2f} to {mn:.2f} of the tolerance "
                            f"(+{mn - mo:.2f} > {max_margin_growth:g}); worst ulp {o.get('worst_ulp', 0):.2f} -> {n.get('worst_ulp', 0):.2f}")
            change = change or "**margin grew**"
        rows.append(f"| `{name}` | {o['status']} | {n['status']} | {mo:.2f} -> {mn:.2f} | {change or 'ok'} |")
    passed = not problems
    md = [f"## dflash-parity gate: {'PASS' if passed else 'FAIL'}", ""]
    if problems:
        md += [f"- {p}" for p in problems] + [""]
    md += rows
    md += ["", f"margin = worst error / tolerance; the gate allows growth up to {max_margin_growth:g}."]
    return GateResult(passed, problems, "\n".join(md) + "\n")
