"""A lowering's report (`LoweringReport`), its one JSON form, and ONE merge of lowering reports.

`LoweringReport.add(other)` folds another report's tallies into this one (counts, histograms, tables,
compile families, worst figures); it is the only place those figures are merged:

- `absorb(outcome)` adds the one-case report of a judged case (`LoweringReport.of_case`);
- `LoweringReport.merged(parts)` makes one report of the parts of a lowering that ran in several
  processes (`check --shards`, pytest-xdist shard items, `check --shard I/S` on several hosts, merged
  by `dflash-parity merge`): counts and phase times add up (with each part's untimed `draw`), the worst
  figures are the worst of any part, the wall time is the slowest part's, failures and notes are kept
  (notes prefixed with their shard). Compile counts stay per process, as a deployment counts them: a
  family compiled in two parts is compiled at most `max_compiles` times in each, and the merged report
  counts the distinct families over all parts (a part entry records them under `FAMILY_KEYS`).

A report entry in `parity.json` (schema: `parity.report.files`) is `LoweringReport.to_json()`; `from_json`
reads it back (failures are kept as written). One case's outcome and a failure are `parity.engine.case_outcome`'s,
re-exported here with the failure-file names (`parity.engine.file_names`), which many modules import from here.

Public: `LoweringReport`, `merge_entries`, `FAMILY_KEYS`; re-exported: `CaseOutcome`, `Failure`, `PHASES`,
`INVALID`, `SKIPPED`, `case_class`, `jsonable`, `unjson`, `finite`, `example_line`, `failure_extras`,
`failure_figures`, `lowering_stem`, `failure_filename`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

from oracle.case import Case
from parity.engine import drawn as drawn_mod
from parity.engine.case_outcome import (  # noqa: F401  (public here too)
    INVALID, PHASES, SKIPPED, CaseOutcome, Failure, case_class, example_line, failure_extras, failure_figures, finite,
    jsonable, unjson)
from parity.engine.file_names import failure_filename, lowering_stem  # noqa: F401  (public here too)
from parity.engine.judge import Comparison

FAMILY_KEYS = "compile_family_counts"  # a part entry's {family: compilations}; merged away


# ---- one lowering -------------------------------------------------------------------------------------
def _add_counted(into: dict[str, dict[str, Any]], table: dict[str, dict[str, Any]]) -> None:
    """`{name: {"cases": n, "why": str}}` tables (bounds, skipped) summed in place: cases add up, the
    first reason stays."""
    for name, u in table.items():
        entry = into.setdefault(name, {"cases": 0, "why": u.get("why", "")})
        entry["cases"] += int(u.get("cases", 0))


def _add_drawn(into: dict[str, Any], other: dict[str, Any]) -> None:
    drawn_mod.add_into(into, other)


def _family_key(family: Any) -> str:
    return family if isinstance(family, str) else repr(family)


@dataclass
class LoweringReport:
    """Everything `check` learned about one lowering (its `parity.json` entry: `to_json`)."""

    lowering: str
    device: str
    status: str  # "pass", "fail", "unavailable"
    reason: str = ""
    cases: int = 0
    passed: int = 0
    unsupported: int = 0
    failures: list[Failure] = field(default_factory=list)
    worst: CaseOutcome | None = None
    worst_ulp: float = 0.0
    worst_ulp_case: Case | None = None
    worst_rel_l2: float = 0.0
    worst_rel_l2_case: Case | None = None
    calls_checked: int = 0
    compiles: dict[str, int] = field(default_factory=dict)
    compile_families: dict = field(default_factory=dict)  # family -> compilations seen in it
    classes: dict[str, dict[str, int]] = field(default_factory=dict)
    max_compiles: int | None = None
    seconds: float = 0.0
    extra: list[str] = field(default_factory=list)
    phases: dict[str, float] = field(default_factory=dict)  # summed over cases (see PHASES)
    interrupted: bool = False  # stopped by KeyboardInterrupt (SIGINT): a partial run, reported as a failure
    bounds: dict[str, dict[str, Any]] = field(default_factory=dict)  # entry label -> {"cases": n, "why": str}
    drawn: dict = field(default_factory=drawn_mod.new)  # histograms of what was drawn (parity.engine.drawn)
    skipped: dict = field(default_factory=dict)  # check -> {"cases": n, "why": the first case's reason}
    retried: dict = field(default_factory=dict)  # why -> {"cases": n, "why": the first case's} (judged again alone)
    shards: int = 0  # the processes it ran in, when more than one (merged parts)
    oracle: dict = field(default_factory=dict)  # precision -> cases judged against it; "worst_share" (parity.engine.golden)
    lse_checked: bool = True  # False: the lowering declares no LSE (`lse_base = NO_LSE`): its output judged alone

    @property
    def worst_margin(self) -> float:
        return self.worst.margin if self.worst else 0.0

    # -- the one merge --------------------------------------------------------------------------------
    def add(self, other: "LoweringReport", *, same_process: bool = True) -> None:
        """Fold `other`'s tallies into this report (see the module docstring). `same_process`: both
        counted compilations in one process (a family's compilations add up); else they are parts run
        in separate processes (a family's count is the most any part compiled it, and each part's wall
        time no phase timed is added as its `draw`)."""
        self.cases += other.cases
        self.passed += other.passed
        self.unsupported += other.unsupported
        self.calls_checked += other.calls_checked
        _add_drawn(self.drawn, other.drawn)
        _add_counted(self.skipped, other.skipped)
        _add_counted(self.retried, other.retried)
        _add_counted(self.bounds, other.bounds)
        _add_oracle(self.oracle, other.oracle)
        for k, v in other.phases.items():
            self.phases[k] = self.phases.get(k, 0.0) + v
        if not same_process:
            timed = sum(other.phases.values())
            if timed and other.seconds > timed:
                self.phases["draw"] = self.phases.get("draw", 0.0) + other.seconds - timed
        for fam, n in other.compile_families.items():
            old = self.compile_families.get(fam, 0)
            self.compile_families[fam] = old + n if same_process else max(old, n)
        for k, c in other.classes.items():
            cls = self.classes.setdefault(k, {"cases": 0, "failed": 0})
            cls["cases"] += c["cases"]
            cls["failed"] += c["failed"]
        for k, v in other.compiles.items():
            self.compiles[k] = self.compiles.get(k, 0) + v
        if other.worst is not None and (self.worst is None or other.worst.margin > self.worst.margin):
            self.worst = other.worst
        if other.worst_ulp_case is not None and other.worst_ulp >= self.worst_ulp:
            self.worst_ulp, self.worst_ulp_case = other.worst_ulp, other.worst_ulp_case
        if other.worst_rel_l2_case is not None and other.worst_rel_l2 >= self.worst_rel_l2:
            self.worst_rel_l2, self.worst_rel_l2_case = other.worst_rel_l2, other.worst_rel_l2_case

    @classmethod
    def of_case(cls, out: CaseOutcome, family: tuple | None = None, device: str = "") -> "LoweringReport":
        """The report of one judged case (`family`: its compile family, `parity.engine.case_run.compile_family`)."""
        rep = cls(out.lowering, device, "pass", cases=1, phases=dict(out.phases))
        drawn_mod.add(rep.drawn, out.case)
        rep.skipped = {check: {"cases": 1, "why": why} for check, why in out.skipped.items()}
        rep.retried = {key: {"cases": 1, "why": why} for key, why in out.retried.items()}
        if out.status == "unsupported":
            rep.unsupported = 1
            return rep
        if family is not None:
            rep.compile_families = {family: sum(out.compiles.values())}
        if out.bounds:
            rep.bounds = {out.bounds: {"cases": 1, "why": out.bounds_why}}
        if out.oracle:
            rep.oracle = {out.oracle["precision"]: 1, "worst_share": float(out.oracle["share"])}
        rep.classes = {case_class(out.case): {"cases": 1, "failed": int(out.status == "fail")}}
        rep.compiles = dict(out.compiles)
        rep.calls_checked = int(bool(out.expected_calls))
        if out.status != "pass":
            return rep
        rep.passed, rep.worst = 1, out
        u, r = out.figure("out_ulp", 0.0), out.figure("out_rel_l2", 0.0)
        if u is not None and u >= 0.0:
            rep.worst_ulp, rep.worst_ulp_case = u, out.case
        if r is not None and r >= 0.0:
            rep.worst_rel_l2, rep.worst_rel_l2_case = r, out.case
        return rep

    def absorb(self, out: CaseOutcome, family: tuple | None = None) -> None:
        """Count one judged case in (a SKIPPED one, another shard's, is not this report's)."""
        if out.status == SKIPPED:
            return
        self.add(LoweringReport.of_case(out, family, self.device))

    @classmethod
    def merged(cls, parts: Sequence["LoweringReport"]) -> "LoweringReport":
        """One report of a lowering's parts, run in separate processes (in shard order; see the module
        docstring). A part that did not run (unavailable) adds its notes and failures only; a failing case
        found (and shrunk) by several parts is one failure."""
        parts = list(parts)
        ran = [p for p in parts if p.status != "unavailable"]
        if not ran:
            return parts[0]
        base = max(ran, key=lambda p: p.cases)  # a part that ran (not a lost one's stub)
        out = cls(base.lowering, base.device, "fail" if any(p.status == "fail" for p in ran) else "pass",
                  reason=base.reason, max_compiles=base.max_compiles, shards=len(parts),
                  seconds=max(p.seconds for p in ran), interrupted=any(p.interrupted for p in parts),
                  lse_checked=all(p.lse_checked for p in ran))
        for p in ran:
            out.add(p, same_process=False)
        out.extra = [f"shard {n + 1}/{len(parts)}: {note}" for n, p in enumerate(parts) for note in p.extra]
        seen: list[Case] = []
        for f in (f for p in parts for f in p.failures):  # two shards that shrank to the same case: one failure
            if f.outcome.case not in seen:
                seen.append(f.outcome.case)
                out.failures.append(f)
        return out

    # -- JSON -----------------------------------------------------------------------------------------
    def to_json(self, replay: list[str] | None = None, family_counts: bool = False) -> dict[str, Any]:
        """The lowering's `parity.json` entry (`parity.report.files` gives the schema). `replay`: the options
        each failure's replay command needs (`report.replay_args`); `family_counts`: add the per-family
        compile counts (`FAMILY_KEYS`) a later merge needs (a part's entry)."""
        fails = []
        for n, f in enumerate(self.failures, 1):
            if f.saved is not None:
                fails.append(dict(f.saved))
                continue
            cj = f.outcome.case.to_json_dict()
            fails.append({"file": f"failures/{failure_filename(self.lowering, n)}", "shrunk": f.shrunk, "case": cj,
                          "failures": f.outcome.failures, "example": example_line(cj),
                          "figures": failure_figures(f.outcome), "replay_args": list(replay or []),
                          **failure_extras(f)})
        entry = {
            "status": self.status, "reason": self.reason, "cases": self.cases, "passed": self.passed,
            "unsupported": self.unsupported, "judged": self.cases - self.unsupported,
            "calls_checked": self.calls_checked, "seconds": round(self.seconds, 3),
            "worst_margin": self.worst_margin,
            "worst_case": self.worst.case.to_json_dict() if self.worst else None,
            "worst_figures": self.worst.main.figures if self.worst and self.worst.main else {},
            "worst_ulp": self.worst_ulp,
            "worst_ulp_case": self.worst_ulp_case.to_json_dict() if self.worst_ulp_case else None,
            "worst_rel_l2": self.worst_rel_l2,
            "worst_rel_l2_case": self.worst_rel_l2_case.to_json_dict() if self.worst_rel_l2_case else None,
            "compiles": dict(self.compiles), "compile_families": len(self.compile_families),
            "max_compiles_in_a_family": max(self.compile_families.values(), default=0),
            "max_compiles": self.max_compiles,
            "classes": self.classes, "notes": list(self.extra), "failures": fails,
            "phase_seconds": {k: round(v, 3) for k, v in self.phases.items()},
            "bounds": {k: dict(v) for k, v in self.bounds.items()},
            "drawn": self.drawn, "skipped": self.skipped,
        }
        if self.oracle:  # how the golden reference judged the cases (parity.engine.golden); none for a stub
            entry["oracle"] = dict(self.oracle)
        if not self.lse_checked:  # written only when false: an output-only lowering (`lse_base = NO_LSE`)
            entry["lse_checked"] = False
        if self.retried:  # written only when some case was judged again
            entry["retried"] = self.retried
        if self.shards:
            entry["shards"] = self.shards
        if self.interrupted:  # written only when true: an entry of a whole run reads as it always did
            entry["interrupted"] = True
        if family_counts:
            entry[FAMILY_KEYS] = {_family_key(k): n for k, n in self.compile_families.items()}
        return jsonable(entry)

    @classmethod
    def from_json(cls, lowering: str, entry: dict[str, Any], device: str = "", source: str = "") -> "LoweringReport":
        """A report from its `parity.json` entry (`to_json`'s inverse for every figure a merge uses; the
        failures are kept as written). Cases are read back as `Case`s (a bad one: InvalidInput naming
        `source` and the field)."""
        where = source or f"lowerings.{lowering}"

        def case(key: str) -> Case | None:
            cj = entry.get(key)
            return None if cj is None else Case.from_json_dict(cj, source=f"{where}.{key}")

        def outcome(c: Case, status: str, figures: dict[str, Any], margin: float, failures=()) -> CaseOutcome:
            comp = Comparison("output", figures=unjson(dict(figures)), margins={"margin": margin})
            return CaseOutcome(lowering, c, status, failures=list(failures), comparisons=[comp])

        rep = cls(lowering, device, str(entry.get("status", "fail")), reason=str(entry.get("reason", "")),
                  cases=int(entry.get("cases", 0)), passed=int(entry.get("passed", 0)),
                  unsupported=int(entry.get("unsupported", 0)), calls_checked=int(entry.get("calls_checked", 0)),
                  compiles={k: int(v) for k, v in (entry.get("compiles") or {}).items()},
                  classes={k: {"cases": int(c["cases"]), "failed": int(c["failed"])}
                           for k, c in (entry.get("classes") or {}).items()},
                  max_compiles=entry.get("max_compiles"), seconds=float(entry.get("seconds", 0.0)),
                  extra=[str(n) for n in entry.get("notes", [])],
                  phases={k: float(v) for k, v in (entry.get("phase_seconds") or {}).items()},
                  bounds={k: dict(v) for k, v in (entry.get("bounds") or {}).items()},
                  skipped={k: dict(v) for k, v in (entry.get("skipped") or {}).items()},
                  retried={k: dict(v) for k, v in (entry.get("retried") or {}).items()},
                  shards=int(entry.get("shards", 0) or 0), interrupted=bool(entry.get("interrupted", False)),
                  lse_checked=entry.get("lse_checked", True) is not False)
        _add_drawn(rep.drawn, entry.get("drawn") or {})
        _add_oracle(rep.oracle, entry.get("oracle") or {})
        worst = case("worst_case")
        if worst is not None:
            rep.worst = outcome(worst, "pass", entry.get("worst_figures") or {}, float(unjson(entry.get("worst_margin", 0.0))))
        rep.worst_ulp, rep.worst_ulp_case = float(unjson(entry.get("worst_ulp", 0.0))), case("worst_ulp_case")
        rep.worst_rel_l2, rep.worst_rel_l2_case = float(unjson(entry.get("worst_rel_l2", 0.0))), case("worst_rel_l2_case")
        families = entry.get(FAMILY_KEYS)
        if isinstance(families, dict):
            rep.compile_families = {str(k): int(v) for k, v in families.items()}
        else:  # not recorded (a serial run's entry): as many families, each at the recorded maximum
            most = int(entry.get("max_compiles_in_a_family", 0))
            rep.compile_families = {f"family {i}": most for i in range(int(entry.get("compile_families", 0)))}
        for i, f in enumerate(entry.get("failures") or []):
            c = Case.from_json_dict(f.get("case"), source=f"{where}.failures[{i}].case")
            out = outcome(c, "fail", f.get("figures") or {}, float(unjson((f.get("figures") or {}).get("margin", 0.0))),
                          f.get("failures") or [])
            rep.failures.append(Failure(out, shrunk=bool(f.get("shrunk")), sanitizer=str(f.get("sanitizer", "")),
                                        saved=dict(f)))
        return rep


def _add_oracle(into: dict, other: dict) -> None:
    """Fold `other`'s oracle tally (cases per precision, the worst share) into `into`."""
    for k, v in other.items():
        if k == "worst_share":
            v = float(unjson(v))
            into[k] = max(float(into.get(k, 0.0)), v) if math.isfinite(v) else v
        else:
            into[k] = int(into.get(k, 0)) + int(v)


def merge_entries(entries: Sequence[dict[str, Any]], lowering: str = "", device: str = "") -> dict[str, Any]:
    """One `parity.json` entry from the entries of a lowering's parts (in shard order):
    `LoweringReport.merged` over their `from_json`."""
    reps = [LoweringReport.from_json(lowering, e, device, source=f"{lowering} part {n + 1}")
            for n, e in enumerate(entries)]
    return LoweringReport.merged(reps).to_json()
