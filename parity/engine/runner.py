"""Run one case through one lowering and judge it; run a lowering over a hypothesis-drawn sweep.

The machinery lives in one module per concern; this module re-exports their public names, so that
`from parity.engine.runner import run_case, check_lowering, LoweringReport` keeps working:

- `parity.engine.outcome`: the outcome model (what a case and a lowering's check concluded: `CaseOutcome`,
  `Failure`, `LoweringReport`, their statuses, their one JSON form and their one merge);
- `parity.engine.invocation`: `RunOptions`, `prepare_inputs`, `call_lowering` (the call with its kernel
  counters), `LoweringError`;
- `parity.engine.hardening`: untouched inputs, output buffers, the other canary and determinism, request
  isolation, kernel names;
- `parity.engine.case_run`: `run_case` (the unit: materialize -> oracle -> yardstick -> lowering -> judged),
  `tolerance_for`, `judge_result`, `oracle_problem`, `compile_family`;
- `parity.engine.sweep`: `check_lowering` (replays, boundary cases, the hypothesis draw and its shrinking:
  `parity.engine.search`), availability, hook failures; `parity.engine.case_runners`: the sharded, executor,
  interrupt and bad-input wrappers of `run_case`; `parity.engine.ports`: the case executor's protocol.

The outcome model imports none of the others, so it is imported here at once; the rest are resolved on
first use (PEP 562 `__getattr__`), so that importing this module stays cheap.
"""

from __future__ import annotations

import importlib
from typing import Any

from parity.engine.outcome import INVALID, PHASES, SKIPPED, CaseOutcome, Failure, LoweringReport, case_class  # noqa: F401

_REEXPORTS = {
    "parity.engine.invocation": ("LoweringError", "RunOptions", "call_lowering", "prepare_inputs"),
    "parity.engine.result_bits": ("bit_view",),
    "parity.engine.hardening": ("block_slot_mask", "differing_requests", "gpu_kernel_failures", "negate_context",
                         "output_buffer_failures", "rerun_failures", "untouched_failures"),
    "parity.engine.case_run": ("compile_family", "judge_result", "oracle_problem", "refuse_invalid",
                        "run_case", "run_yardstick", "tolerance_for"),
    "parity.engine.sweep": ("SweepSpec", "check_lowering", "hook_failure_report", "lowering_available"),
    "parity.engine.search": ("CaseFailed", "case_failures"),
    "parity.engine.sweep_report": ("compile_budget_message",),
    "parity.engine.answers": ("availability",),
    "parity.engine.case_runners": ("executor_run_case", "refusing_invalid", "sharded_run_case", "stops_on_interrupt"),
    "parity.engine.ports": ("CaseExecutor",),
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
