"""One measurement: a lowering (or a bare merge function) on one shape, timed, with its parity verdict.

A lowering's measurement, in order: `available(device)` (else "unavailable"), the memory estimate
(else "skipped: needs X GiB"), `supports(case)` (else "unsupported"); then on the first input set one
eager `run` through `parity.engine.invocation.call_lowering` (kernel counters, exceptions turned into failures)
judged against the oracle by `parity.engine.case_run.judge_result` with the lowering's tolerance from the
policy (LSE base converted at the boundary, partials checked, no yardstick: bench does not run the
per-request SDPA), plus the declared kernel calls; then the timing (`prepare` + CUDA graphs where the
lowering has `prepare`, else `run` eagerly); then the output the timed graphs computed for the first
set is judged the same way. The verdict fails when either output or the kernel calls fail.
"""

from __future__ import annotations

import functools
import math
import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from lowerings import counters
from lowerings.protocol import Lowering, LoweringResult, optional_attribute, optional_hook
from oracle import reference
from oracle.case import Case
from oracle.inputs import Inputs
from parity.exec import memory
from parity.exec.hooks import first_line
from parity.bench import timing as tm
from parity.bench.shapes import GiB, PoolKeeper, Shape, build_sets, memory_reason, set_case
from parity.engine.policy import Policy
from parity.engine.case_run import judge_result, tolerance_for
from parity.engine.invocation import LoweringError, call_lowering
from parity.engine.outcome import CaseOutcome

OK, UNAVAILABLE, UNSUPPORTED, SKIPPED, ERROR = "ok", "unavailable", "unsupported", "skipped", "error"
FORCE_ROWS_THRESHOLD = 1 << 40  # a dispatch threshold no batch reaches: the rows form at every B


def fmt_margin(m: float | None) -> str:
    if m is None:
        return "-"
    return "inf" if not math.isfinite(m) else f"{m:.2f}"


@dataclass
class Verdict:
    """Parity of what was timed: pass/FAIL, the worst margin (error / bound) and every failure."""

    passed: bool
    margin: float | None = None
    failures: list[str] = field(default_factory=list)
    judged: str = ""  # the lowering whose output was judged (a merge row: its windowed_merge lowering)

    def text(self) -> str:
        m = f" (margin {fmt_margin(self.margin)})" if self.margin is not None else ""
        if self.passed:
            return f"pass{m}"
        return f"FAIL{m}: {self.failures[0] if self.failures else 'no reason recorded'}"

    def to_json(self) -> dict[str, Any]:
        margin = self.margin if self.margin is None or math.isfinite(self.margin) else "inf"
        return {"passed": self.passed, "margin": margin, "failures": list(self.failures), "judged": self.judged}


@dataclass
class Measurement:
    """One timed thing on one shape. `status`: ok, unavailable, unsupported, skipped, error."""

    table: str
    label: str
    shape: Shape
    status: str
    reason: str = ""
    timing: tm.Timing | None = None
    verdict: Verdict | None = None
    seconds: float = 0.0
    where: str = ""  # how progress lines and tables name the shape (default: `shape.label()`)

    @property
    def shape_label(self) -> str:
        return self.where or self.shape.label()

    @property
    def failed(self) -> bool:
        return self.status == ERROR or (self.verdict is not None and not self.verdict.passed)

    @property
    def value_us(self) -> float | None:
        """The median time, only when it is a result: measured and its verdict passed."""
        if self.status == OK and self.timing is not None and self.verdict is not None and self.verdict.passed:
            return self.timing.median_us
        return None

    def cell(self) -> str:
        """What a table cell shows when no number can: FAIL, ERROR, unsup., skip, -."""
        if self.status == ERROR:
            return "ERROR"
        if self.verdict is not None and not self.verdict.passed:
            return "FAIL"
        return {UNSUPPORTED: "unsup.", SKIPPED: "skip", UNAVAILABLE: "-"}.get(self.status, "-")

    def summary(self) -> str:
        if self.status in (UNAVAILABLE, UNSUPPORTED, SKIPPED):
            return f"{self.status}: {self.reason}"
        if self.status == ERROR:
            return f"ERROR: {self.reason}"
        t = self.timing
        head = f"{t.median_us:.1f} us ({t.describe()})" if t is not None else "not timed"
        return f"{head}, {self.verdict.text() if self.verdict else 'no verdict'}"

    def to_json(self) -> dict[str, Any]:
        return {"table": self.table, "label": self.label, "where": self.shape_label, "shape": self.shape.to_json(),
                "status": self.status,
                "reason": self.reason, "timing": self.timing.to_json() if self.timing else None,
                "verdict": self.verdict.to_json() if self.verdict else None, "seconds": round(self.seconds, 3)}


@dataclass
class BenchEnv:
    """Where and how measurements run."""

    device: str
    policy: Policy
    replays: int = 50
    warmup: int = 2
    time_cap: float = 1.0
    max_gib: float = 100.0
    l2_bytes: int = 0
    rotation_budget: int = 4 * GiB
    seed: int = 0
    progress: Callable[[Measurement], None] | None = None

    def __post_init__(self) -> None:
        self.pools = PoolKeeper(self.device, self.seed)
        self.single_set: set[str] = set()  # lowerings whose prepare() shares state across input sets

    def rotation(self, set_bytes: int) -> tuple[int, bool]:
        budget = min(self.rotation_budget, int(self.max_gib * GiB))
        return tm.rotation_sets(set_bytes, self.l2_bytes, budget)

    @property
    def flush_bytes(self) -> int:
        return 2 * self.l2_bytes

    def report(self, m: Measurement) -> None:
        if self.progress is not None:
            self.progress(m)


class ShapeRun:
    """One shape of a table: its memory verdict, rotation, set cases, input sets and oracle result,
    each computed once and only when a measurement needs it."""

    def __init__(self, env: BenchEnv, table: str, shape: Shape) -> None:
        self.env, self.table, self.shape = env, table, shape
        self.skip = memory_reason(shape, env.device, env.max_gib)
        self.n_sets, self.flush = (1, False) if self.skip else env.rotation(shape.set_bytes)
        self._cases: list[Case] | None = None
        self._sets: list[Inputs] | None = None
        self._ref: reference.OracleResult | None = None

    @property
    def pages(self) -> int:
        return self.n_sets * self.shape.set_pages

    def plan(self) -> None:
        if not self.skip:
            self.env.pools.plan(self.shape, self.pages)

    def case(self) -> Case:
        if self._cases is None:
            num_pages = max(self.pages, self.env.pools.planned.get(self.shape.pool_key, 0))
            self._cases = [set_case(self.shape, s, num_pages, seed=self.env.seed) for s in range(self.n_sets)]
        return self._cases[0]

    def sets(self) -> list[Inputs]:
        if self._sets is None:
            self.case()
            pool = self.env.pools.get(self.shape, self.pages)
            self._sets = build_sets(self.shape, pool, self._cases, seed=self.env.seed)
        return self._sets

    def ref(self) -> reference.OracleResult:
        if self._ref is None:
            self._ref = reference.attention(self.sets()[0])
        return self._ref

    def release(self) -> None:
        self._sets = None
        self._ref = None


def force_rows(lowering: Lowering) -> Lowering:
    """A copy of a dispatching decode-rows lowering (`threshold` attribute: rows when `B <= threshold`)
    that takes the rows form at every batch size; the registered object is left as it is. A lowering
    without a `threshold` is returned unchanged."""
    if optional_attribute(lowering, "threshold") is None:
        return lowering
    import copy

    forced = copy.copy(lowering)
    forced.threshold = FORCE_ROWS_THRESHOLD  # an instance attribute: shadows the class's, nothing else
    supports = forced.supports

    def supports_rows(case: Case) -> str | None:  # the reason without the forcing threshold's digits
        why = supports(case)
        if not why:
            return why
        why = re.sub(rf"; B=\d+ <= {FORCE_ROWS_THRESHOLD} takes the decode rows$", " (rows forced at every B)", why)
        return why.replace(f" <= {FORCE_ROWS_THRESHOLD}", " (rows forced)")

    forced.supports = supports_rows
    return forced


def _is_oom(err: BaseException) -> bool:
    return memory.is_out_of_memory(err) or "out of memory" in str(err).lower()


def _clear_cuda(device: str) -> None:
    if device == "cuda":
        try:
            torch.cuda.synchronize()
        except Exception:
            pass
        torch.cuda.empty_cache()


def judge(env: BenchEnv, lowering: Lowering, inputs: Inputs, result: Any, ref: reference.OracleResult,
          prefix: str = "") -> Verdict:
    """`result` of `lowering` on `inputs` against the oracle, as `parity.engine.runner` judges a case."""
    if not isinstance(result, LoweringResult):
        return Verdict(False, math.inf, [f"{prefix}returned {type(result).__name__}, expected LoweringResult"],
                       lowering.name)
    if result.out.dtype != inputs.q.dtype:
        return Verdict(False, math.inf, [f"{prefix}output dtype {result.out.dtype}, expected {inputs.q.dtype}"],
                       lowering.name)
    # The bounds of the kernels it declares (a timed replay records no calls; the eager verdict checks them).
    tol, src = tolerance_for(env.policy, lowering, inputs.case, dict(lowering.expected_calls(inputs.case)))
    comps = judge_result(lowering, inputs.case, inputs, result, ref, tol, None, bound_from=src.citations())
    failures = [prefix + f for c in comps for f in c.failures]
    return Verdict(not failures, max((c.margin for c in comps), default=0.0), failures, lowering.name)


def eager_verdict(env: BenchEnv, lowering: Lowering, inputs: Inputs, ref: reference.OracleResult) -> tuple[Verdict, Any]:
    """One `run(inputs)` judged, kernel calls included. Returns the verdict and the result (None if it raised)."""
    outcome = CaseOutcome(lowering.name, inputs.case, "pass")
    try:
        result = call_lowering(lowering, inputs, outcome)
    except LoweringError as err:
        return Verdict(False, math.inf, [str(err)], lowering.name), None
    v = judge(env, lowering, inputs, result, ref)
    msg = counters.call_mismatch(dict(lowering.expected_calls(inputs.case)), outcome.calls)
    if msg:
        v.failures.append(msg)
        v.passed = False
    return v, result


def _sets_share_state(env: BenchEnv, lowering: Lowering, sets: Sequence[Inputs], fns: Sequence[Callable[[], Any]],
                      ref: reference.OracleResult) -> bool:
    """Whether the functions prepared for several input sets share state, so that one graph per set
    cannot rotate: they return one output buffer, or the first set's function, called after every set
    was prepared, no longer matches the oracle (a later plan() rewrote index buffers it reads)."""
    first, second = fns[0](), fns[1]()
    if (isinstance(first, LoweringResult) and isinstance(second, LoweringResult)
            and first.out.untyped_storage().data_ptr() == second.out.untyped_storage().data_ptr()):
        return True
    return not judge(env, lowering, sets[0], fns[0](), ref).passed


def time_functions(env: BenchEnv, fns: Sequence[Callable[[], Any]] | None, eager: Sequence[Callable[[], Any]] | None,
                   flush: bool, note: str = "") -> tuple[tm.Timing, Any]:
    """Time device-only functions `fns` (CUDA graphs; eagerly if capture fails), else the `eager` ones
    (host work included). Returns the timing and the output of `fns[0]` as timed (None for `eager`)."""
    flush_bytes = env.flush_bytes if flush else 0
    kw = dict(replays=env.replays, warmup=env.warmup, time_cap=env.time_cap)
    if env.device == "cuda":
        if fns:
            try:
                return tm.time_cuda_graphs(fns, flush_bytes=flush_bytes, note=note, **kw)
            except tm.CaptureFailed as err:
                t = tm.time_cuda_eager(fns, flush_bytes=flush_bytes, mode="eager, no graph",
                                       note=tm.join_notes(note, f"graph capture failed: {err}"), **kw)
                return t, fns[0]()
        return tm.time_cuda_eager(eager, flush_bytes=flush_bytes, note=note, **kw), None
    if fns:
        t = tm.time_cpu(fns, **kw, note=note)
        return t, fns[0]()
    return tm.time_cpu(eager, **kw, note=tm.join_notes(note, "run() eagerly")), None


def measure_lowering(env: BenchEnv, run: ShapeRun, lowering: Lowering, label: str | None = None) -> Measurement:
    """Time `lowering` on `run`'s shape and judge it (see the module docstring). Never raises."""
    t0 = time.perf_counter()
    m = Measurement(run.table, label or lowering.name, run.shape, OK)
    try:
        ok, why = lowering.available(env.device)
        if not ok:
            m.status, m.reason = UNAVAILABLE, why
            return m
        try:
            case = run.case()
        except Exception as err:
            m.status, m.reason = ERROR, f"bench setup failed (not the lowering): {first_line(err)}"
            return m
        why = lowering.supports(case)
        if why:
            m.status, m.reason = UNSUPPORTED, why
            return m
        if run.skip:
            m.status, m.reason = SKIPPED, run.skip
            return m
        try:
            sets = run.sets()
            ref = run.ref()
        except Exception as err:
            if _is_oom(err):
                m.status, m.reason = SKIPPED, f"out of memory building the inputs or the oracle: {first_line(err)}"
            else:
                m.status, m.reason = ERROR, f"bench setup failed (not the lowering): {first_line(err)}"
            run.release()
            _clear_cuda(env.device)
            return m
        m.verdict, eager_result = eager_verdict(env, lowering, sets[0], ref)
        if eager_result is None:
            m.status, m.reason = ERROR, m.verdict.failures[0]
            return m
        del eager_result
        note, fns, flush = "", None, run.flush
        prep = optional_hook(lowering, "prepare")
        if prep is not None:
            try:
                shared = lowering.name in env.single_set
                fns = [prep(s) for s in (sets[:1] if shared else sets)]
                if len(fns) > 1 and _sets_share_state(env, lowering, sets, fns, ref):
                    env.single_set.add(lowering.name)  # seen once: later shapes go straight to one set
                    fns, shared = [prep(sets[0])], True  # the last plan is the first set's again
                if shared and len(sets) > 1:
                    flush = env.l2_bytes > 0
                    note = "prepare() shares buffers across input sets: 1 input set, L2 flushed instead of rotated"
            except Exception as err:
                note, fns = f"prepare raised {first_line(err)}; run() timed", None
        eager = [functools.partial(lowering.run, s) for s in sets]
        m.timing, timed = time_functions(env, fns, eager, flush, note)
        if timed is not None:
            tv = judge(env, lowering, sets[0], timed, ref, prefix="timed output: ")
            if not tv.passed and m.verdict.passed:
                tv.failures.append("the eager run() passed: the prepared function computes something else "
                                   "(do two prepare() calls share buffers?)")
            m.verdict = Verdict(m.verdict.passed and tv.passed, max(m.verdict.margin or 0.0, tv.margin or 0.0),
                                m.verdict.failures + tv.failures, lowering.name)
    except Exception as err:  # the lowering's prepare/run raising while timed, or a CUDA error
        if _is_oom(err):
            m.status, m.reason = SKIPPED, f"out of memory while timing: {first_line(err)}"
        else:
            m.status, m.reason = ERROR, f"{m.label} raised {first_line(err)}"
            m.verdict = Verdict(False, math.inf, [m.reason], lowering.name)
        _clear_cuda(env.device)
    finally:
        m.seconds = time.perf_counter() - t0
        env.report(m)
    return m


def measure_function(env: BenchEnv, *, table: str, label: str, shape: Shape, available: tuple[bool, str],
                     make_fns: Callable[[int], list[Callable[[], Any]]], set_bytes: int,
                     verdict: Callable[[], Verdict], where: str = "") -> Measurement:
    """Time bare device functions (one per rotating set, built by `make_fns(n_sets)`), with the parity
    verdict `verdict()` of the lowering that calls them. Never raises."""
    t0 = time.perf_counter()
    m = Measurement(table, label, shape, OK, where=where)
    try:
        ok, why = available
        if not ok:
            m.status, m.reason = UNAVAILABLE, why
            return m
        skip = memory_reason(shape, env.device, env.max_gib)
        if skip:
            m.status, m.reason = SKIPPED, skip
            return m
        m.verdict = verdict()
        n_sets, flush = env.rotation(set_bytes)
        m.timing, _ = time_functions(env, make_fns(n_sets), None, flush)
    except Exception as err:
        if _is_oom(err):
            m.status, m.reason = SKIPPED, f"out of memory: {first_line(err)}"
        else:
            m.status, m.reason = ERROR, f"{label} raised {first_line(err)}"
            m.verdict = Verdict(False, math.inf, [m.reason], m.verdict.judged if m.verdict else "")
        _clear_cuda(env.device)
    finally:
        m.seconds = time.perf_counter() - t0
        env.report(m)
    return m
