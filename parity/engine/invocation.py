"""Calling a lowering: its inputs, the call itself with its kernel counters, and what it may return.

- `RunOptions`: what `run_case` checks besides the numbers (one frozen value, sent to isolated workers).
- `prepare_inputs`: the case's tensors for one call, with poisoned output buffers for a lowering that
  declares `writes_given_output`; `fresh_inputs`: the same from a pristine copy when one is kept.
- `call_lowering`: `lowering.run(inputs)` inside a `KernelCounter` (counted calls, observed flashinfer
  calls, compilations recorded on the outcome); anything the lowering raises, an exit included, and a
  result the judge cannot read (`parity.engine.answers.result_problem`: the wrong type, a tensor on the wrong
  device, of the wrong shape or dtype, no LSE, a malformed partial) become a `LoweringError`: a failure of
  that lowering, never of the run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lowerings import counters
from lowerings.protocol import Lowering, LoweringResult, writes_given_output
from oracle.case import Case
from oracle.errors import InvalidInput
from oracle.inputs import GuardedBuffer, Inputs, attach_output_buffers, materialize
from lowerings import calls as hooks
from parity.engine import ports
from parity.engine.device_memory import OutOfDeviceMemory
from parity.engine.answers import result_problem

if TYPE_CHECKING:
    from parity.engine.outcome import CaseOutcome


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
    # The device memory a case may use, in bytes (None: measured before each step, parity.engine.device_memory): a
    # hardening step whose tensors would not fit is skipped and says so in the outcome and the report.
    memory_bytes: int | None = None

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RunOptions":
        return cls(**data)


def prepare_inputs(lowering: Lowering, case: Case, opts: RunOptions, canary: str | None = None
                   ) -> tuple[Inputs, tuple[GuardedBuffer, GuardedBuffer] | None]:
    """The case's tensors for one call of `lowering`, with poisoned output buffers when it writes given ones."""
    inputs = materialize(case, opts.device, canary=canary or opts.canary)
    bufs = None
    if opts.check_output_buffers and writes_given_output(lowering):
        bufs = attach_output_buffers(inputs)
    return inputs, bufs


def fresh_inputs(lowering: Lowering, case: Case, opts: RunOptions, canary: str | None = None,
                 pristine: Inputs | None = None, *, take: bool = False
                 ) -> tuple[Inputs, tuple[GuardedBuffer, GuardedBuffer] | None]:
    """`prepare_inputs`, or, when `pristine` holds the case's inputs with the same canary as never given to
    a lowering, a device copy of them (`take`: `pristine` itself, which the caller needs no more) with new
    output buffers: the same bits as building them again (a case's build is deterministic on its device),
    without the per-request work of a build."""
    if pristine is None or pristine.case is not case or pristine.canary != (canary or opts.canary):
        return prepare_inputs(lowering, case, opts, canary)
    inputs = pristine if take else pristine.clone()
    inputs.out = inputs.lse_out = None
    bufs = None
    if opts.check_output_buffers and writes_given_output(lowering):
        bufs = attach_output_buffers(inputs)
    return inputs, bufs


def call_lowering(lowering: Lowering, inputs: Inputs, outcome: CaseOutcome) -> LoweringResult:
    """`lowering.run(inputs)`, its counted calls, observed flashinfer calls and compilations recorded on
    `outcome`; `LoweringError` when it raises (an exit included) or returns a result the judge cannot read
    (`parity.engine.answers.result_problem`); `parity.engine.device_memory.OutOfDeviceMemory` when it runs out of
    device memory (`parity.engine.case_run.run_case` judges the case again, alone)."""
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
            if ports.current().memory.is_out_of_memory(err):  # the device's condition: judged again alone
                raise OutOfDeviceMemory(f"{lowering.name} ran out of device memory: "
                                               f"{hooks.describe_exception(err, lowering)}") from None
            # where in the lowering's own file (a plugin's), and the innermost frame (torch's, ...)
            raise LoweringError(f"{lowering.name} raised {hooks.describe_exception(err, lowering)}") from None
    outcome.calls = dict(kc.calls)
    outcome.observed = dict(kc.observed)
    outcome.compiles = dict(kc.compiles)
    problem = result_problem(lowering, inputs, result)  # the wrong type, device, shape or dtype: its failure
    if problem:
        raise LoweringError(problem)
    return result

