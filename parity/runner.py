"""Run one case through one lowering and judge it; run a lowering over a hypothesis-drawn sweep.

`run_case` is the unit: materialize -> oracle -> yardstick -> lowering (counted, inputs snapshotted) ->
LSE converted at the adapter boundary -> judged (output, LSE, each partial, kernel calls, untouched
inputs, determinism). `check_lowering` drives it with hypothesis, which shrinks a failure to the
smallest case that still fails.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence

import torch

from lowerings import counters
from lowerings.protocol import Lowering, LoweringResult, accuracy_claims, lse_to_natural, writes_given_output
from oracle import reference
from oracle.case import Case
from oracle.errors import InvalidInput
from oracle.inputs import GuardedBuffer, Inputs, attach_output_buffers, materialize, poison_bits
from parity import footprint, hooks, memory
from parity.hooks import HookFailure
from parity.interrupt import raise_if_requested
from parity.judge import Comparison, compare
# The outcome model lives in parity.outcome; its names stay importable from here.
from parity.outcome import (INVALID, PHASES, SKIPPED, CaseOutcome, Failure, LoweringReport,  # noqa: F401
                            case_class)
from parity.outcome import jsonable as _jsonable, unjson as _unjson  # noqa: F401
from parity.policy import Policy, Tolerance, ToleranceSource


class _Phase:
    """`with _Phase(outcome, "oracle"): ...` adds the block's wall seconds to `outcome.phases`."""

    def __init__(self, outcome: "CaseOutcome", name: str) -> None:
        self.outcome, self.name = outcome, name

    def __enter__(self) -> None:
        self.t0 = time.perf_counter()

    def __exit__(self, *exc) -> None:
        dt = time.perf_counter() - self.t0
        self.outcome.phases[self.name] = self.outcome.phases.get(self.name, 0.0) + dt


class LoweringError(Exception):
    """A lowering raised (or returned garbage) on a case it claims to support."""


@dataclass(frozen=True)
class RunOptions:
    """What `run_case` checks besides the numbers."""

    device: str = "cpu"
    check_calls: bool = True
    check_inputs_untouched: bool = True
    check_determinism: bool = True
    yardstick: bool = True
    canary: str = "nan"
    # GPU kernel names (torch.profiler) checked against a lowering's kernel_families(case) on one case
    # in `profile_every` (by seed); 0 turns it off.
    profile_every: int = 4
    # A lowering that declares `writes_given_output` gets poisoned, guarded `out`/`lse_out` buffers and is
    # checked to return them, to write every element and nothing past either end. Off: no buffers given.
    check_output_buffers: bool = True
    # The device memory a case may use, in bytes (None: measured before each step, parity.memory): a
    # hardening step whose tensors would not fit is skipped and says so in the outcome and the report.
    memory_bytes: int | None = None

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RunOptions":
        return cls(**data)


def _bits(t: torch.Tensor) -> torch.Tensor:
    """A bit-exact view for comparisons where NaN must equal NaN."""
    t = t.detach()
    size = t.element_size()
    as_int = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[size]
    return t.contiguous().view(as_int)


def _block_slot_mask(case: Case, pool: torch.Tensor) -> torch.Tensor:
    """Pool slots the lowering may write: the block's own slots, when it appends (dense storage)."""
    if case.layout == "NHD":
        mask = torch.zeros(pool.shape[:2], dtype=torch.bool)
    else:
        mask = torch.zeros((pool.shape[0], pool.shape[2]), dtype=torch.bool)
    if case.block_storage == "dense":
        for b, L in enumerate(case.context_lens):
            for t in range(L, L + case.block_size):
                mask[case.pages[b][t // case.page_size], t % case.page_size] = True
    return mask


def untouched_failures(case: Case, before: dict[str, torch.Tensor], inputs: Inputs) -> list[str]:
    """Messages for every input the lowering changed outside the slots it may write."""
    msgs = []
    after = inputs.tensors()
    for name, old in before.items():
        new = after[name]
        if name in ("k_pool", "v_pool"):
            changed = (_bits(old) != _bits(new))
            changed = changed.reshape(changed.shape[0], changed.shape[1], -1).any(-1) if case.layout == "NHD" else \
                changed.any(-1).any(1)
            allowed = _block_slot_mask(case, new).to(changed.device)
            bad = changed & ~allowed
            if bool(bad.any()):
                page, slot = (int(x) for x in bad.nonzero()[0])
                owner = next((b for b, row in enumerate(case.pages) if page in row), None)
                who = f"request {owner}'s" if owner is not None else "a spare"
                msgs.append(f"input mutated: {name} changed at {int(bad.sum())} slot(s) the lowering may not write; "
                            f"first: page {page} slot {slot} ({who} page)")
        elif old.shape != new.shape or not torch.equal(_bits(old), _bits(new)):
            msgs.append(f"input mutated: {name} was changed by the lowering (inputs must stay as given)")
    return msgs


def prepare_inputs(lowering: Lowering, case: Case, opts: RunOptions, canary: str | None = None
                   ) -> tuple[Inputs, tuple[GuardedBuffer, GuardedBuffer] | None]:
    """The case's tensors for one call of `lowering`, with poisoned output buffers when it writes given ones."""
    inputs = materialize(case, opts.device, canary=canary or opts.canary)
    bufs = None
    if opts.check_output_buffers and writes_given_output(lowering):
        bufs = attach_output_buffers(inputs)
    return inputs, bufs


_WHERE_NAMES = ("request", "query", "head", "dim")


def _where(shape: tuple[int, ...], flat: int) -> str:
    idx = []
    for n in reversed(shape):
        idx.append(flat % n)
        flat //= n
    return ", ".join(f"{name} {i}" for name, i in zip(_WHERE_NAMES, reversed(idx)))


def output_buffer_failures(result: LoweringResult, bufs: tuple[GuardedBuffer, GuardedBuffer]) -> list[str]:
    """Messages when a `writes_given_output` lowering did not honour its buffers:

    - the tensor it returned is not the buffer it was given (same storage, offset, shape, strides);
    - an element of the buffer still holds the poison (never written), the first one named;
    - a guard element before or after the buffer changed (written out of bounds).
    """
    msgs: list[str] = []
    for label, given_name, res, buf in (("output", "out", result.out, bufs[0]), ("LSE", "lse_out", result.lse, bufs[1])):
        if res is None and label == "LSE":
            continue  # a lowering that returns no LSE need not write lse_out
        view = buf.view
        same = (res is not None and res.data_ptr() == view.data_ptr() and tuple(res.shape) == tuple(view.shape)
                and tuple(res.stride()) == tuple(view.stride()) and res.dtype == view.dtype)
        if not same:
            msgs.append(f"{label}: returned a new tensor instead of writing the given output ({given_name})")
        poison, guard = poison_bits(view.dtype)
        bits = buf.int_bits(view.detach())
        unwritten = bits == poison
        n = int(unwritten.sum())
        if n and same:  # a new tensor returned: the buffer was not the result; one message says so
            first = int(unwritten.flatten().nonzero()[0])
            row = first // (view.shape[3] if view.dim() == 4 else 1)  # -> (request, query, head)
            msgs.append(f"{label} never written at {_where(tuple(view.shape[:3]), row)}: {n} element(s) of the "
                        f"given {given_name} still hold the poison it was filled with")
        for side, part in (("past the end of", buf.after()), ("before the start of", buf.before())):
            changed = int((buf.int_bits(part) != guard).sum())
            if changed:
                msgs.append(f"{label}: wrote {changed} element(s) {side} the output ({given_name}, "
                            f"{buf.guard} guard elements checked)")
    return msgs


def run_yardstick(yardstick: Lowering, inputs: Inputs, opts: RunOptions, outcome: CaseOutcome):
    """The yardstick's output on a copy of the inputs, or on the inputs themselves when a copy does not fit
    (the yardstick, `sdpa`, writes none of its inputs: its own check says so); None, with the reason in
    `outcome.skipped`, when its working set does not fit either."""
    case = inputs.case
    need = footprint.yardstick_bytes(case)
    if not memory.fits(outcome, memory.YARDSTICK, case, opts, need, "the working-dtype SDPA's working set"):
        return None
    if memory.fits(None, memory.YARDSTICK, case, opts, need + footprint.input_bytes(case), ""):
        return yardstick.run(inputs.clone()).out
    return yardstick.run(inputs).out


def run_case(lowering: Lowering, case: Case, policy: Policy, opts: RunOptions = RunOptions(),
             yardstick: Lowering | None = None) -> CaseOutcome:
    """Run `case` through `lowering` and judge it (see module docstring)."""
    t0 = time.perf_counter()
    why = hooks.call(lowering, "supports", case, case=case)
    if why:
        return CaseOutcome(lowering.name, case, "unsupported", reason=why)
    with memory.device_lease(case, opts) as held:  # a large case waits for room on a shared GPU
        outcome = _run_case(lowering, case, policy, opts, yardstick, t0)
    if held.waited:
        outcome.phases["wait"] = held.waited
    return outcome


def _run_case(lowering: Lowering, case: Case, policy: Policy, opts: RunOptions, yardstick: Lowering | None,
              t0: float) -> CaseOutcome:
    outcome = CaseOutcome(lowering.name, case, "pass")
    with _Phase(outcome, "build"):
        inputs, bufs = prepare_inputs(lowering, case, opts)
    with _Phase(outcome, "oracle"):
        ref = reference.attention(inputs)
    bad = oracle_problem(case, ref)
    if bad:  # no output can be judged against it: the case is bad input, never a pass
        return CaseOutcome(lowering.name, case, INVALID, reason=bad, seconds=time.perf_counter() - t0)
    yard_out = None
    if opts.yardstick and yardstick is not None:
        with _Phase(outcome, "yardstick"):
            yard_out = run_yardstick(yardstick, inputs, opts, outcome)
    with _Phase(outcome, "build"):
        before = None
        if opts.check_inputs_untouched and memory.fits(outcome, memory.UNTOUCHED, case, opts, footprint.input_bytes(case),
                                                       "a snapshot of the inputs to compare against"):
            before = {k: v.clone() for k, v in inputs.tensors().items()}
    try:
        with _Phase(outcome, "lowering"):
            result = _call(lowering, inputs, outcome)
    except LoweringError as err:
        outcome.status = "fail"
        outcome.failures.append(str(err))
        outcome.seconds = time.perf_counter() - t0
        return outcome
    tol, src = tolerance_for(policy, lowering, case, outcome.calls, outcome.observed)  # from what ran
    outcome.bounds, outcome.bounds_why = src.label, src.because
    with _Phase(outcome, "judge"):
        if bufs is not None:
            outcome.failures.extend(output_buffer_failures(result, bufs))
        comparisons = judge_result(lowering, case, inputs, result, ref, tol, yard_out, bound_from=src.citations())
        for c in comparisons:
            c.figures["bounds"] = src.label
        outcome.comparisons = comparisons
        for c in comparisons:
            outcome.failures.extend(c.failures)
        if opts.check_calls:
            outcome.expected_calls = dict(hooks.call(lowering, "expected_calls", case, case=case))
            msg = counters.call_mismatch(outcome.expected_calls, outcome.calls)
            if msg:
                outcome.failures.append(msg)
        if before is not None:
            outcome.failures.extend(untouched_failures(case, before, inputs))
    if opts.check_determinism and not outcome.failures and memory.fits(
            outcome, memory.RERUN, case, opts, footprint.input_bytes(case) * (1 + footprint.LOWERING_COPIES),
            "the other canary's inputs and the lowering's second run"):
        with _Phase(outcome, "hardening"):
            outcome.failures.extend(rerun_failures(lowering, case, opts, result, ref, tol, outcome))
    if (opts.device == "cuda" and opts.profile_every and case.seed % opts.profile_every == 0
            and callable(getattr(lowering, "kernel_families", None)) and not outcome.failures
            and memory.fits(outcome, memory.KERNEL_NAMES, case, opts,
                            footprint.input_bytes(case) * (1 + footprint.LOWERING_COPIES), "a profiled run's inputs")):
        with _Phase(outcome, "kernel_names"):
            outcome.failures.extend(gpu_kernel_failures(lowering, case, opts))
    if outcome.failures:
        outcome.status = "fail"
    outcome.seconds = time.perf_counter() - t0
    return outcome


_module_run_case = run_case  # check_lowering rebinds the name `run_case` locally (see there)


def tolerance_for(policy: Policy, lowering: Lowering, case: Case, calls: dict[str, int],
                  observed: dict[str, int] | None = None) -> tuple[Tolerance, ToleranceSource]:
    """The bounds of `case` from what ran (`Policy.for_case`): the calls it recorded and those observed,
    the kernel families they launch (declared with `counters.declare_kernel` or by the lowering's
    `kernel_families(case)`), and the kernel keys its `accuracy` attribute claims."""
    fams = getattr(lowering, "kernel_families", None)
    families = dict(fams(case)) if callable(fams) else {}
    keys = counters.kernel_keys(calls, observed, families, accuracy_claims(lowering))
    return policy.for_case(lowering.name, case.dtype, keys)


def _differing_requests(a: torch.Tensor, b: torch.Tensor) -> list[int]:
    diff = (_bits(a) != _bits(b)).reshape(a.shape[0], -1).any(-1)
    return [int(i) for i in diff.nonzero().flatten()]


def _negate_context(inputs: Inputs, b: int) -> None:
    """Perturb request `b`'s context in the pool (negation is exact in every dtype), nothing else."""
    c = inputs.case
    dev = inputs.k_pool.device
    t = torch.arange(c.context_lens[b], device=dev)
    page = torch.tensor(c.pages[b], dtype=torch.long, device=dev)[t // c.page_size]
    slot = t % c.page_size
    for pool in (inputs.k_pool, inputs.v_pool):
        if c.layout == "NHD":
            pool[page, slot] = (-pool[page, slot].float()).to(pool.dtype)
        else:
            pool[page, :, slot] = (-pool[page, :, slot].float()).to(pool.dtype)


def rerun_failures(lowering: Lowering, case: Case, opts: RunOptions, first: LoweringResult,
                   ref: reference.OracleResult, tol, outcome: CaseOutcome | None = None) -> list[str]:
    """Second run with the other canary (NaN <-> large finite value in every slot no request owns):

    - a deterministic lowering must give the same bits in everything it returns (output, LSE, each
      partial); where it does not, a third run with the first canary and a fourth with the other tell a
      read outside the request's keys (third == first and fourth == second, everything compared) from
      nondeterminism across identical runs (anything else; when only the first call differs and the
      later ones agree, it depends on state left by a previous call);
    - a lowering that does not claim determinism is judged again against the oracle.
    Then, for a third of the cases with B >= 2 (by seed), isolation: negating the last request's context
    must leave every other request's output bit-identical.
    """
    msgs: list[str] = []
    other = "large" if opts.canary != "large" else "nan"
    second_in, _ = prepare_inputs(lowering, case, opts, other)
    try:
        second = _call(lowering, second_in, CaseOutcome(lowering.name, case, "pass"))
    except LoweringError as err:
        return [f"second run (canary {other}): {err}"]
    if not lowering.deterministic:
        comp = compare(f"output with {other} canaries", second.out, None, ref.out, ref.lse, dtype=case.dtype, tol=tol)
        return comp.failures
    from parity import flakiness as fl  # imports this module

    firsts, seconds = fl.parts_of(first), fl.parts_of(second)
    if fl.differing_parts(firsts, seconds):  # everything it returns: output, LSE, each partial
        try:
            third = _call(lowering, prepare_inputs(lowering, case, opts)[0], CaseOutcome(lowering.name, case, "pass"))
        except LoweringError as err:
            return [f"third run: {err}"]
        try:
            fourth = _call(lowering, prepare_inputs(lowering, case, opts, other)[0],
                           CaseOutcome(lowering.name, case, "pass"))
        except LoweringError as err:
            return [f"fourth run: {err}"]
        thirds, fourths = fl.parts_of(third), fl.parts_of(fourth)
        same_canary = fl.differing_parts(firsts, thirds) or fl.differing_parts(seconds, fourths)
        if not same_canary:
            what, reqs = fl.differing_requests(firsts, seconds)
            what = f"the {what}" if what in ("output", "LSE") else what
            msgs.append(f"read outside the request's keys: {what} of request(s) {reqs} changed when the pool slots "
                        f"no request owns (spare pages, the tail of each last page) held {other} instead of {opts.canary}")
        else:
            odd_first = not fl.differing_parts(thirds, seconds) and not fl.differing_parts(fourths, seconds)
            detail = (f"a run on the same inputs (same canary {opts.canary}) changed "
                      f"{fl.describe_diffs(fl.differing_parts(firsts, thirds) or fl.differing_parts(seconds, fourths))}")
            if odd_first:
                detail += "; only the first call (after a different case) differs, the later ones agree"
            msgs.append(fl.nondeterminism_message(detail, odd_first))
        return msgs
    B = case.batch_size
    if B >= 2 and case.seed % 3 == 0 and case.context_lens[-1] > 0 and (outcome is None or memory.fits(
            outcome, memory.ISOLATION, case, opts, footprint.input_bytes(case) * (1 + footprint.LOWERING_COPIES),
            "the perturbed inputs of the request-isolation run")):
        del second_in
        pert, _ = prepare_inputs(lowering, case, opts)
        _negate_context(pert, B - 1)
        try:
            res = _call(lowering, pert, CaseOutcome(lowering.name, case, "pass"))
        except LoweringError as err:
            return [f"isolation run: {err}"]
        leaked = [b for b in _differing_requests(first.out, res.out) if b != B - 1]
        if leaked:
            msgs.append(f"request isolation: negating request {B - 1}'s context changed the output of request(s) {leaked}")
    return msgs


def gpu_kernel_failures(lowering: Lowering, case: Case, opts: RunOptions) -> list[str]:
    """Run once more under torch.profiler; the CUDA kernel names must match the lowering's declaration."""
    from torch.profiler import ProfilerActivity, profile

    inputs, _ = prepare_inputs(lowering, case, opts)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        try:
            _call(lowering, inputs, CaseOutcome(lowering.name, case, "pass"))
        except LoweringError as err:
            return [f"profiled run: {err}"]
        torch.cuda.synchronize()
    seen = [e.name for e in prof.events() if getattr(e, "device_type", None) is not None
            and str(e.device_type).endswith("CUDA")]
    forbidden = lowering.forbidden_kernel_families(case) if callable(getattr(lowering, "forbidden_kernel_families", None)) else {}
    return counters.kernel_name_failures(seen, lowering.kernel_families(case), forbidden)


def _call(lowering: Lowering, inputs: Inputs, outcome: CaseOutcome) -> LoweringResult:
    from lowerings import flashinfer_observer

    flashinfer_observer.install_import_hook()
    flashinfer_observer.ensure_observed()
    with counters.KernelCounter() as kc:
        try:
            result = lowering.run(inputs)
        except InvalidInput as err:
            raise LoweringError(f"{lowering.name} rejected a case its supports() accepts: {err}") from None
        except SystemExit as err:  # a plugin's sys.exit() ends its lowering's case, never the run (or exit 0)
            raise LoweringError(f"{lowering.name} raised SystemExit({err.code!r}): a lowering must return, "
                                f"not exit the process") from None
        except Exception as err:  # a lowering's own exception is a failure of that lowering, not of the run
            # where in the lowering's own file (a plugin's), and the innermost frame (torch's, ...)
            raise LoweringError(f"{lowering.name} raised {hooks.describe_exception(err, lowering)}") from None
    outcome.calls = dict(kc.calls)
    outcome.observed = dict(kc.observed)
    outcome.compiles = dict(kc.compiles)
    if not isinstance(result, LoweringResult):
        raise LoweringError(f"{lowering.name}.run returned {type(result).__name__}, expected LoweringResult")
    c = inputs.case
    if result.out.dtype != inputs.q.dtype:
        raise LoweringError(f"{lowering.name}: output dtype {result.out.dtype}, expected the case's {inputs.q.dtype}")
    if result.lse is None:
        raise LoweringError(f"{lowering.name}: declared lse_base {'2' if lowering.lse_base == 2.0 else 'e'} but "
                            f"returned no LSE (lse=None): the LSE would go unchecked")
    return result


def judge_result(lowering: Lowering, case: Case, inputs: Inputs, result: LoweringResult,
                 ref: reference.OracleResult, tol, yard_out, bound_from: dict[str, str] | None = None
                 ) -> list[Comparison]:
    """The main comparison, then one per partial (each against the oracle over its own key subset);
    `bound_from` (`ToleranceSource.citations()`) is quoted next to each bound a failure names."""
    lse_nat = lse_to_natural(result.lse.float(), lowering.lse_base) if result.lse is not None else None
    comps = [compare("output", result.out, lse_nat, ref.out, ref.lse, dtype=case.dtype, tol=tol,
                     yardstick_out=yard_out, bound_from=bound_from)]
    for name, part in result.partials.items():
        pref = reference.attention(inputs, window=part.window, key_mask=part.key_mask,
                                   future_block_keys_right=part.future_block_keys_right)
        comps.append(compare(f"partial {name}", part.out, lse_to_natural(part.lse.float(), part.lse_base),
                             pref.out, pref.lse, dtype=case.dtype, tol=tol, bound_from=bound_from))
    return comps


def oracle_problem(case: Case, ref: reference.OracleResult) -> str | None:
    """`"<field>: <why>"` when the oracle of `case` is not finite (an output NaN/Inf, or an LSE NaN or +inf;
    -inf is an empty row's), naming the scale field most likely at fault; None when it is finite. Every
    comparison needs a finite reference: past it any output would pass."""
    bad_out = ~torch.isfinite(ref.out)
    bad_lse = torch.isnan(ref.lse) | torch.isposinf(ref.lse)
    n = int(bad_out.sum()) + int(bad_lse.sum())
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
    fam = getattr(lowering, "compile_family", None)
    if callable(fam):
        return tuple(hooks.call(lowering, "compile_family", case, case=case))
    return (case.block_size, case.num_q_heads, case.num_kv_heads, case.head_dim, case.page_size, case.layout,
            case.window, case.softmax_scale, case.dtype, case.kv_dtype, case.block_storage, case.page_table_dtype)


def compile_budget_message(lowering: Lowering, report: LoweringReport) -> str | None:
    """A message when the run compiled more than `max_compiles` per shape family it saw."""
    if lowering.max_compiles is None:
        return None
    over = {fam: n for fam, n in report.compile_families.items() if n > lowering.max_compiles}
    if not over:
        return None
    fam, n = max(over.items(), key=lambda kv: kv[1])
    return (f"compiled {n} times within one shape family {fam} (bound {lowering.max_compiles} per family; "
            f"{len(over)} of {len(report.compile_families)} families over it; kernels {dict(report.compiles)}): "
            f"a kernel recompiles for a value it must take at run time (batch size, lengths, split count)")


def _exited(report: LoweringReport, err: SystemExit, t0: float) -> LoweringReport:
    """The lowering's report when its plugin code (`supports()`, `expected_calls()`, or `run()` in process)
    raised SystemExit: a failure of that lowering, never a clean end of the run."""
    report.status = "fail"
    report.extra.append(f"plugin code raised SystemExit({err.code!r}) after {report.cases} case(s) (in supports(), "
                        f"expected_calls() or run()): a lowering must return, not exit the process")
    report.seconds = time.perf_counter() - t0
    return report


class _CaseFailed(Exception):
    def __init__(self, outcome: CaseOutcome):
        super().__init__(outcome.summary())
        self.outcome = outcome


def _case_failures(err: BaseException) -> list["_CaseFailed"]:
    """The `_CaseFailed` exceptions inside `err` (hypothesis's Flaky errors group them)."""
    if isinstance(err, _CaseFailed):
        return [err]
    found: list[_CaseFailed] = []
    for sub in getattr(err, "exceptions", ()) or ():
        found += _case_failures(sub)
    if not found and err.__cause__ is not None:
        found = _case_failures(err.__cause__)
    return found


def _refusing_invalid(run_case: Callable[..., CaseOutcome]) -> Callable[..., CaseOutcome]:
    """`run_case` that raises InvalidInput for a case whose oracle is not finite (`refuse_invalid`)."""
    def run(*args) -> CaseOutcome:
        return refuse_invalid(run_case(*args))
    return run


def _stops_on_interrupt(run_case: Callable[..., CaseOutcome]) -> Callable[..., CaseOutcome]:
    """`run_case` that first raises a SIGINT the interpreter swallowed (`parity.interrupt`)."""
    def run(*args) -> CaseOutcome:
        raise_if_requested()
        return run_case(*args)
    return run


def _sharded_run_case(run_case: Callable[..., CaseOutcome], shard: tuple[int, int],
                      failing: bool = False) -> Callable[..., CaseOutcome]:
    """`run_case` for shard `i` of `n`: of the cases hypothesis draws, it runs those whose draw index is `i`
    modulo `n` and answers SKIPPED (a pass, to hypothesis) for the rest, so that the `n` shards of a
    derandomized profile draw the serial run's sequence and together run each of its cases once. After a
    failure (or from the start, `failing`: a boundary case failed, the draw is to shrink it) it runs every
    case: hypothesis's shrinking must see each of its attempts judged."""
    i, n = shard
    state = {"drawn": 0, "failing": failing}

    def run(lowering: Lowering, case: Case, policy: Policy, opts: RunOptions, yardstick: Lowering | None) -> CaseOutcome:
        idx = state["drawn"]
        state["drawn"] += 1
        if not state["failing"] and idx % n != i:
            return CaseOutcome(lowering.name, case, SKIPPED)
        out = run_case(lowering, case, policy, opts, yardstick)
        state["failing"] = state["failing"] or out.status == "fail"
        return out
    return run


def _executor_run_case(executor: "CaseExecutor") -> Callable[..., CaseOutcome]:
    """`run_case`'s signature over `executor.run` (supports() is asked here, under the hook watchdog of
    `parity.hooks`: no round trip for it)."""
    def run(lowering: Lowering, case: Case, policy: Policy, opts: RunOptions, yardstick: Lowering | None) -> CaseOutcome:
        why = hooks.call(lowering, "supports", case, case=case)
        if why:
            return CaseOutcome(lowering.name, case, "unsupported", reason=why)
        return executor.run(lowering.name, case)
    return run


class CaseExecutor(Protocol):
    """Where `check_lowering` runs a case: in process (the default) or in a worker (parity.isolation).
    An executor may also answer `available(lowering_name, device) -> (ok, why)` (asked there, isolated)."""

    def run(self, lowering_name: str, case: Case) -> CaseOutcome: ...


def lowering_available(lowering: Lowering, device: str, executor: CaseExecutor | None = None) -> tuple[bool, str]:
    """`lowering.available(device)`: in the executor's worker when it offers it, else here under the hook
    watchdog; a hook failure raises `HookFailure`, a malformed answer too."""
    asked = getattr(executor, "available", None)
    if callable(asked):
        return asked(lowering.name, device)
    return availability(lowering.name, hooks.call(lowering, "available", device))


def availability(lowering_name: str, answer: Any) -> tuple[bool, str]:
    """`available()`'s answer as `(ok, why)`; anything but a pair (bool, str) raises HookFailure."""
    if not (isinstance(answer, (tuple, list)) and len(answer) == 2 and isinstance(answer[1], str)):
        raise HookFailure(lowering_name, "available", f"available() returned {answer!r:.200}, expected (bool, str)")
    return bool(answer[0]), answer[1]


def hook_failure_report(report: "LoweringReport", hf: HookFailure, t0: float) -> "LoweringReport":
    """`report` failed by a hook's failure: the note names the hook; the case it was asked about (if any)
    becomes a failure (not shrunk) with its replayable file."""
    report.status = "fail"
    report.extra.append(f"{hf.message}; the check of this lowering stopped there (after {report.cases} case(s))")
    if hf.case is not None:
        report.failures.append(Failure(CaseOutcome(report.lowering, hf.case, "fail", failures=[hf.message]),
                                       shrunk=False))
    report.seconds = time.perf_counter() - t0
    return report


def _name_failures(report: LoweringReport, reruns, sanitizer) -> None:
    """`parity.flakiness.name_failures`; SIGINT while re-running keeps the report (marked interrupted)."""
    from parity import flakiness as fl

    try:
        fl.name_failures(report, reruns.classify, sanitizer)
    except KeyboardInterrupt:
        report.interrupted = True
        report.status = "fail"
        report.extra.append("interrupted while re-running a failure to classify it: a partial run, not a verdict")


def _run_boundaries(boundaries: Sequence[Any], lowering: Lowering, policy: Policy, opts: RunOptions,
                    yardstick: Lowering | None, run_case: Callable[..., CaseOutcome], report: LoweringReport,
                    progress) -> tuple[bool, tuple[CaseOutcome, str] | None]:
    """Run the boundary cases in order, up to the first that fails. Returns `(done, failure)`: `done` when
    the report is final (a failing case whose other side passes: the bug needs this side of a declared
    boundary, and the case, every other field at its simplest, is minimal: recorded as shrunk); else the
    first failing case and its label, for `check_lowering` to report if the random draw finds none to
    shrink."""
    ran: dict[str, CaseOutcome] = {}

    def run(case: Case) -> CaseOutcome:
        key = case.to_json(indent=None)
        if key not in ran:
            raise_if_requested()
            out = ran[key] = refuse_invalid(run_case(lowering, case, policy, opts, yardstick))
            report.absorb(out, compile_family(lowering, case))
            if progress:
                progress(report, out)
        return ran[key]

    for bnd in boundaries:
        out = run(bnd.case)
        if out.status != "fail":
            continue
        if bnd.other_side is not None and run(bnd.other_side).status == "pass":
            report.failures.append(Failure(out, shrunk=True))
            report.extra.append(f"caught by the boundary case {bnd.label}, run before the random draw: its other "
                                f"side passes and every other field is the simplest, so it is the minimal case")
            report.status = "fail"
            return True, None
        return False, (out, bnd.label)
    return False, None


def check_lowering(lowering: Lowering, policy: Policy, *, strategy, settings, opts: RunOptions = RunOptions(),
                   yardstick: Lowering | None = None, replay: list[Case] = (),
                   progress: Callable[[LoweringReport, CaseOutcome], None] | None = None,
                   target: bool = False, seed: int | None = None,
                   executor: CaseExecutor | None = None, shard: tuple[int, int] | None = None,
                   flaky_runs: int = 4, sanitizer: Callable[[str, Case, Case | None], str] | None = None,
                   boundaries: Sequence[Any] = ()) -> LoweringReport:
    """Replay saved failures, run the boundary cases, then draw cases with hypothesis; a failure is shrunk
    and recorded.

    `boundaries` (`strategies.Boundary`: `.case`, `.label`, `.other_side`; `strategies.check_cases`
    gives a lowering's) run before the first drawn case, whatever the seed (`_run_boundaries`).

    `executor` (an object with `run(lowering_name, case) -> CaseOutcome`, e.g.
    `parity.isolation.IsolatedExecutor`) runs each supported case elsewhere, typically in a worker process
    that survives the lowering crashing or hanging; None runs `run_case` in this process. Either way a
    failing outcome is raised inside hypothesis's test function, so crashes shrink like any failure.
    `shard=(i, n)` runs every n-th drawn case from the i-th (`_sharded_run_case`; 0 <= i < n).
    A hook of the lowering (`available`, `supports`, ...) that raises, exits or hangs fails the lowering at
    once, naming the hook, the time and the case (`parity.hooks`; not shrunk); the caller goes on.
    Each failure is then re-run `flaky_runs` (R) times and classified (`parity.flakiness`: "failed k of R
    runs", nondeterministic, state-dependent); a failure that passed on hypothesis's replay is shrunk in a
    second search where a case fails if it fails in one of R runs; `sanitizer(lowering_name, case, history)`
    (on CUDA: `parity.sanitizer`) replays a nondeterministic one and its report is attached. 0: none of it.
    """
    # `run_case` is rebound locally (not renamed) on purpose: derandomized hypothesis profiles seed their
    # draws from the test function's source, so `prop` below keeps the exact text it always had and a
    # given profile draws the same cases in process and isolated.
    run_case = _module_run_case if executor is None else _executor_run_case(executor)
    from parity import flakiness as fl  # imports this module

    judge_again = _stops_on_interrupt(run_case)  # re-runs that classify a failure (not absorbed in the report)
    reruns = fl.Reruns(lowering, opts, lambda c: judge_again(lowering, c, policy, opts, yardstick), executor,
                       flaky_runs)
    run_case = base_run_case = reruns.history.wrap(run_case)

    t0 = time.perf_counter()
    report = LoweringReport(lowering.name, opts.device, "pass", max_compiles=lowering.max_compiles)
    try:
        return _check_lowering(lowering, policy, report, t0, strategy=strategy, settings=settings, opts=opts,
                               yardstick=yardstick, replay=replay, progress=progress, target=target, seed=seed,
                               executor=executor, shard=shard, run_case=run_case, flaky_runs=flaky_runs,
                               sanitizer=sanitizer, reruns=reruns, base_run_case=base_run_case,
                               boundaries=boundaries)
    except HookFailure as hf:  # a hook raised, exited or hung: this lowering's failure, the run goes on
        return hook_failure_report(report, hf, t0)


def _check_lowering(lowering: Lowering, policy: Policy, report: LoweringReport, t0: float, *, strategy, settings,
                    opts: RunOptions, yardstick: Lowering | None, replay: list[Case], progress, target: bool,
                    seed: int | None, executor: CaseExecutor | None, shard: tuple[int, int] | None,
                    run_case: Callable[..., CaseOutcome], flaky_runs: int, sanitizer, reruns,
                    base_run_case: Callable[..., CaseOutcome], boundaries: Sequence[Any]) -> LoweringReport:
    from hypothesis import given, target as hyp_target
    from hypothesis.errors import Flaky, Unsatisfiable

    from parity import flakiness as fl

    ok, why = lowering_available(lowering, opts.device, executor)
    if not ok:
        report.status, report.reason = "unavailable", why
        return report
    try:
        for case in replay:
            raise_if_requested()
            out = refuse_invalid(run_case(lowering, case, policy, opts, yardstick))
            report.absorb(out, compile_family(lowering, case))
            if progress:
                progress(report, out)
            if out.status == "fail":
                report.failures.append(Failure(out, shrunk=False))
    except KeyboardInterrupt:
        report.status, report.interrupted = "fail", True
        report.extra.append(f"interrupted after {report.cases} case(s), replaying the saved failures: a partial "
                            f"run, not a verdict")
        report.seconds = time.perf_counter() - t0
        return report
    except SystemExit as err:
        return _exited(report, err, t0)
    if report.failures:
        report.status = "fail"
        report.extra.append("a saved failure still fails; fix it before new cases are drawn")
        if flaky_runs:
            _name_failures(report, reruns, sanitizer)
        report.seconds = time.perf_counter() - t0
        return report

    boundary_failure = None
    if boundaries and (shard is None or shard[0] == 0):  # like the replays: once, in the first shard
        try:
            done, boundary_failure = _run_boundaries(boundaries, lowering, policy, opts, yardstick, run_case,
                                                     report, progress)
        except KeyboardInterrupt:
            report.status, report.interrupted = "fail", True
            report.extra.append(f"interrupted after {report.cases} case(s), running the boundary cases: a partial "
                                f"run, not a verdict")
            done = True
        except SystemExit as err:
            return _exited(report, err, t0)
        if done:
            if flaky_runs and report.failures and not report.interrupted:
                _name_failures(report, reruns, sanitizer)
            report.seconds = time.perf_counter() - t0
            return report

    if shard is not None:  # after the replays: they run in every shard that is given them
        run_case = _sharded_run_case(run_case, shard, failing=boundary_failure is not None)
        if progress is not None:
            shown = progress
            progress = lambda rep, out: None if out.status == SKIPPED else shown(rep, out)  # noqa: E731
    run_case = _refusing_invalid(_stops_on_interrupt(run_case))

    @settings
    @given(case=strategy)
    def prop(case: Case) -> None:
        out = run_case(lowering, case, policy, opts, yardstick)
        report.absorb(out, compile_family(lowering, case))
        if progress:
            progress(report, out)
        if target and out.status == "pass":
            hyp_target(float(out.figure("out_ulp", 0.0) or 0.0), label="out_ulp")
        if out.status == "fail":
            raise _CaseFailed(out)

    if seed is None and not settings.derandomize and flaky_runs:
        import random  # a seed of our own: the search that shrinks a flaky failure draws the same cases
        seed = random.getrandbits(64)
    if seed is not None:
        from hypothesis import seed as hyp_seed
        prop = hyp_seed(seed)(prop)
    from strategies._determinism import seed_only_draws

    def search_again(shrinking_run_case) -> None:
        """`prop` again (its text unchanged, so the same draws), over `shrinking_run_case`, no database."""
        nonlocal run_case
        from hypothesis import settings as hyp_settings
        run_case = _refusing_invalid(_stops_on_interrupt(shrinking_run_case))
        again = hyp_settings(settings, database=None)(given(case=strategy)(prop.hypothesis.inner_test))
        if seed is not None:
            from hypothesis import seed as hyp_seed
            again = hyp_seed(seed)(again)
        with seed_only_draws():  # the draws of the first search, in any process
            again()

    try:
        with seed_only_draws():  # the same cases in any process, whatever it imported
            prop()
    except KeyboardInterrupt:  # keep what ran: the caller writes a partial report, failed, and stops
        report.interrupted = True
        report.extra.append(f"interrupted after {report.cases} case(s): a partial run, not a verdict")
    except SystemExit as err:
        return _exited(report, err, t0)
    except Unsatisfiable:  # supports() (or the limits) admit no case the strategy can draw: nothing judged
        report.reason = (f"no case could be drawn that supports() accepts under these limits ({report.cases} "
                         f"judged): nothing judged")
    except _CaseFailed as err:
        report.failures.append(Failure(err.outcome, shrunk=True))
    except Flaky as err:  # failed, then passed on hypothesis's replay: a race, a crash or hang, state
        failed = _case_failures(err)
        if not failed:
            raise
        if not flaky_runs:
            report.failures.append(Failure(failed[0].outcome, shrunk=False))
            report.extra.append(f"flaky: the case below failed, then passed when hypothesis replayed it "
                                f"({failed[0].outcome.failures[0][:120]}); not shrunk")
        else:
            try:
                fl.shrink_flaky(report, [f.outcome for f in failed], reruns, base_run_case, search_again)
            except KeyboardInterrupt:
                report.interrupted = True
                report.failures.append(Failure(failed[0].outcome, shrunk=False))
                report.extra.append("interrupted while shrinking a flaky failure: a partial run, not a verdict")
    if boundary_failure is not None and not report.failures and not report.interrupted:
        report.failures.append(Failure(boundary_failure[0], shrunk=False))
        report.extra.append(f"caught by the boundary case ({boundary_failure[1]}) run before the random draw, "
                            f"which did not reach it in {report.cases} case(s); not shrunk")
    if flaky_runs and report.failures and not report.interrupted:
        _name_failures(report, reruns, sanitizer)
    msg = compile_budget_message(lowering, report)
    if msg:
        report.extra.append(msg)
    if report.failures or report.extra:
        report.status = "fail"
    report.seconds = time.perf_counter() - t0
    return report
