"""What the judge's oracle phase and the yardstick cost per case on a GPU, and the fp64 kernel against the fp32 one.

    PYTHONPATH=. python lab/oracle_phase_cost.py [CASES_PER_LOWERING]

1. Per drawn `gpu`-profile case of a few lowerings (the run-11 kinds: context, decode rows, windowed merge, hybrid),
   one process, after a warm-up case: the oracle phase as the judge runs it (`GoldenOracle`, its attention, the
   statistics read, the output summary, `confirm`) and the working-dtype yardstick, wall ms with the device
   synchronized before and after, and the host ms of the same calls without the final synchronize (what the
   process spends launching). Medians and sums.
2. The Triton engine's fp32 and fp64 attention on the same drawn cases and on production shapes (B=32, 64/8 heads,
   D=128, L in 8K and 32K; B=1 L=128K): CUDA-event ms, median of 5. The golden reference runs fp64 on a GPU only
   where this says it costs about what fp32 does (`parity.engine.golden`).
"""

from __future__ import annotations

import statistics
import sys
import time

import torch
from hypothesis import HealthCheck, Phase, given, settings

import lowerings
from oracle import Case, attention, materialize
from oracle.reference import working_dtype_output
from parity.engine.golden import GoldenOracle
from parity.engine.policy import load as load_policy
from strategies import cases, limits_for

from gpu_oracle_bench import timed  # lab/, beside this script

POLICY = load_policy(None)
LOWERINGS = ("context", "decode_rows", "windowed_merge[triton]", "hybrid_paged")


def wall(fn, sync_after: bool = True) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    if sync_after:
        torch.cuda.synchronize()
    return 1e3 * (time.perf_counter() - t0)


def events(fn, reps: int = 5) -> float:
    """The median of `reps` CUDA-event timings after a warm call, in ms (lab/gpu_oracle_bench.py's `timed`)."""
    return timed(fn, reps)[0]


def oracle_phase(x, tol) -> str:
    g = GoldenOracle(x, tol)
    ref = g.attention()
    g.fits_fp32()
    ref.summary()
    g.confirm(tol, ref)
    return g.precision


def drawn(n: int) -> list[tuple]:
    rows: list[tuple] = []
    for name in LOWERINGS:
        first = len(rows)
        drawn_for(name, n, rows)
        if len(rows) > first:
            rows.pop(first)  # each lowering's first case (compiles, loads)
    return rows


def drawn_for(name: str, n: int, rows: list[tuple]) -> None:
    low = lowerings.get(name)

    @settings(max_examples=n, deadline=None, database=None, derandomize=True, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(case=cases(low, limits=limits_for(low, "cuda", profile="gpu")))
    def one(case):
        x = materialize(case, "cuda")
        tol = POLICY.for_case(name, case.dtype, ())[0]
        ms_oracle = wall(lambda: oracle_phase(x, tol))
        host_oracle = wall(lambda: oracle_phase(x, tol), sync_after=False)
        ms_yard = wall(lambda: working_dtype_output(x))
        host_yard = wall(lambda: working_dtype_output(x), sync_after=False)
        f32 = events(lambda: attention(x, engine="triton"))
        f64 = events(lambda: attention(x, engine="triton", precision=torch.float64))
        rows.append((name, case.short()[:70], ms_oracle, host_oracle, ms_yard, host_yard, f32, f64,
                     GoldenOracle(x, tol).precision))

    one()


def production() -> list[tuple]:
    out = []
    for B, L, hq, hkv in ((32, 8192, 64, 8), (32, 32768, 64, 8), (1, 131072, 16, 2)):
        per = -(-(L + 7) // 32)
        case = Case(context_lens=(L,) * B, block_size=7, num_q_heads=hq, num_kv_heads=hkv, head_dim=128,
                    page_size=32, pages=tuple(tuple(range(b * per, (b + 1) * per)) for b in range(B)),
                    num_pages=B * per + 1, block_storage="appended", seed=7)
        x = materialize(case, "cuda")
        f32 = events(lambda: attention(x, engine="triton"))
        f64 = events(lambda: attention(x, engine="triton", precision=torch.float64))
        out.append((f"B={B} L={L} {hq}/{hkv}", f32, f64))
        del x
        torch.cuda.empty_cache()
    return out


def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 25
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}")
    rows = drawn(n)
    print("lowering | case | oracle ms | oracle host ms | yardstick ms | yardstick host ms | fp32 kernel ms | "
          "fp64 kernel ms | precision")
    for r in rows:
        print(" | ".join(f"{v:.3f}" if isinstance(v, float) else str(v) for v in r))
    for i, what in ((2, "oracle phase"), (3, "oracle host"), (4, "yardstick"), (5, "yardstick host"),
                    (6, "fp32 attention"), (7, "fp64 attention")):
        xs = [r[i] for r in rows]
        print(f"{what:16s} median {statistics.median(xs):7.3f} ms  mean {statistics.mean(xs):7.3f} ms  "
              f"({len(xs)} cases)")
    print("precisions:", {p: sum(1 for r in rows if r[8] == p) for p in ("float32", "float64")})
    print("production shape | fp32 ms | fp64 ms | fp64/fp32")
    for name, a, b in production():
        print(f"{name} | {a:.2f} | {b:.2f} | {b / a:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
