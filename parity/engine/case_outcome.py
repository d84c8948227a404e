"""One case's verdict (`CaseOutcome`) and a failure (`Failure`), each with its one JSON form.

A case's outcome is what `run_case` concluded (status, every failure message, every comparison's figures, the
calls and compilations seen, the bounds that applied and why, the seconds per phase, the checks skipped for lack
of device memory, the retries); an isolated worker sends it as `to_json()` and the parent reads it back with
`from_json`. Non-finite figures are written as the strings `"inf"`, `"-inf"` and `"nan"` (`jsonable`) and read
back as floats (`unjson`). `parity.engine.outcome` (a lowering's report) re-exports every public name here.

Public: `CaseOutcome`, `Failure`, `PHASES`, `INVALID`, `SKIPPED`, `case_class`, `jsonable`, `unjson`, `finite`,
`example_line`, `failure_extras`, `failure_figures`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from oracle.case import Case
from parity.engine.judge import Comparison

INVALID = "invalid"  # a case whose oracle is not finite: bad input (`parity.engine.case_run.oracle_problem`), never a verdict
SKIPPED = "skipped"  # a case another shard runs (`parity.engine.case_runners.sharded_run_case`); never reported

PHASES = ("build", "oracle", "yardstick", "lowering", "judge", "hardening", "kernel_names", "wait", "precompile")
"""Where a case's time goes (wall clock; asynchronous GPU work lands in the phase that waits for it,
usually the judge's first read of a result): building its tensors, the oracle, the yardstick, the
lowering's call, the comparisons and call/input checks, the hardening re-runs, the profiler's start and stop
around a judged call whose GPU kernel names are read (and the check of the names), and a large case's wait for
room on a GPU other processes share (the memory port's lease, `parity.engine.ports.DeviceMemory`). And, once per
lowering before its first case, the framework's kernels compiled (`parity.exec.precompile`: the compiles its
cases would otherwise pay, so counted in its time and rate)."""


# ---- JSON of figures ----------------------------------------------------------------------------------
def finite(x: float) -> float | str:
    """`x`, or `"inf"` / `"-inf"` / `"nan"` when it is not finite (JSON has no such numbers)."""
    if math.isfinite(x):
        return x
    return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")


def jsonable(x: Any) -> Any:
    """`x` with every float made JSON-safe (`finite`), through dicts, lists and tuples."""
    if isinstance(x, float):
        return finite(x)
    if isinstance(x, dict):
        return {k: jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    return x


def unjson(x: Any) -> Any:
    """The inverse of `jsonable` on one value (lists and dicts included)."""
    if isinstance(x, str) and x in ("inf", "-inf", "nan"):
        return float(x)
    if isinstance(x, dict):
        return {k: unjson(v) for k, v in x.items()}
    if isinstance(x, list):
        return [unjson(v) for v in x]
    return x


def case_class(case: Case) -> str:
    """The class a case belongs to in reports and the gate: dtype, KV dtype, layer kind, layout, storage."""
    left, right = case.window
    kind = {(-1, -1): "noncausal", (-1, 0): "causal"}.get((left, right))
    if kind is None:
        kind = "causal_swa" if right == 0 else "noncausal_swa"
    return f"{case.dtype}/{case.kv_dtype}/{kind}/{case.layout}/{case.block_storage}"


# ---- one case -----------------------------------------------------------------------------------------
@dataclass
class CaseOutcome:
    """The verdict of one case: every figure, every failure message, the calls seen."""

    lowering: str
    case: Case
    status: str  # "pass", "fail", "unsupported" (INVALID, SKIPPED: never in a report)
    failures: list[str] = field(default_factory=list)
    comparisons: list[Comparison] = field(default_factory=list)
    calls: dict[str, int] = field(default_factory=dict)
    expected_calls: dict[str, int] = field(default_factory=dict)
    compiles: dict[str, int] = field(default_factory=dict)
    observed: dict[str, int] = field(default_factory=dict)  # flashinfer calls seen (kernel identity only)
    bounds: str = ""  # the tolerance entries that set this case's bounds (ToleranceSource.label)
    bounds_why: str = ""  # why they applied (ToleranceSource.because)
    reason: str = ""
    seconds: float = 0.0
    phases: dict[str, float] = field(default_factory=dict)  # wall seconds per phase (see PHASES)
    skipped: dict[str, str] = field(default_factory=dict)  # check -> why it did not run (device memory)
    retried: dict[str, str] = field(default_factory=dict)  # why -> what happened (judged again alone after an OOM)
    oracle: dict[str, Any] = field(default_factory=dict)  # {"precision": "float32"|"float64", "share": its error
    # bound over the tightest bound applied} (`parity.engine.golden`)

    @property
    def passed(self) -> bool:
        return self.status not in ("fail", INVALID)

    @property
    def margin(self) -> float:
        return max((c.margin for c in self.comparisons), default=0.0)

    @property
    def main(self) -> Comparison | None:
        return self.comparisons[0] if self.comparisons else None

    def figure(self, key: str, default: Any = None) -> Any:
        return self.main.figures.get(key, default) if self.main else default

    def to_json(self) -> dict[str, Any]:
        return {"lowering": self.lowering, "status": self.status, "case": self.case.to_json_dict(),
                "failures": self.failures, "reason": self.reason, "margin": finite(self.margin),
                "calls": dict(self.calls), "expected_calls": dict(self.expected_calls),
                "compiles": dict(self.compiles), "observed": dict(self.observed), "bounds": self.bounds,
                "bounds_why": self.bounds_why, "seconds": round(self.seconds, 4),
                "phases": {k: round(v, 5) for k, v in self.phases.items()}, "skipped": dict(self.skipped),
                **({"retried": dict(self.retried)} if self.retried else {}),
                **({"oracle": dict(self.oracle)} if self.oracle else {}),
                "comparisons": [jsonable(c.to_json()) for c in self.comparisons]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "CaseOutcome":
        """The outcome `to_json` wrote (an isolated worker's answer): status, failures, calls, compiles,
        comparisons with their figures and margins; the case rebuilt from its JSON."""
        comps = [Comparison(c["label"], failures=list(c.get("failures", [])),
                            figures={k: unjson(v) for k, v in c.get("figures", {}).items()},
                            margins={k: float(unjson(v)) for k, v in c.get("margins", {}).items()})
                 for c in data.get("comparisons", [])]
        return cls(lowering=data["lowering"], case=Case.from_json_dict(data["case"], source="worker answer"),
                   status=data["status"], failures=list(data.get("failures", [])), comparisons=comps,
                   calls=dict(data.get("calls", {})), expected_calls=dict(data.get("expected_calls", {})),
                   compiles=dict(data.get("compiles", {})), observed=dict(data.get("observed", {})),
                   bounds=data.get("bounds", ""), bounds_why=data.get("bounds_why", ""), reason=data.get("reason", ""),
                   seconds=float(data.get("seconds", 0.0)),
                   phases={k: float(v) for k, v in data.get("phases", {}).items()},
                   skipped=dict(data.get("skipped", {})), retried=dict(data.get("retried", {})),
                   oracle={k: unjson(v) for k, v in (data.get("oracle") or {}).items()})

    def summary(self) -> str:
        if self.status == "unsupported":
            return f"unsupported: {self.reason}"
        if self.status == "pass":
            return f"pass (margin {self.margin:.2f} of tolerance)"
        return "FAIL: " + "; ".join(self.failures)


# ---- failures and their files -------------------------------------------------------------------------
@dataclass
class Failure:
    """A shrunk failing case with its outcome; what re-running it showed (`parity.engine.flakiness.Classification`,
    "failed k of R runs") and, on CUDA, what the stream sanitizer found replaying it. `saved`: the failure
    as a report entry recorded it, when it was read back from one (`LoweringReport.from_json`). `slip`: how
    it stands to a shrink that slipped from one failure to another (`parity.engine.slips`), "" when none did."""

    outcome: CaseOutcome
    shrunk: bool
    classification: Any = None
    sanitizer: str = ""
    saved: dict[str, Any] | None = None
    slip: str = ""


def example_line(case_json: dict[str, Any]) -> str:
    """A ready `@example(...)` line that replays a case in a hypothesis test."""
    return f"@example(case=Case.from_json_dict({json.dumps(case_json)}))"


def failure_figures(outcome: CaseOutcome) -> dict[str, Any]:
    """The failing case's own figures (main comparison, with its margin); {} when it crashed or raised."""
    if outcome.main is None:
        return {}
    return jsonable({**outcome.main.figures, "margin": outcome.margin})


def failure_extras(f: Failure) -> dict[str, Any]:
    """What re-running a failure showed (`runs`, `classification`), the sanitizer's report and the shrink's
    slip (`parity.engine.slips`), when known."""
    extra: dict[str, Any] = {}
    if getattr(f, "slip", ""):
        extra["slip"] = f.slip
    c = getattr(f, "classification", None)
    if c is not None:
        extra["runs"] = c.runs_line
        extra["classification"] = c.to_json()
    if getattr(f, "sanitizer", ""):
        extra["sanitizer"] = f.sanitizer
    return extra
