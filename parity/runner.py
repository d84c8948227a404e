"""Run one case through one lowering and judge it; run a lowering over a hypothesis-drawn sweep.

The machinery lives in one module per concern; this module holds the outcome model (what a case and a
lowering's check concluded: `CaseOutcome`, `Failure`, `LoweringReport`, their statuses) and re-exports
the public names of the others, so that `from parity.runner import run_case, check_lowering` keeps
working:

- `parity.invocation`: `RunOptions`, `prepare_inputs`, `call_lowering` (the call with its kernel
  counters), `LoweringError`;
- `parity.hardening`: untouched inputs, output buffers, the other canary and determinism, request
  isolation, kernel names;
- `parity.case_run`: `run_case` (the unit: materialize -> oracle -> yardstick -> lowering -> judged),
  `tolerance_for`, `judge_result`, `oracle_problem`, `compile_family`, `PHASES`;
- `parity.sweep`: `check_lowering` (replays, boundary cases, the hypothesis draw and its shrinking), the
  sharded and executor wrappers of `run_case`, availability, hook failures.

Those modules import the outcome model from here, so the re-exports are resolved on first use (PEP 562
`__getattr__`), never at import: no import circle.
"""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass, field
from typing import Any

from oracle.case import Case
from parity import drawn as drawn_mod
from parity.judge import Comparison


@dataclass
class CaseOutcome:
    """The verdict of one case: every figure, every failure message, the calls seen."""

    lowering: str
    case: Case
    status: str  # "pass", "fail", "unsupported"
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
                "failures": self.failures, "reason": self.reason, "margin": _finite(self.margin),
                "calls": dict(self.calls), "expected_calls": dict(self.expected_calls),
                "compiles": dict(self.compiles), "observed": dict(self.observed), "bounds": self.bounds,
                "bounds_why": self.bounds_why, "seconds": round(self.seconds, 4),
                "phases": {k: round(v, 5) for k, v in self.phases.items()}, "skipped": dict(self.skipped),
                "comparisons": [_jsonable(c.to_json()) for c in self.comparisons]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "CaseOutcome":
        """The outcome `to_json` wrote (an isolated worker's answer): status, failures, calls, compiles,
        comparisons with their figures and margins; the case rebuilt from its JSON."""
        comps = [Comparison(c["label"], failures=list(c.get("failures", [])),
                            figures={k: _unjson(v) for k, v in c.get("figures", {}).items()},
                            margins={k: float(_unjson(v)) for k, v in c.get("margins", {}).items()})
                 for c in data.get("comparisons", [])]
        return cls(lowering=data["lowering"], case=Case.from_json_dict(data["case"], source="worker answer"),
                   status=data["status"], failures=list(data.get("failures", [])), comparisons=comps,
                   calls=dict(data.get("calls", {})), expected_calls=dict(data.get("expected_calls", {})),
                   compiles=dict(data.get("compiles", {})), observed=dict(data.get("observed", {})),
                   bounds=data.get("bounds", ""), bounds_why=data.get("bounds_why", ""), reason=data.get("reason", ""),
                   seconds=float(data.get("seconds", 0.0)),
                   phases={k: float(v) for k, v in data.get("phases", {}).items()},
                   skipped=dict(data.get("skipped", {})))

    def summary(self) -> str:
        if self.status == "unsupported":
            return f"unsupported: {self.reason}"
        if self.status == "pass":
            return f"pass (margin {self.margin:.2f} of tolerance)"
        return "FAIL: " + "; ".join(self.failures)


def _finite(x: float) -> float | str:
    return x if math.isfinite(x) else "inf"


def _unjson(x: Any) -> Any:
    """The inverse of `_jsonable` on one value (lists and dicts included)."""
    if isinstance(x, str) and x in ("inf", "-inf", "nan"):
        return float(x)
    if isinstance(x, dict):
        return {k: _unjson(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_unjson(v) for v in x]
    return x


def _jsonable(x: Any) -> Any:
    if isinstance(x, float):
        return _finite(x) if not math.isnan(x) else "nan"
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    return x


INVALID = "invalid"  # a case whose oracle is not finite: bad input (`oracle_problem`), raised as InvalidInput

SKIPPED = "skipped"  # the status of a case another shard runs (`parity.sweep.sharded_run_case`); never reported


def case_class(case: Case) -> str:
    """The class a case belongs to in reports and the gate: dtype, KV dtype, layer kind, layout, storage."""
    left, right = case.window
    kind = {(-1, -1): "noncausal", (-1, 0): "causal"}.get((left, right))
    if kind is None:
        kind = "causal_swa" if right == 0 else "noncausal_swa"
    return f"{case.dtype}/{case.kv_dtype}/{kind}/{case.layout}/{case.block_storage}"


@dataclass
class Failure:
    """A shrunk failing case with its outcome; what re-running it showed (`parity.flakiness.Classification`,
    "failed k of R runs") and, on CUDA, what the stream sanitizer found replaying it."""

    outcome: CaseOutcome
    shrunk: bool
    classification: Any = None
    sanitizer: str = ""


@dataclass
class LoweringReport:
    """Everything `check` learned about one lowering."""

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
    drawn: dict = field(default_factory=drawn_mod.new)  # histograms of what was drawn (parity.drawn)
    skipped: dict = field(default_factory=dict)  # check -> {"cases": n, "why": the first case's reason}

    @property
    def worst_margin(self) -> float:
        return self.worst.margin if self.worst else 0.0

    def absorb(self, out: CaseOutcome, family: tuple | None = None) -> None:
        if out.status == SKIPPED:  # another shard's case: not this report's
            return
        self.cases += 1
        drawn_mod.add(self.drawn, out.case)
        for check, why in out.skipped.items():
            entry = self.skipped.setdefault(check, {"cases": 0, "why": why})
            entry["cases"] += 1
        for k, v in out.phases.items():
            self.phases[k] = self.phases.get(k, 0.0) + v
        if out.status == "unsupported":
            self.unsupported += 1
            return
        if family is not None:
            self.compile_families[family] = self.compile_families.get(family, 0) + sum(out.compiles.values())
        if out.bounds:
            used = self.bounds.setdefault(out.bounds, {"cases": 0, "why": out.bounds_why})
            used["cases"] += 1
        cls = self.classes.setdefault(case_class(out.case), {"cases": 0, "failed": 0})
        cls["cases"] += 1
        cls["failed"] += out.status == "fail"
        for k, v in out.compiles.items():
            self.compiles[k] = self.compiles.get(k, 0) + v
        if out.expected_calls:
            self.calls_checked += 1
        if out.status != "pass":
            return
        self.passed += 1
        if self.worst is None or out.margin > self.worst.margin:
            self.worst = out
        u, r = out.figure("out_ulp", 0.0), out.figure("out_rel_l2", 0.0)
        if u is not None and u >= self.worst_ulp:
            self.worst_ulp, self.worst_ulp_case = u, out.case
        if r is not None and r >= self.worst_rel_l2:
            self.worst_rel_l2, self.worst_rel_l2_case = r, out.case


_REEXPORTS = {
    "parity.invocation": ("LoweringError", "RunOptions", "call_lowering", "prepare_inputs"),
    "parity.result_bits": ("bit_view",),
    "parity.hardening": ("block_slot_mask", "differing_requests", "gpu_kernel_failures", "negate_context",
                         "output_buffer_failures", "rerun_failures", "untouched_failures"),
    "parity.case_run": ("PHASES", "compile_family", "judge_result", "oracle_problem", "refuse_invalid",
                        "run_case", "run_yardstick", "tolerance_for"),
    "parity.sweep": ("CaseExecutor", "CaseFailed", "availability", "case_failures", "check_lowering",
                     "compile_budget_message", "executor_run_case", "hook_failure_report", "lowering_available",
                     "refusing_invalid", "sharded_run_case", "stops_on_interrupt"),
}
_HOME = {name: module for module, names in _REEXPORTS.items() for name in names}


def __getattr__(name: str) -> Any:
    """A re-exported name, imported from its module on first use (see the module docstring)."""
    module = _HOME.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOME))
