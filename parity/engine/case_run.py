"""One case through one lowering, judged: `run_case`.

materialize -> oracle -> yardstick (`parity.engine.yardstick`) -> lowering (counted, inputs snapshotted; on CUDA, one case in
`--kernel-names-every` profiled around this very call) -> bounds chosen from what ran (`tolerance_for`) -> LSE
converted at the adapter boundary -> judged (output, LSE, each partial, kernel calls, untouched inputs, output
buffers) -> hardening (the other canary, determinism, request isolation: `parity.engine.hardening`) -> the profiled
call's kernel names, when nothing failed before them (`parity.engine.hardening.KernelNames`). A case whose oracle is not
finite is bad input (`oracle_problem`, `INVALID`), never a pass.
"""

from __future__ import annotations

from collections.abc import Callable
import math
import time

import torch

from lowerings import counters
from lowerings.protocol import Lowering, LoweringResult, accuracy_claims, lse_to_natural, optional_hook
from oracle import reference
from oracle.case import Case
from oracle.errors import InvalidInput
from oracle.inputs import Inputs
from parity.engine import answers
from oracle import footprint
from lowerings import calls as hooks
from parity.engine import ports
from parity.engine.device_memory import RERUN, RETRIED_OOM, UNTOUCHED, YARDSTICK
from parity.engine.hardening import KernelNames, output_buffer_failures, rerun_failures, untouched_failures
from parity.engine.invocation import LoweringError, RunOptions, call_lowering, prepare_inputs
from parity.engine.golden import GoldenOracle
from parity.engine.judge import Comparison, compare
from parity.engine.policy import Policy, Tolerance, ToleranceSource
from parity.engine.yardstick import BUILT_IN as BUILT_IN_YARDSTICKS
from parity.engine.outcome import INVALID, PHASES, CaseOutcome  # noqa: F401  (PHASES: re-exported)

phase_barrier: Callable[[], None] | None = None
"""Called at the end of every phase when set (`lab/gpu_phase_profile.py` sets `torch.cuda.synchronize`, so
that a phase's wall seconds include the device work it queued rather than leaving it to the next phase)."""

phase_observer: Callable[["CaseOutcome", str, float], None] | None = None
"""Called after every phase block when set, with the case's outcome, the phase and the block's wall seconds (after
`phase_barrier`): a measurement script's per-case time line (`lab/gpu_phase_profile.py`)."""

around_case: Callable[[Callable[[], "CaseOutcome"], Case, "RunOptions"], "CaseOutcome"] | None = None
"""When set, `run_case` hands it the case's judged run as a call (after `supports` and the device lease): it must
call it once and return its outcome. For measurements around a whole case (`lab/gpu_phase_profile.py`: the
device memory a case peaks at)."""


class _Phase:
    """`with _Phase(outcome, "oracle"): ...` adds the block's wall seconds to `outcome.phases`."""

    def __init__(self, outcome: "CaseOutcome", name: str) -> None:
        self.outcome, self.name = outcome, name

    def __enter__(self) -> None:
        self.t0 = time.perf_counter()

    def __exit__(self, *exc) -> None:
        if phase_barrier is not None:
            phase_barrier()
        dt = time.perf_counter() - self.t0
        self.outcome.phases[self.name] = self.outcome.phases.get(self.name, 0.0) + dt
        if phase_observer is not None:
            phase_observer(self.outcome, self.name, dt)


def run_yardstick(yardstick, inputs: Inputs, opts: RunOptions, outcome: CaseOutcome,
                  oracle_out: torch.Tensor | None = None):
    """The yardstick's output `[B, K, Hq, D]`, or None, with the reason in `outcome.skipped`, when its working
    set does not fit. The default (`parity.engine.yardstick.WorkingDtype`, and `RoundedOracle`) attends once more in the
    working dtype's order (the rounded oracle: rounds `oracle_out` where it can). A lowering as the yardstick: one that
    declares `reads_inputs_only` (`sdpa`: checked as a lowering, its untouched-input check passes) runs on the
    inputs themselves; any other on a copy of them, or on the inputs when a copy does not fit."""
    case = inputs.case
    memory = ports.current().memory
    if getattr(yardstick, "name", None) in BUILT_IN_YARDSTICKS:  # by name: a reloaded module makes another class
        if not memory.fits(outcome, YARDSTICK, case, opts, footprint.working_dtype_bytes(case),
                           "the working-dtype yardstick's working set"):
            return None
        return yardstick.output(inputs, oracle_out)
    need = footprint.yardstick_bytes(case)
    if not memory.fits(outcome, YARDSTICK, case, opts, need, "the working-dtype SDPA's working set"):
        return None
    run_output = optional_hook(yardstick, "run_output")  # the output alone (sdpa: no LSE computed)
    run = run_output if run_output is not None else (lambda x: yardstick.run(x).out)
    if getattr(yardstick, "reads_inputs_only", False) is not True and memory.fits(
            None, YARDSTICK, case, opts, need + footprint.input_bytes(case), ""):
        return run(inputs.clone())
    return run(inputs)


def run_case(lowering: Lowering, case: Case, policy: Policy, opts: RunOptions = RunOptions(),
             yardstick: Lowering | None = None) -> CaseOutcome:
    """Run `case` through `lowering` and judge it (see module docstring)."""
    t0 = time.perf_counter()
    why = hooks.call(lowering, "supports", case, case=case, expect=answers.supports_answer)
    if why:
        return CaseOutcome(lowering.name, case, "unsupported", reason=why)
    def judged() -> CaseOutcome:
        if around_case is None:
            return _run_case(lowering, case, policy, opts, yardstick, t0)
        return around_case(lambda: _run_case(lowering, case, policy, opts, yardstick, t0), case, opts)

    ran_out, memory = None, ports.current().memory
    with memory.lease(case, opts) as held:  # a large case waits for room on a shared GPU
        try:
            outcome = judged()
        except Exception as err:
            if not memory.is_out_of_memory(err):
                raise
            ran_out = hooks.first_line(err)  # the message only: the error's frames hold the first attempt's tensors
    waited = held.waited
    if ran_out is not None:
        outcome, alone_waited = _judged_alone(lowering, case, opts, judged, ran_out)
        waited += alone_waited
    if waited:
        outcome.phases["wait"] = outcome.phases.get("wait", 0.0) + waited
    return outcome


def _judged_alone(lowering: Lowering, case: Case, opts: RunOptions, judged: Callable[[], CaseOutcome],
                  first: str) -> tuple[CaseOutcome, float]:
    """A case that ran out of device memory beside other processes, judged again with the device's large-case
    memory to itself (`device_lease(alone=True)`, after giving back this process's cached blocks): its outcome,
    noting the retry under `retried`, and the seconds it waited. Out of memory again: a failure that says both
    times what ran out (a case too large for the device, or a lowering that asks for too much)."""
    memory = ports.current().memory
    memory.release_cached(opts)
    with memory.lease(case, opts, alone=True) as held:
        try:
            outcome = judged()
        except Exception as err:
            if not memory.is_out_of_memory(err):
                raise
            outcome = CaseOutcome(lowering.name, case, "fail", failures=[
                f"out of device memory, twice: beside other processes ({first}), then with the "
                f"device's large-case memory to itself ({hooks.first_line(err)})"])
    outcome.retried[RETRIED_OOM] = f"ran out of device memory beside other processes, judged again alone: {first}"
    return outcome, held.waited


def _run_case(lowering: Lowering, case: Case, policy: Policy, opts: RunOptions, yardstick: Lowering | None,
              t0: float) -> CaseOutcome:
    outcome = CaseOutcome(lowering.name, case, "pass")
    with _Phase(outcome, "build"):
        inputs, bufs = prepare_inputs(lowering, case, opts)
    with _Phase(outcome, "oracle"):  # the launches and the wait for them (the first read of their figures)
        golden = GoldenOracle(inputs, policy.for_case(lowering.name, case.dtype, ())[0],
                              yardstick=bool(opts.yardstick and yardstick is not None))
        ref = golden.attention()
        # Scores or values past fp32's range (a `scale` of 1e300) overflow fp32 kernels: judged by the fp32 oracle.
        bad = oracle_problem(case, ref if golden.fits_fp32() else reference.attention(inputs))
    if bad:  # no output can be judged against it: the case is bad input, never a pass
        return CaseOutcome(lowering.name, case, INVALID, reason=bad, seconds=time.perf_counter() - t0)
    yard_out = None
    if opts.yardstick and yardstick is not None:
        with _Phase(outcome, "yardstick"):
            yard_out = run_yardstick(yardstick, inputs, opts, outcome, ref.out)
    profiled = kernel_names_read(lowering, case, opts)
    with _Phase(outcome, "build"):
        # `before`: the inputs as given, for the untouched-input check, and the pristine source of every later
        # call's inputs with the same canary (`fresh_inputs`: a device copy instead of a second build).
        before, memory = None, ports.current().memory
        if opts.check_inputs_untouched and memory.fits(outcome, UNTOUCHED, case, opts, footprint.input_bytes(case),
                                                       "a snapshot of the inputs to compare against"):
            before = inputs.clone()
    names = KernelNames() if profiled else None  # the judged call's own kernel names, profiled around it
    try:
        if names is not None:
            with _Phase(outcome, "kernel_names"):
                names.start()
        try:
            with _Phase(outcome, "lowering"):
                result = call_lowering(lowering, inputs, outcome)
        finally:
            if names is not None:
                with _Phase(outcome, "kernel_names"):
                    names.stop()
    except LoweringError as err:
        outcome.status = "fail"
        outcome.failures.append(str(err))
        outcome.seconds = time.perf_counter() - t0
        return outcome
    tol, src = tolerance_for(policy, lowering, case, outcome.calls, outcome.observed)  # from what ran
    outcome.bounds, outcome.bounds_why = src.label, src.because
    with _Phase(outcome, "oracle"):
        ref = golden.confirm(tol, ref)
    outcome.oracle = {"precision": golden.precision, "engine": golden.engine, "share": golden.oracle_share}
    bad = golden.problem()
    if bad:
        return CaseOutcome(lowering.name, case, INVALID, reason=bad, seconds=time.perf_counter() - t0)
    with _Phase(outcome, "judge"):
        if bufs is not None:
            outcome.failures.extend(output_buffer_failures(result, bufs))
        comparisons = judge_result(lowering, case, inputs, result, ref, tol, yard_out, bound_from=src.citations(),
                                   oracle=golden, yardstick_name=getattr(yardstick, "name", None))
        for c in comparisons:
            c.figures["bounds"] = src.label
        outcome.comparisons = comparisons
        for c in comparisons:
            outcome.failures.extend(c.failures)
        if opts.check_calls:
            outcome.expected_calls = dict(hooks.call(lowering, "expected_calls", case, case=case,
                                                     expect=answers.expected_calls_answer))
            msg = counters.call_mismatch(outcome.expected_calls, outcome.calls)
            if msg:
                outcome.failures.append(msg)
        if before is not None and opts.check_inputs_untouched:
            outcome.failures.extend(untouched_failures(case, before.tensors(), inputs))
    if opts.check_determinism and not outcome.failures and memory.fits(
            outcome, RERUN, case, opts, footprint.input_bytes(case) * (1 + footprint.LOWERING_COPIES),
            "the other canary's inputs and the lowering's second run"):
        with _Phase(outcome, "hardening"):
            outcome.failures.extend(rerun_failures(lowering, case, opts, result, ref, tol, outcome, pristine=before))
    if names is not None and not outcome.failures:
        with _Phase(outcome, "kernel_names"):
            outcome.failures.extend(names.failures(lowering, case))
    if outcome.failures:
        outcome.status = "fail"
    outcome.seconds = time.perf_counter() - t0
    return outcome


def kernel_names_read(lowering: Lowering, case: Case, opts: RunOptions) -> bool:
    """Whether `run_case` profiles the judged call of `case` and checks its CUDA kernel names: on CUDA, one case
    in `opts.profile_every` (by seed), of a lowering that declares `kernel_families`."""
    return bool(opts.device == "cuda" and opts.profile_every and case.seed % opts.profile_every == 0
                and optional_hook(lowering, "kernel_families") is not None)


def tolerance_for(policy: Policy, lowering: Lowering, case: Case, calls: dict[str, int],
                  observed: dict[str, int] | None = None) -> tuple[Tolerance, ToleranceSource]:
    """The bounds of `case` from what ran (`Policy.for_case`): the calls it recorded and those observed,
    the kernel families they launch (declared with `counters.declare_kernel` or by the lowering's
    `kernel_families(case)`), and the kernel keys its `accuracy` attribute claims."""
    families = dict(hooks.call_optional(lowering, "kernel_families", case, case=case, default={},
                                        expect=answers.kernel_families_answer))
    keys = counters.kernel_keys(calls, observed, families, accuracy_claims(lowering))
    return policy.for_case(lowering.name, case.dtype, keys)


def judge_result(lowering: Lowering, case: Case, inputs: Inputs, result: LoweringResult,
                 ref: reference.OracleResult, tol, yard_out, bound_from: dict[str, str] | None = None,
                 oracle: GoldenOracle | None = None, yardstick_name: str | None = None) -> list[Comparison]:
    """The main comparison, then one per partial (each against the oracle over its own key subset, in the precision
    `oracle` chose for the case: fp32 without one); `bound_from` (`ToleranceSource.citations()`) is quoted next to
    each bound a failure names. An output without an LSE (`lse_base = NO_LSE`, checked by `call_lowering`) is
    judged alone."""
    lse_nat = lse_to_natural(result.lse.float(), lowering.lse_base) if result.lse is not None else None
    comps = [compare("output", result.out, lse_nat, ref.out, ref.lse, dtype=case.dtype, tol=tol,
                     yardstick_out=yard_out, bound_from=bound_from, yardstick_name=yardstick_name)]
    attend = oracle.attention if oracle is not None else (lambda **kw: reference.attention(inputs, **kw))
    for name, part in result.partials.items():
        pref = attend(window=part.window, key_mask=part.key_mask,
                      future_block_keys_right=part.future_block_keys_right)
        part_lse = lse_to_natural(part.lse.float(), part.lse_base) if part.lse is not None else None
        comps.append(compare(f"partial {name}", part.out, part_lse, pref.out, pref.lse, dtype=case.dtype, tol=tol,
                             bound_from=bound_from))
    return comps


def oracle_problem(case: Case, ref: reference.OracleResult) -> str | None:
    """`"<field>: <why>"` when the oracle of `case` is not finite (an output NaN/Inf, or an LSE NaN or +inf;
    -inf is an empty row's), naming the scale field most likely at fault; None when it is finite. Every
    comparison needs a finite reference: past it any output would pass."""
    n = ref.summary().non_finite  # one transfer (it waits for every queued kernel on a GPU), kept for the judge
    if n == 0:
        return None
    scales = {"scale": case.softmax_scale, "k_scale": case.k_scale, "v_scale": case.v_scale}
    field_ = max(scales, key=lambda k: abs(math.log(abs(scales[k]))) if scales[k] else 0.0)
    shown = ", ".join(f"{k}={v:g}" for k, v in scales.items())
    return (f"{field_}: the oracle is not finite on this case ({n} NaN/Inf value(s) in its output or LSE; {shown}): "
            f"scores or values overflow fp32, so no output could be judged; give a case with a finite oracle")


def refuse_invalid(out: "CaseOutcome") -> "CaseOutcome":
    """`out`, or InvalidInput when its case is bad input (`INVALID`: the oracle is not finite)."""
    if out.status == INVALID:
        where, _, rule = out.reason.partition(": ")
        raise InvalidInput(f"case {out.case.short()}: {where}", rule)
    return out


def compile_family(lowering: Lowering, case: Case) -> tuple:
    """The shapes a lowering may compile once for: its own `compile_family(case)` if it has one, else
    every field but the batch size, the lengths, the pages and the seed (which must never recompile)."""
    if optional_hook(lowering, "compile_family") is not None:
        return tuple(hooks.call(lowering, "compile_family", case, case=case, expect=answers.compile_family_answer))
    return (case.block_size, case.num_q_heads, case.num_kv_heads, case.head_dim, case.page_size, case.layout,
            case.window, case.softmax_scale, case.dtype, case.kv_dtype, case.block_storage, case.page_table_dtype)
