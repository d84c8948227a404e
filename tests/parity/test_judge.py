"""Each criterion of the judge, the counters and the runner's extra checks can fail: one seeded bug each."""

from __future__ import annotations

import math
import time

import pytest
import torch

import lowerings
from lowerings import counters
from lowerings.protocol import BASE_2, LoweringResult
from lowerings.torch_emulation import DecodeRows, Sdpa
from oracle import Case, attention, materialize
from parity.engine import policy as policy_mod
from parity.engine.judge import compare
from parity.engine.runner import RunOptions, run_case

POL = policy_mod.load()
TOL = POL.for_lowering("x", "bfloat16")
CASE = Case(context_lens=(9, 0), block_size=3, num_q_heads=4, num_kv_heads=2, head_dim=16, page_size=4,
            pages=((0, 1, 2), (3,)), num_pages=5)


@pytest.fixture(scope="module")
def ref():
    return attention(materialize(CASE))


def test_the_oracle_against_itself_passes_with_zero_margin(ref):
    c = compare("output", ref.out, ref.lse, ref.out, ref.lse, dtype="bfloat16", tol=TOL)
    assert c.passed and c.margin == 0.0


def test_ulp_bound_fails_one_element_nine_ulps_off_and_names_it(ref):
    out = ref.out.clone()
    unit = c_unit = 2.0 ** (math.floor(math.log2(float(ref.out.abs().max()))) - 7)
    out[1, 2, 3, 5] += 9 * unit
    c = compare("output", out, ref.lse, ref.out, ref.lse, dtype="bfloat16", tol=TOL)
    assert not c.passed
    assert "9.00 ulp" in c.failures[0] and "request 1, query 2, head 3, dim 5" in c.failures[0]
    assert c.figures["worst_out"] == {"b": 1, "i": 2, "h": 3, "d": 5}
    out[1, 2, 3, 5] -= 2 * c_unit  # 7 ulps: inside the 8-ulp bound
    assert compare("output", out, ref.lse, ref.out, ref.lse, dtype="bfloat16", tol=TOL).passed


def test_rel_l2_fails_on_small_errors_everywhere(ref):
    out = ref.out * 1.02  # 2% everywhere: each element small, the norm not
    c = compare("output", out, ref.lse, ref.out, ref.lse, dtype="bfloat16", tol=TOL)
    assert any("relative L2" in f for f in c.failures)


def test_nan_where_the_oracle_is_finite_always_fails(ref):
    out = ref.out.clone()
    out[0, 0, 0, 0] = float("nan")
    c = compare("output", out, ref.lse, ref.out, ref.lse, dtype="bfloat16", tol=TOL)
    assert any("non-finite" in f and "request 0, query 0, head 0, dim 0" in f for f in c.failures)
    lse = ref.lse.clone()
    lse[1, 1, 1] = float("inf")
    c = compare("output", ref.out, lse, ref.out, ref.lse, dtype="bfloat16", tol=TOL)
    assert any("LSE: 1 non-finite" in f for f in c.failures)


def test_yardstick_fails_when_much_worse_than_working_dtype_sdpa(ref):
    out = ref.out.clone()
    unit = 2.0 ** (math.floor(math.log2(float(ref.out.abs().max()))) - 7)
    out[0, 1, 0, 0] += 5 * unit  # inside 8 ulps, but sdpa is exact here: 5 > 2 * 0 + 2 ulps
    c = compare("output", out, ref.lse, ref.out, ref.lse, dtype="bfloat16", tol=TOL, yardstick_out=ref.out)
    assert [f for f in c.failures if "yardstick" in f] and c.margins["yardstick"] > 1


@pytest.mark.parametrize("factor,hint", [(math.log(2), "converted twice"), (1 / math.log(2), "taken as natural log")])
def test_lse_in_the_wrong_base_fails_with_a_hint(ref, factor, hint):
    c = compare("output", ref.out, ref.lse * factor, ref.out, ref.lse, dtype="bfloat16", tol=TOL)
    assert any(hint in f for f in c.failures), c.failures


def test_empty_row_must_have_minus_inf_lse():
    ref_lse = torch.tensor([[[float("-inf"), 1.0]]])
    ref_out = torch.zeros((1, 1, 2, 4))
    c = compare("partial B", ref_out, torch.tensor([[[0.0, 1.0]]]), ref_out, ref_lse, dtype="bfloat16", tol=TOL)
    assert any("no visible key must give -inf" in f for f in c.failures)


def test_shape_mismatch_is_reported_not_raised(ref):
    c = compare("output", ref.out[:, :2], ref.lse, ref.out, ref.lse, dtype="bfloat16", tol=TOL)
    assert "output shape" in c.failures[0]


def test_call_mismatch_names_both_kernels():
    msg = counters.call_mismatch({"torch.paged_decode": 1}, {"torch.paged_prefill": 1})
    assert msg == ("kernel calls: expected torch.paged_decode x1, got torch.paged_prefill x1 "
                   "(silent fallback: torch.paged_decode replaced by torch.paged_prefill)")
    assert counters.call_mismatch({"a": 1}, {"a": 1}) is None
    assert "unexpected: b" in counters.call_mismatch({"a": 1}, {"a": 1, "b": 2})
    assert "x2" in counters.call_mismatch({"a": 1}, {"a": 2})


def test_counters_nest_and_counted_wraps():
    @counters.counted("k")
    def f():
        return 3

    with counters.KernelCounter() as outer:
        with counters.KernelCounter() as inner:
            f()
        f()
    assert inner.calls == {"k": 1} and outer.calls == {"k": 2}
    f()  # outside any counter: no error, nothing recorded
    assert outer.calls == {"k": 2}


class _ReturnsWrongDtype(Sdpa):
    name = "wrong-dtype"

    def run(self, inputs):
        r = super().run(inputs)
        return LoweringResult(out=r.out.float(), lse=r.lse)


class _Raises(Sdpa):
    name = "raises"

    def run(self, inputs):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")


class _DeclaresWrongBase(DecodeRows):
    name = "declares-natural"
    lse_base = math.e  # returns base 2 like flashinfer, declares natural


@pytest.mark.parametrize("lowering,phrase", [
    (_ReturnsWrongDtype(), "output dtype torch.float32, expected the case's torch.bfloat16"),
    (_Raises(), "raises raised RuntimeError: CUDA error: an illegal memory access"),
    (_DeclaresWrongBase(), "LSE"),
])
def test_run_case_turns_lowering_bugs_into_failures(lowering, phrase):
    out = run_case(lowering, CASE, POL, RunOptions(), yardstick=lowerings.get("sdpa"))
    assert out.status == "fail"
    assert any(phrase in f for f in out.failures), out.failures


def test_unsupported_case_is_reported_with_the_reason():
    out = run_case(lowerings.get("decode_rows"), CASE.replace(window=(2, 2)), POL)
    assert out.status == "unsupported" and "non-causal unwindowed layers only" in out.reason


def test_partials_are_checked_before_the_merge():
    """A windowed merge whose part A is right but whose declared part A window is wrong fails on the partial."""
    from lowerings.torch_emulation import WindowedMerge

    class WrongPartialClaim(WindowedMerge):
        def run(self, inputs):
            r = super().run(inputs)
            a = r.partials["A"]
            r.partials["A"] = type(a)(out=a.out, lse=a.lse, lse_base=BASE_2, window=(-1, 0))  # claims unwindowed
            return r

    lw = WrongPartialClaim(form="eager")
    case = CASE.replace(window=(1, 1), context_lens=(9, 1))
    out = run_case(lw, case, POL)
    assert out.status == "fail" and any(f.startswith("partial A") for f in out.failures), out.failures
    good = run_case(lowerings.get("windowed_merge[eager]"), case, POL)
    assert good.status == "pass" and [c.label for c in good.comparisons] == ["output", "partial A", "partial B"]


def test_tolerance_override_per_lowering_applies():
    pol = policy_mod.from_dict({**_toml(), "lowering": {"sdpa": {"bfloat16": {"reason": "test", "out_max_ulp": 4.0}}}})
    assert pol.for_lowering("sdpa", "bfloat16").out_max_ulp == 4.0
    assert pol.for_lowering("context", "bfloat16").out_max_ulp == 8.0
    with pytest.raises(Exception, match="no such lowering"):
        pol.check_lowerings(["context"])


def _toml():
    import tomllib

    return tomllib.loads(open(policy_mod.DEFAULT_PATH).read())


FA2 = [("context[flashinfer-fa2]", 1), ("decode_rows[flashinfer]", 33), ("decode_rows[flashinfer-tc]", 1)]


@pytest.mark.parametrize("name,batch", FA2, ids=[n for n, _ in FA2])
def test_fa2_lse_entry_still_catches_a_base_mix_up(ref, name, batch):
    """The measured fa2 entry in tolerances.toml (lse_abs 2e-3 plus lse_rel 2.5e-3), keyed by the kernel,
    reaches each built-in lowering that calls it (decode_rows[flashinfer] above B=32 only), passes the errors
    measured on the H200 and must not hide an LSE in the wrong base."""
    from lowerings import flashinfer as fp
    from parity.engine.runner import tolerance_for

    adapter = {a.name: a for a in fp.adapters()}[name]
    case = CASE.replace(context_lens=(3,) * batch, block_size=1, pages=tuple((b,) for b in range(batch)),
                        num_pages=batch + 1, num_q_heads=4, num_kv_heads=1)
    loose, src = tolerance_for(policy_mod.load(), adapter, case, adapter.expected_calls(case))
    assert src.label == '[kernel."BatchPrefillWithPagedKVCacheKernel".bfloat16]', src
    assert loose.lse_abs > TOL.lse_abs and loose.lse_rel > 0  # the entry is the one under test
    assert compare("output", ref.out, ref.lse * (1 + 2e-3), ref.out, ref.lse, dtype="bfloat16", tol=loose).passed
    assert compare("output", ref.out, ref.lse + 1.174e-3, ref.out, ref.lse, dtype="bfloat16", tol=loose).passed
    c = compare("output", ref.out, ref.lse * math.log(2), ref.out, ref.lse, dtype="bfloat16", tol=loose)
    assert any("converted twice" in f for f in c.failures), c.failures


def test_fa2_entry_applies_exactly_when_the_fa2_kernel_ran():
    """decode_rows[flashinfer] runs the CUDA-core decode kernel up to B=32 (the default bound, as measured)
    and the fa2 prefill kernel above it (the fa2 entry); the fa3 context never gets the fa2 entry."""
    from lowerings import flashinfer as fp
    from parity.engine.runner import tolerance_for

    pol = policy_mod.load()
    for adapter, batch, label in ((fp.FlashinferDecodeRows(False), 32, "[defaults.bfloat16]"),
                                  (fp.FlashinferDecodeRows(False), 33,
                                   '[kernel."BatchPrefillWithPagedKVCacheKernel".bfloat16]'),
                                  (fp.FlashinferContext("fa3"), 1, "[defaults.bfloat16]")):
        case = CASE.replace(context_lens=(3,) * batch, block_size=1, pages=tuple((b,) for b in range(batch)),
                            num_pages=batch + 1)
        tol, src = tolerance_for(pol, adapter, case, adapter.expected_calls(case))
        assert src.label == label, (adapter.name, batch, src)
        assert (tol == pol.defaults["bfloat16"]) == (label == "[defaults.bfloat16]")


def test_phases_are_timed_and_reported():
    """Each case's wall time is split into phases (runner.PHASES); reports sum them per lowering."""
    from parity.report.files import phase_line
    from parity.engine.runner import PHASES, LoweringReport

    out = run_case(lowerings.get("decode_rows"), CASE, POL, RunOptions(), yardstick=lowerings.get("sdpa"))
    assert out.status == "pass"
    assert {"build", "oracle", "yardstick", "lowering", "judge", "hardening"} <= set(out.phases) <= set(PHASES)
    assert all(v >= 0 for v in out.phases.values()) and sum(out.phases.values()) <= out.seconds + 1e-3
    rep = LoweringReport("decode_rows", "cpu", "pass")
    rep.absorb(out)
    rep.absorb(out)
    assert rep.phases["lowering"] == pytest.approx(2 * out.phases["lowering"])
    line = phase_line({"phase_seconds": rep.phases, "cases": 2, "unsupported": 0, "seconds": 2 * out.seconds})
    assert "cases/s" in line and "lowering" in line and line.endswith("%")
    assert phase_line({"phase_seconds": {}, "cases": 0}) == ""


def test_the_oracle_phase_holds_the_wait_for_the_oracle(monkeypatch):
    """On a GPU the oracle's launches return at once and the first read of its figures waits for them
    (`oracle_problem`): that wait is the oracle's time, not time outside every phase."""
    from parity.engine import case_run

    real = case_run.oracle_problem

    def slow(case, ref):
        time.sleep(0.05)
        return real(case, ref)

    monkeypatch.setattr(case_run, "oracle_problem", slow)
    out = run_case(lowerings.get("decode_rows"), CASE, POL, RunOptions())
    assert out.status == "pass" and out.phases["oracle"] >= 0.05

