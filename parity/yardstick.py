"""The yardstick of the judge's yardstick rule: what the working dtype alone costs on a case.

The rule (docs/tolerances.md) bounds a lowering's error by a multiple of the yardstick's, `max |Y - O_ref|`,
where `Y` is the case attended in the working dtype the plain way. Two yardsticks give that `Y`:

- `rounded-oracle` (the default, `RoundedOracle`): the oracle's fp32 attention over the values a working-dtype
  computation reads (an fp8 pool dequantized and rounded to the working dtype), rounded to the working dtype
  (`oracle.reference.working_dtype_output`). For a pool in the working dtype it is the case's own oracle output,
  rounded: no second pass. For an fp8 pool, one more pass of the oracle's engine (one kernel on a GPU).
- any lowering's name, e.g. `sdpa` (the yardstick until session 24): its output. torch SDPA in the working dtype
  computes the same thing (fp32 inside, output rounded) in other fp32 sum orders, in 20-30 launches per batch
  of requests: 3.6-11.5 ms a case on the H200 (run 81's time lines, docs/gpu/runs/81-sweep*-parity.json.gz), the
  largest phase of most lowerings. `tests/parity/test_yardstick.py` measures the two against each other.
"""

from __future__ import annotations

from typing import Any

ROUNDED_ORACLE = "rounded-oracle"
DEFAULT = ROUNDED_ORACLE


class RoundedOracle:
    """The default yardstick (module docstring): reads its inputs only, never a copy."""

    name = ROUNDED_ORACLE
    reads_inputs_only = True

    def output(self, inputs, oracle_out):
        """`[B, K, Hq, D]` in the working dtype; `oracle_out`: the case's fp32 oracle output or None."""
        from oracle.reference import working_dtype_output

        return working_dtype_output(inputs, oracle_out)

    def __repr__(self) -> str:
        return f"<yardstick {self.name}>"


def get(name: str) -> Any:
    """The yardstick called `name`: `rounded-oracle`, or the registered lowering of that name (its output)."""
    if name == ROUNDED_ORACLE:
        return RoundedOracle()
    import lowerings

    return lowerings.get(name)
