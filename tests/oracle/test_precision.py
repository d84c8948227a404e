"""The oracle's error bound (`oracle.precision`) and the golden reference built on it (`parity.engine.golden`).

- The bound is never below a measured error: the fp32 torch engine against fp64 on drawn cases of every value
  regime (output and LSE). A bound with a too-small score term (a mutant) is caught by the same check.
- The golden reference keeps its share of the tightest bound at most 1/10: fp32 where the bound proves it, fp64
  otherwise, and fp64 again after the bounds that applied are known (`confirm`).
- `scripts/oracle_error.py` on a sample: exit 0, a line per regime and dtype.
"""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given

import lowerings
import oracle.precision as prec
from oracle import attention, materialize
from oracle.case import VALUE_REGIMES
from parity.engine.golden import GoldenOracle, share, tightest
from parity.engine.policy import load as load_policy
from strategies import cases, limits_for, profile_settings, with_overrides
from tests.oracle.oracle_cases import build_case

ROOT = Path(__file__).resolve().parents[2]
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # the Triton engine compiled on a GPU, interpreted on a CPU
TOL = {d: load_policy(None).for_case("x", d, ())[0] for d in ("bfloat16", "float16")}


def _measured(inputs):
    r32, r64 = attention(inputs), attention(inputs, precision=torch.float64)
    out = (r32.out.double() - r64.out).abs().max().item() if r64.out.numel() else 0.0
    fin = torch.isfinite(r64.lse)
    lse = (r32.lse.double() - r64.lse)[fin].abs() if fin.any() else torch.zeros(0, dtype=torch.float64)
    return out, lse, r64.lse[fin].abs()


def _holds(b: prec.ErrorBound, inputs) -> tuple[float, float]:
    """(measured output error / bound, worst measured LSE error / its bound)."""
    out, lse, mag = _measured(inputs)
    lr = (lse / (b.lse_const + b.lse_rel * mag)).max().item() if lse.numel() else 0.0
    return (out / b.out_abs if b.out_abs > 0 else 0.0), lr


def _limits(regime):
    lim = limits_for(lowerings.get("sdpa"), "cpu")
    return with_overrides(lim, {"values": (regime,), "max_context": 700, "max_production_context": 0})


@pytest.mark.parametrize("regime", VALUE_REGIMES)
def test_the_bound_holds_on_drawn_cases(regime):
    worst: list[float] = []

    @profile_settings("ci", max_examples=5)
    @given(case=cases(lowerings.get("sdpa"), limits=_limits(regime)))
    def check(case):
        inputs = materialize(case, "cpu")
        out, lse = _holds(prec.bound(prec.case_stats(inputs), torch.float32, "torch"), inputs)
        assert out <= 1 and lse <= 1, f"{case.short()}: measured/bound output {out:.3g}, LSE {lse:.3g}"
        worst.append(max(out, lse))

    check()
    assert worst


def test_a_bound_without_its_score_term_is_caught(monkeypatch):
    """The check above can fail: at `huge` scores the fp32 scores' error is most of the oracle's, and a bound whose
    dot-product term is one rounding instead of D + 2 is below the measured error."""
    case = dataclasses.replace(build_case((128,), 1, 3, 6, 128, 16, dtype="float16"), values="huge", seed=62)
    inputs = materialize(case, "cpu")
    stats = prec.case_stats(inputs)
    assert max(_holds(prec.bound(stats), inputs)) <= 1
    weak = dataclasses.replace(stats, A=stats.A / (stats.D + 2), D=1)  # the score term of a single rounding
    assert max(_holds(prec.bound(weak), inputs)) > 1


def test_stats_read_only_owned_keys():
    """Canary slots (NaN) and spare pages never reach the statistics; fp8 scales multiply in."""
    case = build_case((5, 40), 3, 2, 2, 64, 16, kv_dtype="float8_e4m3fn", k_scale=0.5, v_scale=4.0)
    inputs = materialize(case, "cpu")
    st = prec.case_stats(inputs)
    assert math.isfinite(st.A) and math.isfinite(st.V) and st.n == 43 and st.D == 64
    v = inputs.v_pool.float()
    most = max(v[torch.isfinite(v)].abs().max().item() * 4.0, inputs.v_block.float().abs().max().item())
    assert most / 1.01 <= st.V <= most * prec.STATS_MARGIN


@pytest.mark.parametrize("engine", ["torch", "triton"])
def test_stats_of_both_engines_read_only_owned_keys(engine):
    """The same for the Triton engine's one launch, beside the torch one: canary slots (NaN)
    and spare pages never reach the statistics. Where a canary does reach them (a page table pointing a request at
    a canary page), the statistics turn non-finite: the check can fail."""
    case = build_case((5, 40), 3, 2, 2, 64, 16, kv_dtype="float8_e4m3fn", k_scale=0.5, v_scale=4.0)
    inputs = materialize(case, DEVICE)
    st = prec.case_stats(inputs, engine)
    assert math.isfinite(st.A) and math.isfinite(st.V)
    case = dataclasses.replace(case, kv_dtype="bfloat16", k_scale=1.0, v_scale=1.0)  # the interpreter reads an
    inputs = materialize(case, DEVICE)  # fp8 NaN as 480 (the compiled kernel as NaN): bf16 keys for the canary
    assert math.isfinite(prec.case_stats(inputs, engine).A)
    owned = set(sum(case.pages, ()))
    spare = next(p for p in range(inputs.k_pool.shape[0]) if p not in owned)
    table = inputs.page_table.clone()
    table[1, 0] = spare  # request 1's first page (positions 0-15, all owned) now a page of NaN keys
    bad = dataclasses.replace(inputs, page_table=table)
    bad.k_pool[spare] = float("nan")
    assert not math.isfinite(prec.case_stats(bad, engine).A)


@pytest.mark.parametrize("layout,storage,kv,D", [("NHD", "dense", None, 64), ("HND", "appended", None, 16),
                                                 ("NHD", "appended", "float8_e4m3fn", 16),
                                                 ("HND", "dense", "float8_e4m3fn", 64)])
def test_the_triton_statistics_equal_the_torch_ones(layout, storage, kv, D):
    """One launch against the torch ops: the same A and V to fp32's rounding, n and D equal."""
    for lens, K, hkv, G in [((0, 37, 5), 3, 2, 3), ((300,), 5, 1, 4), ((1, 1), 1, 3, 1)]:
        case = build_case(lens, K, hkv, G, D, 16, layout=layout, block_storage=storage, kv_dtype=kv,
                          k_scale=0.25 if kv else 1.0, v_scale=3.0 if kv else 1.0)
        inputs = materialize(case, DEVICE)
        a, b = prec.case_stats(inputs, "torch"), prec.case_stats(inputs, "triton")
        assert (a.n, a.D) == (b.n, b.D)
        assert b.A == pytest.approx(a.A, rel=1e-6) and b.V == pytest.approx(a.V, rel=1e-6), case.short()


def test_fp64_is_golden_everywhere_fp32_is_not():
    inputs = materialize(dataclasses.replace(build_case((128,), 1, 3, 6, 128, 16, dtype="float16"), values="huge",
                                             seed=62), "cpu")
    st = prec.case_stats(inputs)
    tight = tightest(TOL["float16"], "float16", 3.0, 1.0, st.A, True)
    assert share(prec.bound(st, torch.float64), tight, 0.0, st.A) < 1e-4
    assert share(prec.bound(st, torch.float32), tight, 0.0, st.A) > prec.GOLDEN_SHARE


def test_tightest_takes_the_smallest_bound():
    """The relative L2 bound as a bound on every element (`rel_l2 x rms(O)`) binds in bf16 (1e-2 against two ulps,
    1.6e-2 of the binade); in fp16 the yardstick's floor (2e-3) binds where rms(O) is over a fifth of max|O|."""
    tol = TOL["float16"]
    t = tightest(tol, "float16", 1.0, 1.0, 0.0, True)
    assert t.out_from == "yardstick_floor_ulp" and t.out_abs == pytest.approx(2 * 2 ** -10)
    assert tightest(tol, "float16", 1.0, 0.5, 0.0, False).out_from == "out_rel_l2"
    assert tightest(dataclasses.replace(tol, out_max_ulp=1.0), "float16", 1.0, 0.5, 0.0, False).out_from == "out_max_ulp"
    assert tightest(TOL["bfloat16"], "bfloat16", 1.0, 1.0, 0.0, True).out_from == "out_rel_l2"


@pytest.mark.parametrize("values,dtype,expect", [("tiny", "bfloat16", "float32"), ("huge", "float16", "float64")])
def test_the_golden_oracle_picks_the_precision_its_bounds_need(values, dtype, expect):
    case = dataclasses.replace(build_case((40, 7), 2, 2, 2, 64, 16, dtype=dtype), values=values)
    inputs = materialize(case, "cpu")
    g = GoldenOracle(inputs, TOL[dtype])
    ref = g.confirm(TOL[dtype], g.attention())
    assert g.precision == expect and g.oracle_share <= prec.GOLDEN_SHARE and g.problem() is None
    truth = attention(inputs, precision=torch.float64)
    assert (ref.out.double() - truth.out).abs().max().item() <= g.error_bound().out_abs


def test_confirm_moves_to_fp64_when_fp32_no_longer_holds():
    """A guess of fp32 that the bounds applied after the lowering ran do not support: the reference is recomputed."""
    case = dataclasses.replace(build_case((40, 7), 2, 2, 2, 64, 16), values="tiny")
    inputs = materialize(case, "cpu")
    g = GoldenOracle(inputs, TOL["bfloat16"])
    assert g.precision == "float32"
    strict = dataclasses.replace(TOL["bfloat16"], out_max_ulp=1e-9, yardstick_floor_ulp=1e-9, out_rel_l2=1e-12)
    ref = g.confirm(strict, g.attention())
    assert g.precision == "float64" and ref.out.dtype == torch.float64


def test_a_case_no_precision_can_judge_is_bad_input():
    g = GoldenOracle(materialize(build_case((4,), 1, 1, 1, 16, 16), "cpu"), TOL["bfloat16"])
    g.oracle_share = 0.5
    assert g.problem() is not None and g.problem().startswith("scale: the oracle's own error bound is 0.5")


def test_the_error_script_runs_on_a_sample():
    got = subprocess.run([sys.executable, str(ROOT / "scripts" / "oracle_error.py"), "--cases", "4",
                          "--regimes", "plain,huge"], cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
    assert got.returncode == 0, got.stdout + got.stderr
    lines = [ln for ln in got.stdout.splitlines() if ln.startswith(("plain", "huge"))]
    assert len(lines) == 4 and "of the tightest bound (promise 0.1)" in got.stdout


def test_the_statistics_name_a_bad_engine(monkeypatch):
    inputs = materialize(build_case((3,), 1, 1, 1, 16, 4), "cpu")
    with pytest.raises(prec.InvalidInput, match="engine: one of"):
        prec.case_stats(inputs, "cuda")
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # CPU tensors, the compiled kernel: refused, not a Triton traceback
    with pytest.raises(prec.InvalidInput, match="engine: 'torch' or 'auto' for tensors on cpu"):
        prec.case_stats(inputs, "triton")


@pytest.mark.parametrize("f64_ready", [True, False])
def test_on_the_triton_engine_fp64_needs_no_guess(monkeypatch, f64_ready):
    """Where the Triton engine attends in fp64 (the `F64` variant compiles), the golden reference takes fp64 at once and
    reads the statistics only after the attention (no wait before it); where it does not, the guess decides as on the
    torch engine (a `tiny` case: fp32)."""
    import oracle.reference as ref_mod

    monkeypatch.setattr(ref_mod, "triton_f64_ready", lambda device: f64_ready)
    case = dataclasses.replace(build_case((40, 7), 2, 2, 2, 16, 16), values="tiny")
    inputs = materialize(case, DEVICE)
    g = GoldenOracle(inputs, TOL["bfloat16"], engine="triton")
    assert g.precision == ("float64" if f64_ready else "float32")
    assert (g._stats is None) == f64_ready  # read at first use: after the attention
    ref = g.confirm(TOL["bfloat16"], g.attention())
    assert g.oracle_share <= prec.GOLDEN_SHARE and g.problem() is None and g._stats is not None
    truth = attention(inputs, engine="torch", precision=torch.float64)
    assert (ref.out.double() - truth.out).abs().max().item() <= g.error_bound().out_abs
