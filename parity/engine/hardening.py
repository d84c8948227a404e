"""The hardening checks of one case, beyond the comparison with the oracle:

- `untouched_failures`: inputs the lowering changed outside the slots it may write (the block's own
  slots when it appends);
- `output_buffer_failures`: a `writes_given_output` lowering that returned other tensors, left poison in
  its buffers or wrote past them;
- `rerun_failures`: the second run with the other canary (reads outside the request's keys,
  nondeterminism, state left by a previous call) and request isolation;
- `KernelNames`: the CUDA kernel names the judged call itself launched (profiled around it), against the
  lowering's `kernel_families(case)` / `forbidden_kernel_families(case)`; `gpu_kernel_failures`: the same
  check on a separate profiled run (scripts).
"""

from __future__ import annotations

import torch

from lowerings import counters
from lowerings.protocol import Lowering, LoweringResult
from oracle import reference
from oracle.case import Case
from oracle.inputs import GuardedBuffer, Inputs, poison_bits
from parity.engine import answers
from oracle import footprint
from lowerings import calls as hooks
from parity.engine import ports
from parity.engine.device_memory import ISOLATION
from parity.engine import result_bits as rb
from parity.engine.invocation import LoweringError, RunOptions, call_lowering, fresh_inputs, prepare_inputs
from parity.engine.judge import compare
from parity.engine.outcome import CaseOutcome


def block_slot_mask(case: Case, pool: torch.Tensor) -> torch.Tensor:
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
            changed = (rb.bit_view(old) != rb.bit_view(new))
            changed = changed.reshape(changed.shape[0], changed.shape[1], -1).any(-1) if case.layout == "NHD" else \
                changed.any(-1).any(1)
            allowed = block_slot_mask(case, new).to(changed.device)
            bad = changed & ~allowed
            if bool(bad.any()):
                page, slot = (int(x) for x in bad.nonzero()[0])
                owner = next((b for b, row in enumerate(case.pages) if page in row), None)
                who = f"request {owner}'s" if owner is not None else "a spare"
                msgs.append(f"input mutated: {name} changed at {int(bad.sum())} slot(s) the lowering may not write; "
                            f"first: page {page} slot {slot} ({who} page)")
        elif old.shape != new.shape or not torch.equal(rb.bit_view(old), rb.bit_view(new)):
            msgs.append(f"input mutated: {name} was changed by the lowering (inputs must stay as given)")
    return msgs


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


def differing_requests(a: torch.Tensor, b: torch.Tensor) -> list[int]:
    diff = (rb.bit_view(a) != rb.bit_view(b)).reshape(a.shape[0], -1).any(-1)
    return [int(i) for i in diff.nonzero().flatten()]


def negate_context(inputs: Inputs, b: int) -> None:
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
                   ref: reference.OracleResult, tol, outcome: CaseOutcome | None = None,
                   pristine: Inputs | None = None) -> list[str]:
    """Second run with the other canary (NaN <-> large finite value in every slot no request owns):

    - a deterministic lowering must give the same bits in everything it returns (output, LSE, each
      partial); where it does not, a third run with the first canary and a fourth with the other tell a
      read outside the request's keys (third == first and fourth == second, everything compared) from
      nondeterminism across identical runs (anything else; when only the first call differs and the
      later ones agree, it depends on state left by a previous call);
    - a lowering that does not claim determinism is judged again against the oracle.
    Then, for a third of the cases with B >= 2 (by seed), isolation: negating the last request's context
    must leave every other request's output bit-identical.
    `pristine`: the case's inputs as first given (opts.canary), copied for the runs with that canary
    instead of building them again (`fresh_inputs`).
    """
    msgs: list[str] = []
    other = "large" if opts.canary != "large" else "nan"
    second_in, _ = prepare_inputs(lowering, case, opts, other)
    try:
        second = call_lowering(lowering, second_in, CaseOutcome(lowering.name, case, "pass"))
    except LoweringError as err:
        return [f"second run (canary {other}): {err}"]
    if not lowering.deterministic:
        comp = compare(f"output with {other} canaries", second.out, None, ref.out, ref.lse, dtype=case.dtype, tol=tol)
        return comp.failures
    firsts, seconds = rb.parts_of(first), rb.parts_of(second)
    if rb.differing_parts(firsts, seconds):  # everything it returns: output, LSE, each partial
        del second_in  # its result is kept; the third and fourth runs need one more set of inputs each, in turn
        try:
            third = call_lowering(lowering, fresh_inputs(lowering, case, opts, pristine=pristine)[0],
                                  CaseOutcome(lowering.name, case, "pass"))
        except LoweringError as err:
            return [f"third run: {err}"]
        try:
            fourth = call_lowering(lowering, prepare_inputs(lowering, case, opts, other)[0],
                           CaseOutcome(lowering.name, case, "pass"))
        except LoweringError as err:
            return [f"fourth run: {err}"]
        thirds, fourths = rb.parts_of(third), rb.parts_of(fourth)
        same_canary = rb.differing_parts(firsts, thirds) or rb.differing_parts(seconds, fourths)
        if not same_canary:
            what, reqs = rb.differing_requests(firsts, seconds)
            what = f"the {what}" if what in ("output", "LSE") else what
            msgs.append(f"read outside the request's keys: {what} of request(s) {reqs} changed when the pool slots "
                        f"no request owns (spare pages, the tail of each last page) held {other} instead of {opts.canary}")
        else:
            odd_first = not rb.differing_parts(thirds, seconds) and not rb.differing_parts(fourths, seconds)
            detail = (f"a run on the same inputs (same canary {opts.canary}) changed "
                      f"{rb.describe_diffs(rb.differing_parts(firsts, thirds) or rb.differing_parts(seconds, fourths))}")
            if odd_first:
                detail += "; only the first call (after a different case) differs, the later ones agree"
            msgs.append(rb.nondeterminism_message(detail, odd_first))
        return msgs
    B, memory = case.batch_size, ports.current().memory
    if B >= 2 and case.seed % 3 == 0 and case.context_lens[-1] > 0 and (outcome is None or memory.fits(
            outcome, ISOLATION, case, opts, footprint.input_bytes(case) * (1 + footprint.LOWERING_COPIES),
            "the perturbed inputs of the request-isolation run")):
        del second_in
        pert, _ = fresh_inputs(lowering, case, opts, pristine=pristine)
        negate_context(pert, B - 1)
        try:
            res = call_lowering(lowering, pert, CaseOutcome(lowering.name, case, "pass"))
        except LoweringError as err:
            return [f"isolation run: {err}"]
        leaked = [b for b in differing_requests(first.out, res.out) if b != B - 1]
        if leaked:
            msgs.append(f"request isolation: negating request {B - 1}'s context changed the output of request(s) {leaked}")
    return msgs


def cuda_kernel_names(prof) -> list[str]:
    """The names of the device activities (kernels, copies, sets) a `torch.profiler.profile` recorded, in
    order. Read from the profiler's raw results: building `prof.events()` (every CPU op's `FunctionEvent`,
    their tree) costs more than the profiled call at small shapes, and only the device events are needed.
    `prof.events()` when the raw results are not there (another torch); `tests/lowerings/test_kernel_names.py`
    checks on the GPU that both give the same names."""
    raw = getattr(getattr(prof, "profiler", None), "kineto_results", None)
    if raw is not None:
        try:
            return [e.name() for e in raw.events() if str(e.device_type()).endswith("CUDA")]
        except (AttributeError, TypeError, RuntimeError):
            pass
    return [e.name for e in prof.events() if getattr(e, "device_type", None) is not None
            and str(e.device_type).endswith("CUDA")]


def kernel_name_failures(lowering: Lowering, case: Case, seen: list[str]) -> list[str]:
    """`seen` (device activity names, in order) against the lowering's `kernel_families(case)` and
    `forbidden_kernel_families(case)`."""
    forbidden = hooks.call_optional(lowering, "forbidden_kernel_families", case, case=case, default={},
                                    expect=answers.kernel_families_answer)
    families = hooks.call(lowering, "kernel_families", case, case=case, expect=answers.kernel_families_answer)
    return counters.kernel_name_failures(seen, families, forbidden)


class KernelNames:
    """The CUDA kernel names of the judged call itself (`parity.engine.case_run`: a case whose kernel names are read):
    `start()` right before it, `stop()` right after it (also when it raised), then `failures(lowering, case)`.
    Each synchronizes the device first, so the profile holds that call's device work and no other: the oracle's
    and the yardstick's kernels queued before it are done, the call's own are done before the profiler stops.

    Profiling the judged call reads the names of the kernels whose output was judged."""

    def __init__(self) -> None:
        self.seen: list[str] | None = None
        self._prof = None

    def start(self) -> None:
        from torch.profiler import ProfilerActivity, profile

        torch.cuda.synchronize()
        self._prof = profile(activities=[ProfilerActivity.CUDA])
        self._prof.__enter__()

    def stop(self) -> None:
        if self._prof is None:
            return
        prof, self._prof = self._prof, None
        try:
            torch.cuda.synchronize()
        finally:
            prof.__exit__(None, None, None)  # never leave a profiler running: the next case starts its own
        self.seen = cuda_kernel_names(prof)

    def failures(self, lowering: Lowering, case: Case) -> list[str]:
        return kernel_name_failures(lowering, case, self.seen or [])


def gpu_kernel_failures(lowering: Lowering, case: Case, opts: RunOptions, pristine: Inputs | None = None) -> list[str]:
    """Run once more under torch.profiler (on `pristine`, the inputs as first given, when kept: the last
    call of a case, so they are used up); the CUDA kernel names must match the lowering's declaration. A
    separate run, for scripts; `run_case` profiles the judged call instead (`KernelNames`)."""
    inputs, _ = fresh_inputs(lowering, case, opts, pristine=pristine, take=True)
    names = KernelNames()
    names.start()
    try:
        call_lowering(lowering, inputs, CaseOutcome(lowering.name, case, "pass"))
    except LoweringError as err:
        return [f"profiled run: {err}"]
    finally:
        names.stop()
    return names.failures(lowering, case)
