"""The yardstick of the judge's yardstick rule: what the working dtype costs a correct kernel on a case.

The rule (docs/tolerances.md) bounds a lowering's error by a multiple of the yardstick's, `max |Y - O_ref|`, plus a
floor. `Y` is the case attended in the working dtype's real arithmetic, as flash-attn's test rule has it (there: a
reference run in the working dtype, scores and probabilities rounded). Here, in the order of flash kernels, which is
what the rule compares a kernel with: fp32 scores of exact products (their error grows with the size of the scores,
as every fp32-score kernel's does), the weights rounded to the working dtype before `P.V`, fp32 sums, the output
rounded once (`oracle.reference.working_dtype_output`). Scores rounded to the working dtype (the einsum of
flash-attn's reference in bf16) are not taken: no kernel under test rounds them, and at large scores they would
waive the rule altogether.

- `working-dtype` (the default, `WorkingDtype`): that computation, one pass of the oracle's engine.
- `rounded-oracle` (`RoundedOracle`, the default before issue 47): the oracle's output rounded to the working dtype.
  Its error is at most half an ulp by construction, so the rule is then a fixed 2-3 ulp bound: kept for comparison.
- any lowering's name, e.g. `sdpa`: its output (torch SDPA in the working dtype: fp32 inside, output rounded).
"""

from __future__ import annotations

from typing import Any

from oracle.reference import attention, kv_read_exactly, working_dtype_output

WORKING_DTYPE = "working-dtype"
ROUNDED_ORACLE = "rounded-oracle"
DEFAULT = WORKING_DTYPE
BUILT_IN = (WORKING_DTYPE, ROUNDED_ORACLE)  # computed by the oracle's engine, never a lowering's `run`
DESCRIPTIONS = {
    WORKING_DTYPE: "the working-dtype reference's (fp32 scores, P rounded to {dtype} before P.V, output rounded)",
    ROUNDED_ORACLE: "the rounded oracle's",
}


class WorkingDtype:
    """The default yardstick (module docstring): reads its inputs only, never a copy."""

    name = WORKING_DTYPE
    reads_inputs_only = True

    def output(self, inputs, oracle_out=None):
        """`[B, K, Hq, D]` in the working dtype (`oracle_out` unused: a pass of its own)."""
        return working_dtype_output(inputs)

    def __repr__(self) -> str:
        return f"<yardstick {self.name}>"


class RoundedOracle(WorkingDtype):
    """The oracle's fp32 output (`oracle_out`, or a pass over the working dtype's values) rounded once."""

    name = ROUNDED_ORACLE

    def output(self, inputs, oracle_out=None):
        if oracle_out is not None and kv_read_exactly(inputs.case):
            return oracle_out.to(inputs.q.dtype)
        return attention(inputs, kv_rounded=True).out.to(inputs.q.dtype)


def describe(name: str | None, dtype: str) -> str:
    """How a failure names the yardstick's error ("the working-dtype reference's (...)")."""
    text = DESCRIPTIONS.get(name or "", f"the yardstick {name}'s" if name else "the yardstick's")
    return text.format(dtype=dtype)


def get(name: str) -> Any:
    """The yardstick called `name`: `working-dtype`, `rounded-oracle`, or the registered lowering of that name."""
    if name == WORKING_DTYPE:
        return WorkingDtype()
    if name == ROUNDED_ORACLE:
        return RoundedOracle()
    import lowerings

    return lowerings.get(name)
