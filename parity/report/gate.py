"""`dflash-parity gate`: compare a new report with a baseline and decide whether a merge may land.

It compares like with like and fails closed, naming the reason. Two kinds of problem:

- never accepted: the new report is not a passing verdict (a lowering fails, the run was interrupted,
  its directory is still marked in progress), or it is not the run the caller named (`--not-before`,
  `--commit`);
- a rule of `RULES`, each accepted only explicitly (`--accept RULE`), and what was accepted is written
  in gate.md: the baseline itself did not pass; a lowering or a case class disappeared; a lowering
  judged fewer cases, or none; hardening or isolation was turned off; other settings changed; a bound
  got looser, sits past its sanity ceiling, or comes from an override without a reason; the policy under
  review changed the gate's own setting; a worst error margin grew past `max_margin_growth`; a lowering
  stopped returning the LSE the baseline checked (`parity.report.lse.dropped`).

The gate's setting (`max_margin_growth`) comes from the baseline report's recorded policy or from the
command line, never from the policy under review. Reports are schema version 2 (`parity.report.files`):
version 1 recorded neither the settings nor the policy, so it cannot be compared honestly and is refused.
Each report is input (`parity.report.read.load_report`): one whose run did not finish, or with a figure
the gate reads that is not a finite number, is refused; statuses and verdicts are recomputed from the
cases and failures (`parity.report.trust`). Text from the reports (lowering names, reasons, notes,
sources) is escaped in gate.md (`parity.report.escape`): it adds no heading, row or verdict.

Public: `RULES`, `rules_help`, `parse_accept`, `Problem`, `GateResult`, `gate`, `unfinished_result`, and
(from `parity.report.read`) `report_path`, `load_report`, `unfinished`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from oracle.errors import InvalidInput
from parity.report.escape import md_code as _c, md_text as _t  # report text in gate.md: inert
from parity.report.read import load_report, report_path, unfinished  # noqa: F401  (public here too)
from parity.report import lse as lse_report

RULES: dict[str, str] = {
    "baseline-failed": "the baseline's own verdict is not a pass (a lowering failed, the run was interrupted, or "
                       "it judged nothing): a comparison against it hides regressions",
    "lowering-removed": "a lowering of the baseline is missing from the new report, or no longer available in it",
    "class-removed": "a case class (dtype/kv_dtype/kind/layout/storage) the baseline judged has no case now",
    "fewer-cases": "a lowering judged fewer cases than in the baseline (exactly, for reproducible draws; beyond "
                   "5 sigma for random ones)",
    "nothing-judged": "a lowering (or the whole run) judged no case: every case unsupported",
    "hardening-off": "the new run checked with less hardening (--no-hardening, or kernel names profiled less often)",
    "isolation-off": "the new run ran its cases in process (--no-isolate) where the baseline isolated them",
    "settings-changed": "device, profile, seed or --limit differ from the baseline's: not like with like",
    "looser-bounds": "a bound applied to a lowering is larger than the baseline's (a new lowering: than the "
                     "baseline's defaults)",
    "loose-bounds": "a bound of the new policy is past its sanity ceiling (check --allow-loose-bounds)",
    "override-without-reason": "an override table of the new policy gives no reason",
    "gate-settings": "the policy under review changes the gate's own setting ([gate] max_margin_growth)",
    "margin-growth": "a lowering's worst error margin grew by more than max_margin_growth of its tolerance",
    "lse-dropped": "a lowering whose LSE the baseline checked returns none now (it declares lse_base None): its "
                   "output is judged alone",
}
SIGMAS = 5.0  # random draws: a drop in judged cases (or a class gone) beyond this many binomial sigmas fails
RARE = 1e-6  # random draws: a class gone fails when its absence by chance is rarer than this


def rules_help() -> str:
    """The rules as `gate --help` lists them."""
    import textwrap

    lines = [textwrap.fill(says, width=100, initial_indent=f"  {name:<24} ", subsequent_indent=" " * 27)
             for name, says in RULES.items()]
    lines += ["", "Never accepted: a failing lowering in the new report (whatever the baseline did), an interrupted",
              "or unfinished new run (its directory still marked IN_PROGRESS), a new report from before",
              "--not-before or from another --commit. Report version 1 (no recorded settings) is refused.",
              "max_margin_growth: --max-margin-growth, else the baseline report's recorded policy."]
    return "\n".join(lines)


def parse_accept(values: list[str]) -> frozenset[str]:
    """`--accept a,b --accept c` -> {a, b, c}; an unknown rule is InvalidInput naming it."""
    out = set()
    for text in values:
        for name in (x.strip() for x in text.split(",")):
            if not name:
                continue
            if name not in RULES:
                raise InvalidInput("--accept", f"unknown rule {name!r}; rules: {', '.join(RULES)}")
            out.add(name)
    return frozenset(out)


@dataclass(frozen=True)
class Problem:
    """One reason the gate fails: `rule` (a key of RULES, or None: never accepted) and the message."""

    rule: str | None
    text: str

    def __post_init__(self) -> None:
        if self.rule is not None and self.rule not in RULES:
            raise ValueError(f"unknown gate rule {self.rule!r}")

    def line(self) -> str:
        return f"**{self.rule}**: {self.text}" if self.rule else self.text


@dataclass
class GateResult:
    passed: bool
    problems: list[str] = field(default_factory=list)
    markdown: str = ""
    accepted: list[str] = field(default_factory=list)


# ---- the comparison -----------------------------------------------------------------------------------

def _margin(v: dict[str, Any]) -> float:
    m = v.get("worst_margin", 0.0)
    return float("inf") if m == "inf" else float(m)


def _judged(v: dict[str, Any]) -> int:
    return int(v.get("judged", int(v.get("cases", 0)) - int(v.get("unsupported", 0))))


def _reproducible(r: dict[str, Any]) -> bool:
    st = r["settings"]
    return bool(st.get("derandomized")) or st.get("seed") is not None


def _fewer(o: dict[str, Any], n: dict[str, Any], strict: bool) -> str | None:
    """Why `n` judged fewer cases than `o` (None if it did not): exactly, or beyond SIGMAS for random draws."""
    jo, jn, co, cn = _judged(o), _judged(n), int(o.get("cases", 0)), int(n.get("cases", 0))
    if strict:
        return f"judged {jn} case(s), the baseline {jo}" if jn < jo else None
    if cn < co:
        return f"drew {cn} case(s), the baseline {co}"
    p = jo / co if co else 0.0
    floor = p * cn - SIGMAS * math.sqrt(cn * p * (1 - p))
    return (f"judged {jn} of {cn} case(s), the baseline {jo} of {co} (random draws: more than {SIGMAS:g} sigma "
            f"below the {p * cn:.0f} expected)") if jn < floor else None


def _class_gone(cls: str, oc: int, jo: int, jn: int, strict: bool) -> str | None:
    if strict:
        return f"case class {_c(cls)} ({oc} case(s) in the baseline) has none now"
    chance = (1 - oc / jo) ** jn if jo else 1.0
    return (f"case class {_c(cls)} ({oc} of {jo} case(s) in the baseline) has none of {jn} now (chance {chance:.1e})"
            if chance < RARE else None)


def _bound_problems(name: str, ob: dict[str, Any] | None, nb: dict[str, Any], base_defaults: dict[str, Any]) -> list[Problem]:
    """looser-bounds, loose-bounds, override-without-reason for one lowering's recorded bounds."""
    from parity.engine.policy import CEILINGS, OPTIONAL_KEYS

    out: list[Problem] = []
    for dtype, keys in sorted(nb.items()):
        for key, b in sorted(keys.items()):
            val, src, why = float(b.get("value", 0.0)), str(b.get("source", "")), str(b.get("reason", "")).strip()
            at = f"{_c(name)} {_t(dtype)} {_t(key)}"
            ceiling = CEILINGS.get(key)
            if ceiling is not None and dtype in ceiling.per_dtype and val > ceiling.per_dtype[dtype]:
                out.append(Problem("loose-bounds", f"{at} = {val:g} is past the sanity ceiling "
                                                   f"{ceiling.per_dtype[dtype]:g} ({ceiling.reason}); from {_c(src)}"))
            if src.startswith("lowering.") and not why:
                out.append(Problem("override-without-reason", f"{at} = {val:g} comes from {_c(src)}, "
                                                              f"which gives no reason"))
            if ob is not None:
                old = ob.get(dtype, {}).get(key)
                against = "the baseline"
            else:
                old = base_defaults.get(dtype, {}).get(key)
                against = "the baseline's defaults (a lowering new to the gate)"
            if old is None and key in OPTIONAL_KEYS:  # a baseline that predates the key had none of it: 0
                old, against = {"value": 0.0, "source": "absent"}, against + ", where this key did not exist: 0"
            if old is not None and val > float(old.get("value", 0.0)):
                out.append(Problem("looser-bounds", f"{at} got looser: {float(old['value']):g} "
                                                    f"({against}, {_c(old.get('source', '?'))}) -> {val:g} ({_c(src)}: "
                                                    f"{_t(why or 'no reason given')})"))
    return out


def _kernel_entry_problems(po: dict[str, Any], pn: dict[str, Any], base_defaults: dict[str, Any]) -> list[Problem]:
    """looser-bounds and loose-bounds for the `[kernel."<key>".<dtype>]` entries of the new policy: they set
    the bounds of whichever cases ran that kernel (chosen per case, so no lowering's recorded bounds show
    them). Each value is compared with the same entry in the baseline, else with the baseline's defaults."""
    from parity.engine.policy import CEILINGS, OPTIONAL_KEYS

    out: list[Problem] = []
    old_over, new_over = po.get("overrides", {}), pn.get("overrides", {})
    for entry, e in sorted(new_over.items()):
        if not entry.startswith("kernel."):
            continue
        dtype = entry.rsplit(".", 1)[-1]
        before = old_over.get(entry, {}).get("values")
        for key, val in sorted((e.get("values") or {}).items()):
            ceiling = CEILINGS.get(key)
            if ceiling is not None and dtype in ceiling.per_dtype and float(val) > ceiling.per_dtype[dtype]:
                out.append(Problem("loose-bounds", f"{_c(entry)} {_t(key)} = {float(val):g} is past the sanity ceiling "
                                                   f"{ceiling.per_dtype[dtype]:g} ({ceiling.reason})"))
            if before is not None and key in before:
                old, against = float(before[key]), "the baseline's same entry"
            else:  # a new entry, or a key the baseline's entry left to the defaults
                b = base_defaults.get(dtype, {}).get(key)
                old = None if b is None else float(b.get("value", 0.0))
                against = ("the baseline's defaults (a new kernel entry)" if before is None
                           else "the baseline's defaults (a key new to this kernel entry)")
                if old is None and key in OPTIONAL_KEYS:  # a baseline that predates the key had none of it: 0
                    old, against = 0.0, against + ", where this key did not exist: 0"
            if old is not None and float(val) > old:
                out.append(Problem("looser-bounds", f"{_c(entry)} {_t(key)} got looser: {old:g} ({against}) -> "
                                                    f"{float(val):g} ({_t(e.get('reason') or 'no reason given')})"))
    return out


def _settings_problems(o: dict[str, Any], n: dict[str, Any]) -> list[Problem]:
    so, sn = o["settings"], n["settings"]
    out = []
    if so.get("hardening") and not sn.get("hardening"):
        out.append(Problem("hardening-off", "the new run used --no-hardening (no untouched-input, determinism, "
                                            "canary or output-buffer checks); the baseline was hardened"))
    ko, kn = int(so.get("kernel_names_every") or 0), int(sn.get("kernel_names_every") or 0)
    if ko and (not kn or kn > ko):
        out.append(Problem("hardening-off", f"kernel names profiled on one case in {kn or 'no'} "
                                            f"{'cases' if kn else 'case'} (--kernel-names-every {kn}); the baseline "
                                            f"one in {ko}"))
    if so.get("isolation") and not sn.get("isolation"):
        out.append(Problem("isolation-off", "the new run ran its cases in process (--no-isolate); the baseline "
                                            "isolated them"))
    for key in ("device", "profile", "seed", "derandomized"):
        if so.get(key) != sn.get(key):
            out.append(Problem("settings-changed", f"{key}: baseline {_t(repr(so.get(key)))}, new {_t(repr(sn.get(key)))}"))
    if sorted(map(str, so.get("limits", []))) != sorted(map(str, sn.get("limits", []))):
        out.append(Problem("settings-changed", f"--limit: baseline {_t(so.get('limits'))}, new {_t(sn.get('limits'))}"))
    return out


def _info(o: dict[str, Any], n: dict[str, Any]) -> list[str]:
    """What changed between the runs without failing anything: the policy file, the plugin files."""
    lines = []
    po, pn = o.get("policy", {}), n.get("policy", {})
    if po.get("sha256") != pn.get("sha256"):
        lines.append(f"policy file changed: {_c(po.get('file'))} sha256 {_t(str(po.get('sha256'))[:12])} -> "
                     f"{_c(pn.get('file'))} {_t(str(pn.get('sha256'))[:12])}")
    old_over, new_over = po.get("overrides", {}), pn.get("overrides", {})
    for entry in sorted(set(new_over) - set(old_over)):
        e = new_over[entry]
        lines.append(f"new override {_c(entry)} {_t(e.get('values'))}: {_t(e.get('reason') or 'no reason given')}")
    for entry in sorted(set(old_over) - set(new_over)):
        lines.append(f"override {_c(entry)} removed")
    hashes = lambda r: {Path(p.get("path", "?")).name: p.get("sha256") for p in r.get("plugins", [])}  # noqa: E731
    ho, hn = hashes(o), hashes(n)
    for name in sorted(set(ho) | set(hn)):
        if ho.get(name) != hn.get(name):
            lines.append(f"plugin {_c(name)}: sha256 {_t(str(ho.get(name))[:12])} -> {_t(str(hn.get(name))[:12])}")
    return lines


def _run_label(r: dict[str, Any]) -> str:
    git = r.get("git") or {}
    commit = f", commit {str(git['commit'])[:12]}{' (dirty)' if git.get('dirty') else ''}" if git.get("commit") else ""
    return _t(f"run {str(r.get('run_id', '?'))[:12]} started {r.get('started', '?')}{commit}, verdict {r.get('verdict')}")


def gate(baseline: dict[str, Any], new: dict[str, Any], *, max_margin_growth: float | None = None,
         accept: frozenset[str] = frozenset(), not_before=None, commit: str | None = None) -> GateResult:
    """Compare `new` with `baseline` (version-2 report data; see the module docstring).

    `max_margin_growth`: None takes the baseline's recorded `[gate] max_margin_growth`. `not_before`: an
    aware datetime the new run must have started at or after. `commit`: a SHA (prefix) the new run's
    checkout must be at."""
    from parity.report.provenance import parse_time

    problems: list[Problem] = []
    growth_from = "--max-margin-growth"
    if max_margin_growth is None:
        max_margin_growth = float(baseline["policy"].get("max_margin_growth", 0.25))
        growth_from = "the baseline report's policy"
    if baseline["verdict"] != "pass":
        bad = [k for k, v in baseline["lowerings"].items() if v.get("status") == "fail"]
        problems.append(Problem("baseline-failed", f"the baseline's verdict is `{baseline['verdict']}`"
                                                   + (f" (failing: {', '.join(_c(b) for b in bad)})" if bad else "")))
    if new["verdict"] == "interrupted":
        problems.append(Problem(None, "the new run was interrupted: a partial run, not a verdict"))
    elif new["verdict"] == "nothing judged":
        problems.append(Problem("nothing-judged", "the new run judged no case at all (every lowering unavailable, or "
                                                  "every case unsupported)"))
    elif new["verdict"] != "pass" and not any(v.get("status") == "fail" for v in new["lowerings"].values()):
        problems.append(Problem(None, f"the new report's verdict is `{new['verdict']}`"))
    if not_before is not None and parse_time(new["started"], "NEW started") < not_before:
        problems.append(Problem(None, f"the new report is stale: its run started {_t(new['started'])}, before "
                                      f"--not-before {not_before.isoformat()} (the run that should have written "
                                      f"it did not)"))
    if commit:
        got = str((new.get("git") or {}).get("commit") or "")
        if not got or not got.lower().startswith(commit.lower()):
            problems.append(Problem(None, f"the new report is from commit {_t(got or 'unknown (not recorded)')}, not "
                                          f"--commit {commit}"))
    for what, r in (("the new report", new), ("the baseline", baseline)):
        if r["settings"].get("shard") is not None:  # one shard's cases: a comparison would miss the others
            problems.append(Problem(None, f"{what} is shard {_t(r['settings']['shard'])} of a run split over machines: "
                                          f"merge the shards' reports first (`dflash-parity merge DIR... --report OUT`) "
                                          f"and gate the merged report"))
    problems += _settings_problems(baseline, new)
    strict = _reproducible(baseline) and _reproducible(new) and \
        baseline["settings"].get("seed") == new["settings"].get("seed")
    go, gn = baseline["policy"].get("max_margin_growth"), new["policy"].get("max_margin_growth")
    if go != gn:
        problems.append(Problem("gate-settings", f"the new policy sets [gate] max_margin_growth {gn}, the baseline "
                                                 f"{go}; the gate uses {max_margin_growth:g} ({growth_from})"))
    base_defaults = {}
    for per in baseline["policy"]["bounds"].values():  # any lowering's bounds sourced from the defaults
        for dtype, keys in per.items():
            for key, b in keys.items():
                if str(b.get("source", "")).startswith("defaults."):
                    base_defaults.setdefault(dtype, {})[key] = b

    problems += _kernel_entry_problems(baseline["policy"], new["policy"], base_defaults)

    rows = ["| lowering | before | after | judged before -> after | worst margin before -> after | change |",
            "|---|---|---|---|---|---|"]
    old_l, new_l = baseline["lowerings"], new["lowerings"]
    for name in list(old_l) + [k for k in new_l if k not in old_l]:
        o, n = old_l.get(name), new_l.get(name)
        if n is None:
            problems.append(Problem("lowering-removed", f"{_c(name)} disappeared: the baseline checked it "
                                                        f"({o.get('status')}), the new report does not have it"))
            rows.append(f"| {_c(name, table=True)} | {o['status']} | missing | {_judged(o)} -> - | - | **removed** |")
            continue
        nb = new["policy"]["bounds"].get(name)
        if n.get("status") != "unavailable" and nb is None:
            problems.append(Problem("looser-bounds", f"{_c(name)}: the new report records no bounds for it"))
        elif nb is not None:
            problems += _bound_problems(name, baseline["policy"]["bounds"].get(name) if o else None, nb, base_defaults)
        change: list[str] = []
        if n["status"] == "fail":
            failing = [c for c, v in n.get("classes", {}).items() if v.get("failed")]
            was = "new and fails" if o is None else ("passed in the baseline and fails now" if o["status"] == "pass"
                                                     else f"fails now (baseline: {o['status']})")
            problems.append(Problem(None, f"{_c(name)} {was}" + (f"; failing classes: {', '.join(map(_c, failing))}"
                                                                   if failing else "")
                                    + "".join(f"; {_t(x)}" for x in n.get("notes", [])[:2])))
            change.append("**fails**")
        if o is None:
            rows.append(f"| {_c(name, table=True)} | - | {n['status']} | - -> {_judged(n)} | - -> {_margin(n):.2f} | "
                        f"{' '.join(change) or 'new'} |")
            continue
        if o["status"] != "unavailable" and n["status"] == "unavailable":
            problems.append(Problem("lowering-removed", f"{_c(name)} stopped being checked: {_t(n.get('reason', ''))}"))
            change.append("**no longer checked**")
        elif n["status"] != "unavailable" and _judged(n) == 0:
            problems.append(Problem("nothing-judged", f"{_c(name)} judged no case ({n.get('cases', 0)} drawn, all "
                                                      f"unsupported)"))
            change.append("**judged none**")
        elif n["status"] != "unavailable":
            fewer = _fewer(o, n, strict) if o["status"] != "unavailable" else None
            if fewer:
                problems.append(Problem("fewer-cases", f"{_c(name)} {fewer}"))
                change.append("**fewer cases**")
            jo, jn = _judged(o), _judged(n)
            for cls, oc in o.get("classes", {}).items():
                if int(oc.get("cases", 0)) > 0 and int(n.get("classes", {}).get(cls, {}).get("cases", 0)) == 0:
                    gone = _class_gone(cls, int(oc["cases"]), jo, jn, strict)
                    if gone:
                        problems.append(Problem("class-removed", f"{_c(name)}: {gone}"))
                        if "**class gone**" not in change:
                            change.append("**class gone**")
        lse_gone = lse_report.dropped(o, n)
        if lse_gone:
            problems.append(Problem("lse-dropped", f"{_c(name)} {lse_gone}"))
            change.append("**LSE dropped**")
        mo, mn = _margin(o), _margin(n)
        if o["status"] == "pass" and n["status"] == "pass" and mn - mo > max_margin_growth:
            problems.append(Problem("margin-growth", f"{_c(name)}: worst error margin grew from {mo:.2f} to {mn:.2f} of "
                                                     f"the tolerance (+{mn - mo:.2f} > {max_margin_growth:g}); worst "
                                                     f"ulp {o.get('worst_ulp', 0):.2f} -> {n.get('worst_ulp', 0):.2f}"))
            change.append("**margin grew**")
        both_off = o["status"] == "unavailable" and n["status"] == "unavailable"
        rows.append(f"| {_c(name, table=True)} | {o['status']} | {n['status']} | {_judged(o)} -> {_judged(n)} | {mo:.2f} -> {mn:.2f} | "
                    f"{' '.join(change) or ('not checked in either' if both_off else 'ok')} |")

    failing = [p for p in problems if p.rule is None or p.rule not in accept]
    accepted = [p for p in problems if p.rule is not None and p.rule in accept]
    passed = not failing
    md = [f"## dflash-parity gate: {'PASS' if passed else 'FAIL'}", ""]
    if failing:
        md += [f"- {p.line()}" for p in failing] + [""]
    if accepted:
        md += [f"Accepted (`--accept {','.join(sorted({p.rule for p in accepted}))}`):", ""]
        md += [f"- {p.line()}" for p in accepted] + [""]
    md += rows
    md += ["", f"margin = worst error / tolerance; the gate allows growth up to {max_margin_growth:g} ({growth_from}).",
           f"Baseline: {_run_label(baseline)}.", f"New: {_run_label(new)}."]
    info = _info(baseline, new)
    if info:
        md += [""] + [f"- {x}" for x in info]
    return GateResult(passed, [p.line() for p in failing], "\n".join(md) + "\n", [p.line() for p in accepted])


def unfinished_result(reasons: list[str]) -> GateResult:
    """The gate's verdict when a report directory is still marked in progress: FAIL, never accepted."""
    md = ["## dflash-parity gate: FAIL", ""] + [f"- {r}" for r in reasons]
    return GateResult(False, list(reasons), "\n".join(md) + "\n")
