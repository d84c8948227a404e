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

The rules are small pure functions, each returning the problems it finds: the run-level ones and the
policy's in `parity.report.gate_rules`, each lowering's in `parity.report.gate_lowerings`; `gate` calls
them in a fixed order and writes gate.md.

Public: `RULES`, `rules_help`, `parse_accept`, `Problem`, `GateResult`, `gate`, `unfinished_result`, and
(from `parity.report.read`) `report_path`, `load_report`, `unfinished`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from oracle.errors import InvalidInput
from parity.report import gate_lowerings as per_lowering, gate_rules as rules
from parity.report.escape import md_code as _c, md_text as _t  # report text in gate.md: inert
from parity.report.gate_rules import RULES, Problem  # noqa: F401  (public here too)
from parity.report.read import load_report, report_path, unfinished  # noqa: F401  (public here too)


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


@dataclass
class GateResult:
    """The verdict: `passed`, the problems that fail it and those accepted (each a line of gate.md), gate.md."""

    passed: bool
    problems: list[str] = field(default_factory=list)
    markdown: str = ""
    accepted: list[str] = field(default_factory=list)


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
    """A run as gate.md names it: its id, start, commit and verdict."""
    git = r.get("git") or {}
    commit = f", commit {str(git['commit'])[:12]}{' (dirty)' if git.get('dirty') else ''}" if git.get("commit") else ""
    return _t(f"run {str(r.get('run_id', '?'))[:12]} started {r.get('started', '?')}{commit}, verdict {r.get('verdict')}")


def _growth(baseline: dict[str, Any], max_margin_growth: float | None) -> tuple[float, str]:
    """The margin growth the gate allows and where it comes from: the command line, else the baseline's
    recorded `[gate] max_margin_growth` (never the policy under review)."""
    if max_margin_growth is None:
        return float(baseline["policy"].get("max_margin_growth", 0.25)), "the baseline report's policy"
    return max_margin_growth, "--max-margin-growth"


def _footer(baseline: dict[str, Any], new: dict[str, Any], growth: float, growth_from: str) -> list[str]:
    """Under the table: the margin growth allowed and whence, the two runs, what changed without failing."""
    footer = ["", f"margin = worst error / tolerance; the gate allows growth up to {growth:g} ({growth_from}).",
              f"Baseline: {_run_label(baseline)}.", f"New: {_run_label(new)}."]
    info = _info(baseline, new)
    return footer + ([""] + [f"- {x}" for x in info] if info else [])


def _markdown(passed: bool, failing: list[Problem], accepted: list[Problem], rows: list[str], footer: list[str]) -> str:
    """gate.md: the verdict, the problems that fail it, those accepted, the table, the footer."""
    md = [f"## dflash-parity gate: {'PASS' if passed else 'FAIL'}", ""]
    if failing:
        md += [f"- {p.line()}" for p in failing] + [""]
    if accepted:
        md += [f"Accepted (`--accept {','.join(sorted({p.rule for p in accepted}))}`):", ""]
        md += [f"- {p.line()}" for p in accepted] + [""]
    return "\n".join(md + rows + footer) + "\n"


def gate(baseline: dict[str, Any], new: dict[str, Any], *, max_margin_growth: float | None = None,
         accept: frozenset[str] = frozenset(), not_before=None, commit: str | None = None) -> GateResult:
    """Compare `new` with `baseline` (version-2 report data; see the module docstring).

    `max_margin_growth`: None takes the baseline's recorded `[gate] max_margin_growth`. `not_before`: an
    aware datetime the new run must have started at or after. `commit`: a SHA (prefix) the new run's
    checkout must be at."""
    growth, growth_from = _growth(baseline, max_margin_growth)
    problems = rules.verdict_problems(baseline, new) + rules.identity_problems(new, not_before, commit) + \
        rules.shard_problems(baseline, new) + rules.settings_problems(baseline, new)
    strict = per_lowering.strict(baseline, new)
    problems += rules.gate_setting_problems(baseline, new, growth, growth_from)
    how = per_lowering.Comparing(strict, growth, rules.base_defaults(baseline))
    problems += rules.kernel_entry_problems(baseline["policy"], new["policy"], how.base_defaults)
    rows = list(per_lowering.TABLE_HEAD)
    old_l, new_l = baseline["lowerings"], new["lowerings"]
    for name in list(old_l) + [k for k in new_l if k not in old_l]:
        found, row = per_lowering.compare_lowering(name, baseline, new, how)
        problems += found
        rows.append(row)
    failing = [p for p in problems if p.rule is None or p.rule not in accept]
    accepted = [p for p in problems if p.rule is not None and p.rule in accept]
    md = _markdown(not failing, failing, accepted, rows, _footer(baseline, new, growth, growth_from))
    return GateResult(not failing, [p.line() for p in failing], md, [p.line() for p in accepted])


def unfinished_result(reasons: list[str]) -> GateResult:
    """The gate's verdict when a report directory is still marked in progress: FAIL, never accepted."""
    md = ["## dflash-parity gate: FAIL", ""] + [f"- {r}" for r in reasons]
    return GateResult(False, list(reasons), "\n".join(md) + "\n")
