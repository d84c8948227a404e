"""Each lowering of the baseline and the new report compared, by small pure functions: `compare_lowering`
gives the lowering's `Problem`s (`parity.report.gate_rules`) and its row of gate.md's table.

In order, for a lowering of either report: removed (lowering-removed); its bounds in the new policy
(missing: looser-bounds; else `bound_problems`); failing now (never accepted); then, for one the baseline
has: no longer checked (lowering-removed), judged none (nothing-judged), `fewer_cases`, `class_gone`
(class-removed), LSE dropped (`parity.report.lse.dropped`), margin grown past `max_margin_growth`.
Counts compare exactly when both runs drew reproducibly with one seed (`strict`), else within binomial
spread (`SIGMAS`, `RARE`).

Public: `compare_lowering`, `Comparing`, `strict`, `fewer_cases`, `class_gone`, `margin`, `judged`,
`TABLE_HEAD`, `SIGMAS`, `RARE`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from parity.report import lse as lse_report
from parity.report.escape import md_code as _c, md_text as _t  # report text in gate.md: inert
from parity.report.gate_rules import Problem, bound_problems

SIGMAS = 5.0  # random draws: a drop in judged cases (or a class gone) beyond this many binomial sigmas fails
RARE = 1e-6  # random draws: a class gone fails when its absence by chance is rarer than this
TABLE_HEAD = ["| lowering | before | after | judged before -> after | worst margin before -> after | change |",
              "|---|---|---|---|---|---|"]
Found = list[tuple[Problem, str]]  # each problem with the mark it leaves in the table's change column


@dataclass(frozen=True)
class Comparing:
    """What every lowering's comparison shares: `strict` (both runs drew reproducibly, with one seed), the
    margin growth allowed, the baseline's bounds from its defaults (`parity.report.gate_rules.base_defaults`)."""

    strict: bool
    max_margin_growth: float
    base_defaults: dict[str, Any]


def margin(v: dict[str, Any]) -> float:
    """A lowering entry's worst error margin (`"inf"` read as infinity)."""
    m = v.get("worst_margin", 0.0)
    return float("inf") if m == "inf" else float(m)


def judged(v: dict[str, Any]) -> int:
    """The cases a lowering entry judged (drawn, minus those it declined)."""
    return int(v.get("judged", int(v.get("cases", 0)) - int(v.get("unsupported", 0))))


def _reproducible(r: dict[str, Any]) -> bool:
    st = r["settings"]
    return bool(st.get("derandomized")) or st.get("seed") is not None


def strict(baseline: dict[str, Any], new: dict[str, Any]) -> bool:
    """Whether both runs drew the same cases (reproducible draws, one seed): counts then compare exactly."""
    return _reproducible(baseline) and _reproducible(new) and \
        baseline["settings"].get("seed") == new["settings"].get("seed")


def fewer_cases(o: dict[str, Any], n: dict[str, Any], strict: bool) -> str | None:
    """Why `n` judged fewer cases than `o` (None if it did not): exactly, or beyond SIGMAS for random draws."""
    jo, jn, co, cn = judged(o), judged(n), int(o.get("cases", 0)), int(n.get("cases", 0))
    if strict:
        return f"judged {jn} case(s), the baseline {jo}" if jn < jo else None
    if cn < co:
        return f"drew {cn} case(s), the baseline {co}"
    p = jo / co if co else 0.0
    floor = p * cn - SIGMAS * math.sqrt(cn * p * (1 - p))
    return (f"judged {jn} of {cn} case(s), the baseline {jo} of {co} (random draws: more than {SIGMAS:g} sigma "
            f"below the {p * cn:.0f} expected)") if jn < floor else None


def class_gone(cls: str, oc: int, jo: int, jn: int, strict: bool) -> str | None:
    """Why a case class with `oc` of the baseline's `jo` judged cases, and none of the new `jn`, fails (None
    when its absence is within chance for random draws)."""
    if strict:
        return f"case class {_c(cls)} ({oc} case(s) in the baseline) has none now"
    chance = (1 - oc / jo) ** jn if jo else 1.0
    return (f"case class {_c(cls)} ({oc} of {jo} case(s) in the baseline) has none of {jn} now (chance {chance:.1e})"
            if chance < RARE else None)


def _bounds(name: str, o: dict[str, Any] | None, n: dict[str, Any], baseline: dict[str, Any], new: dict[str, Any],
            defaults: dict[str, Any]) -> list[Problem]:
    """The lowering's bounds in the new policy: none recorded for a lowering that ran (looser-bounds), else
    `bound_problems` against the baseline's (a new lowering: against the baseline's defaults)."""
    nb = new["policy"]["bounds"].get(name)
    if n.get("status") != "unavailable" and nb is None:
        return [Problem("looser-bounds", f"{_c(name)}: the new report records no bounds for it")]
    if nb is not None:
        return bound_problems(name, baseline["policy"]["bounds"].get(name) if o else None, nb, defaults)
    return []


def _fails(name: str, o: dict[str, Any] | None, n: dict[str, Any]) -> Found:
    """A lowering that fails in the new report (never accepted), with its failing classes and first notes."""
    if n["status"] != "fail":
        return []
    failing = [c for c, v in n.get("classes", {}).items() if v.get("failed")]
    was = "new and fails" if o is None else ("passed in the baseline and fails now" if o["status"] == "pass"
                                             else f"fails now (baseline: {o['status']})")
    return [(Problem(None, f"{_c(name)} {was}" + (f"; failing classes: {', '.join(map(_c, failing))}" if failing else "")
                     + "".join(f"; {_t(x)}" for x in n.get("notes", [])[:2])), "**fails**")]


def _classes_gone(name: str, o: dict[str, Any], n: dict[str, Any], strict: bool) -> Found:
    """class-removed for each class the baseline judged and the new run has no case of."""
    found: Found = []
    jo, jn = judged(o), judged(n)
    for cls, oc in o.get("classes", {}).items():
        if int(oc.get("cases", 0)) > 0 and int(n.get("classes", {}).get(cls, {}).get("cases", 0)) == 0:
            gone = class_gone(cls, int(oc["cases"]), jo, jn, strict)
            if gone:
                found.append((Problem("class-removed", f"{_c(name)}: {gone}"), "**class gone**"))
    return found


def _coverage(name: str, o: dict[str, Any], n: dict[str, Any], strict: bool) -> Found:
    """What the new run no longer covers: the lowering no longer checked, judging none, fewer cases, a class
    gone."""
    if o["status"] != "unavailable" and n["status"] == "unavailable":
        return [(Problem("lowering-removed", f"{_c(name)} stopped being checked: {_t(n.get('reason', ''))}"),
                 "**no longer checked**")]
    if n["status"] == "unavailable":
        return []
    if judged(n) == 0:
        return [(Problem("nothing-judged", f"{_c(name)} judged no case ({n.get('cases', 0)} drawn, all "
                                           f"unsupported)"), "**judged none**")]
    fewer = fewer_cases(o, n, strict) if o["status"] != "unavailable" else None
    found: Found = [(Problem("fewer-cases", f"{_c(name)} {fewer}"), "**fewer cases**")] if fewer else []
    return found + _classes_gone(name, o, n, strict)


def _lse_and_margin(name: str, o: dict[str, Any], n: dict[str, Any], growth: float) -> Found:
    """lse-dropped (`parity.report.lse.dropped`); margin-growth of a lowering passing in both reports."""
    found: Found = []
    lse_gone = lse_report.dropped(o, n)
    if lse_gone:
        found.append((Problem("lse-dropped", f"{_c(name)} {lse_gone}"), "**LSE dropped**"))
    mo, mn = margin(o), margin(n)
    if o["status"] == "pass" and n["status"] == "pass" and mn - mo > growth:
        found.append((Problem("margin-growth", f"{_c(name)}: worst error margin grew from {mo:.2f} to {mn:.2f} of "
                                               f"the tolerance (+{mn - mo:.2f} > {growth:g}); worst "
                                               f"ulp {o.get('worst_ulp', 0):.2f} -> {n.get('worst_ulp', 0):.2f}"),
                      "**margin grew**"))
    return found


def _change(found: Found, otherwise: str) -> str:
    """The change column: each mark once, in order, or `otherwise`."""
    return " ".join(dict.fromkeys(mark for _, mark in found)) or otherwise


def compare_lowering(name: str, baseline: dict[str, Any], new: dict[str, Any],
                     how: Comparing) -> tuple[list[Problem], str]:
    """The problems of lowering `name` (see the module docstring) and its row of gate.md's table."""
    o, n = baseline["lowerings"].get(name), new["lowerings"].get(name)
    if n is None:
        return ([Problem("lowering-removed", f"{_c(name)} disappeared: the baseline checked it "
                                             f"({o.get('status')}), the new report does not have it")],
                f"| {_c(name, table=True)} | {o['status']} | missing | {judged(o)} -> - | - | **removed** |")
    problems = _bounds(name, o, n, baseline, new, how.base_defaults)
    found = _fails(name, o, n)
    if o is None:
        row = (f"| {_c(name, table=True)} | - | {n['status']} | - -> {judged(n)} | - -> {margin(n):.2f} | "
               f"{_change(found, 'new')} |")
        return problems + [p for p, _ in found], row
    found += _coverage(name, o, n, how.strict)
    found += _lse_and_margin(name, o, n, how.max_margin_growth)
    both_off = o["status"] == "unavailable" and n["status"] == "unavailable"
    row = (f"| {_c(name, table=True)} | {o['status']} | {n['status']} | {judged(o)} -> {judged(n)} | "
           f"{margin(o):.2f} -> {margin(n):.2f} | {_change(found, 'not checked in either' if both_off else 'ok')} |")
    return problems + [p for p, _ in found], row
