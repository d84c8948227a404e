"""What the golden reference costs on a GPU: per drawn `gpu`-profile case (the `context` lowering's limits), the fp32
Triton engine's time, the golden reference's (`parity.engine.golden`: fp64 through the torch engine where fp32 cannot be
proven), and the working-dtype yardstick's, in ms (CUDA events around each, after one warm-up case).

    PYTHONPATH=. python lab/golden_cost.py [CASES]
"""

from __future__ import annotations

import statistics
import sys
import time

import torch
from hypothesis import HealthCheck, Phase, given, settings

import lowerings
from oracle import attention, materialize
from oracle.reference import working_dtype_output
from parity.engine.golden import GoldenOracle
from parity.engine.policy import load as load_policy
from strategies import cases, limits_for

POLICY = load_policy(None)
ROWS: list[tuple] = []


def timed(fn) -> tuple[float, object]:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    return 1e3 * (time.perf_counter() - t0), out


def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 40
    low = lowerings.get("context")

    @settings(max_examples=n, deadline=None, database=None, derandomize=True, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(case=cases(low, limits=limits_for(low, "cuda", profile="gpu")))
    def one(case):
        x = materialize(case, "cuda")
        tol = POLICY.for_case("context", case.dtype, ())[0]
        f32, _ = timed(lambda: attention(x))

        def golden():
            g = GoldenOracle(x, tol)
            return g, g.confirm(tol, g.attention())

        gold, (g, _) = timed(golden)
        yard, _ = timed(lambda: working_dtype_output(x))
        ROWS.append((case.short()[:80], f32, gold, yard, g.precision))

    one()
    ROWS.pop(0)  # the warm-up case (compiles)
    for r in ROWS:
        print(f"{r[1]:8.2f} {r[2]:8.2f} {r[3]:8.2f}  {r[4]}  {r[0]}")
    for i, name in ((1, "fp32 triton"), (2, "golden"), (3, "yardstick")):
        xs = [r[i] for r in ROWS]
        print(f"{name:12s} median {statistics.median(xs):8.2f} ms  sum {sum(xs) / 1e3:7.2f} s")
    print("precisions:", {p: sum(1 for r in ROWS if r[4] == p) for p in ("float32", "float64")})
    return 0


if __name__ == "__main__":
    sys.exit(main())
