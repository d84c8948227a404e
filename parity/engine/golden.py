"""The golden reference of one case: the oracle in the precision that keeps its own error negligible.

The judge never lets the reference's own error reach `oracle.precision.GOLDEN_SHARE` (1/10) of the tightest bound
it applies to the case: its error bound (`oracle.precision.bound`, from the case's values, the precision and the
engine) divided by that tightest bound is the case's *oracle share*. A share above 1/10 even in fp64 (values near
fp64's own range) makes the case bad input, never a verdict. Pure: no I/O, no processes.

Which precision: on a GPU whose Triton compiles the oracle kernel's `F64` variant, always fp64. There the guess below
gave fp64 to nearly every drawn case and to every production shape (the bound grows with the keys); the fp64 kernel
costs what the fp32 one does on short contexts and a few times more on long ones, on the device, where 15 processes
side by side leave it room; and without a guess no case waits for the device before its attention: the statistics
are read once, after it, with the output's figures (docs/gpu/README.md, the oracle's records).

Elsewhere (the torch engine) fp32 where the share is provably at most 1/10, else fp64 (most cases: the bound is a
worst case): `GoldenOracle(inputs, tol)` guesses before the attention runs, from the case's statistics and bounds as
they would be with `max|O|` at a quarter of `max|v|` (`TRY_FP32_BELOW`), whether fp32 is worth a try;
`confirm(tol, ref)` checks the bounds that applied once the lowering ran (which kernels ran chooses them) against the
reference's own figures, and recomputes it in fp64 where fp32 no longer holds. Every reference of the case (its
partials' too) then comes from the same precision.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from oracle import reference
from oracle.inputs import Inputs
from oracle.precision import GOLDEN_SHARE, CaseStats, ErrorBound, bound, pending_case_stats
from oracle.ulp import ulp
from parity.engine.tolerance import Tolerance

PRECISIONS = {"float32": torch.float32, "float64": torch.float64}
FP32_MAX = float(torch.finfo(torch.float32).max)
TRY_FP32_BELOW = 4.0  # fp32 is tried first where it would hold with max|O| at 1/4 of max|v| (`confirm` decides)


@dataclass(frozen=True)
class Tightest:
    """The tightest bounds the judge applies to one output: `out_abs` (output units, over every element) and the
    LSE's `lse_abs + lse_rel |LSE|` per row, with the criterion that set `out_abs`."""

    out_abs: float
    lse_abs: float
    lse_rel: float
    out_from: str


def tightest(tol: Tolerance, dtype: str, ref_max: float, ref_rms: float, lse_max: float,
             yardstick: bool) -> Tightest:
    """The tightest output bound of `tol` on an output whose reference has `max|O| = ref_max` and root mean square
    `ref_rms`, scores up to `lse_max` (max |LSE|): the ulp bound, the yardstick rule's floor (its `factor x` the
    yardstick's error left out: the bound can only be looser), and the relative L2 bound as a bound on every
    element (an elementwise error `e` is an L2 error of at most `e sqrt(N)`)."""
    unit = ulp(ref_max, dtype) if ref_max > 0 else ulp(1.0, dtype)
    cands = {"out_max_ulp": tol.out_max_ulp * unit + tol.out_score_rel * lse_max * ref_max,
             "out_rel_l2": tol.out_rel_l2 * ref_rms}
    if yardstick:
        cands["yardstick_floor_ulp"] = tol.yardstick_floor_ulp * unit + tol.yardstick_score_rel * lse_max * ref_max
    key = min(cands, key=lambda k: cands[k])
    return Tightest(cands[key], tol.lse_abs, tol.lse_rel, key)


def share(err: ErrorBound, tight: Tightest, lse_min: float, lse_max: float) -> float:
    """The oracle's error as a share of the tightest bound: the largest of the output's and the LSE's (the LSE's
    per-row ratio, linear in |LSE|, is largest at one of the extremes of the finite rows' |LSE|)."""
    out = err.out_abs / tight.out_abs if tight.out_abs > 0 else (0.0 if err.out_abs == 0 else math.inf)
    lse = max(err.lse_abs(x) / (tight.lse_abs + tight.lse_rel * x) for x in (lse_min, lse_max))
    return max(out, lse)


def _ref_figures(ref: reference.OracleResult) -> tuple[float, float, float, float]:
    """`(max|O|, rms(O), min finite |LSE|, max finite |LSE|)` of a reference (`OracleResult.summary`: one transfer)."""
    s = ref.summary()
    return s.max_abs_out, s.rms_out, s.min_abs_lse, s.max_abs_lse


class GoldenOracle:
    """The case's oracle in the precision its bounds need (module docstring). `precision` ("float32"/"float64"),
    `engine` ("torch"/"triton") and `oracle_share` say how the case was judged; `stats` what the bound read."""

    def __init__(self, inputs: Inputs, tol: Tolerance, *, yardstick: bool = True, engine: str = "auto") -> None:
        self.inputs, self.yardstick = inputs, yardstick
        self.fast_engine = _fast_engine(inputs, engine)
        self._read_stats = pending_case_stats(inputs, "triton" if self.fast_engine == "triton" else "torch")
        self._stats: CaseStats | None = None
        self.oracle_share = math.nan
        if self.fast_engine == "triton" and reference.triton_f64_ready(inputs.q.device):
            self.precision = "float64"  # as fast as fp32 there (module docstring): no guess, no wait for statistics
            return
        V = self.stats.V / TRY_FP32_BELOW
        likely = tightest(tol, inputs.case.dtype, V, V, 0.0, yardstick)
        fast = bound(self.stats, torch.float32, self.fast_engine)
        fits = math.isfinite(fast.out_abs) and fast.out_abs <= GOLDEN_SHARE * likely.out_abs
        self.precision = "float32" if fits else "float64"

    @property
    def stats(self) -> CaseStats:
        """The case's statistics (`oracle.precision.case_stats`), read from the device at first use."""
        if self._stats is None:
            self._stats = self._read_stats()
        return self._stats

    @property
    def engine(self) -> str:
        """The engine the chosen precision runs on: the Triton kernel on a GPU (fp32, or its `F64` variant where the
        installed Triton compiles it: `oracle.reference.triton_f64_ready`), else torch."""
        if self.precision == "float64" and self.fast_engine == "triton":
            return "triton" if reference.triton_f64_ready(self.inputs.q.device) else "torch"
        return self.fast_engine

    def error_bound(self) -> ErrorBound:
        return bound(self.stats, PRECISIONS[self.precision], self.engine)

    def attention(self, **kw) -> reference.OracleResult:
        """`oracle.reference.attention` of the case in the chosen precision (partials: `window`, `key_mask`,
        `future_block_keys_right` as there), on `engine` (an explicit `key_mask` takes the torch engine)."""
        engine = "auto" if self.engine == "triton" else "torch"
        if self.precision == "float64":  # half the fp32 chunk: the same working set (oracle.footprint.oracle_bytes)
            return reference.attention(self.inputs, precision=torch.float64, engine=engine,
                                       chunk=reference.DEFAULT_CHUNK // 2, **kw)
        return reference.attention(self.inputs, engine=engine, **kw)

    def confirm(self, tol: Tolerance, ref: reference.OracleResult) -> reference.OracleResult:
        """`ref`, or the case's reference recomputed in fp64 when fp32's bound exceeds 1/10 of the tightest bound of
        `tol` on this very reference; sets `oracle_share` (the chosen precision's)."""
        mx, rms, lo, hi = _ref_figures(ref)
        tight = tightest(tol, self.inputs.case.dtype, mx, rms, hi, self.yardstick)
        s = share(self.error_bound(), tight, lo, hi)
        if self.precision == "float32" and not s <= GOLDEN_SHARE:
            self.precision = "float64"
            ref = self.attention()
            mx, rms, lo, hi = _ref_figures(ref)
            s = share(self.error_bound(), tightest(tol, self.inputs.case.dtype, mx, rms, hi, self.yardstick), lo, hi)
        self.oracle_share = s
        return ref

    def fits_fp32(self) -> bool:
        """Whether the case's scores and values stay inside fp32's range (`CaseStats.A`, `.V`)."""
        return max(self.stats.A, self.stats.V) < FP32_MAX

    def problem(self) -> str | None:
        """Why no verdict can stand on this case's reference (its share above 1/10 even in fp64), or None."""
        if self.oracle_share <= GOLDEN_SHARE:
            return None
        return (f"scale: the oracle's own error bound is {self.oracle_share:.3g} of the tightest bound on this case "
                f"even in fp64 (scores up to {self.stats.A:.3g}, values up to {self.stats.V:.3g}): no output could be "
                f"judged to 1/10 of its bound; give a case with smaller scales")


def _fast_engine(inputs: Inputs, engine: str) -> str:
    """The engine an fp32 oracle of `inputs` runs on: "triton" where `attention`'s auto choice compiles the Triton
    kernel (CUDA), "torch" otherwise (the interpreted kernel rounds as torch does)."""
    if engine != "auto":
        return engine
    return "triton" if inputs.q.device.type == "cuda" and reference.triton_engine_ready(inputs.q.device) else "torch"
