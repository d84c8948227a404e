"""The default yardstick (`parity.yardstick.RoundedOracle`: the oracle's fp32 attention over the working dtype's
values, rounded) against the one it replaced (`sdpa`: torch SDPA in the working dtype), on drawn CPU cases.

Both compute an fp32 attention of the same working-dtype values and round it once, in different fp32 sum
orders. So every output element is the same or one working-dtype step apart (a value within fp32 noise of a
rounding midpoint; the noise is of max|O|, so a small element may be further), and the yardstick's error `max |Y - O_ref|`, the one figure the judge reads, moves by fp32
noise only (`_noise`: 0 on most cases; 6e-5 of the error itself at the most seen here at ordinary scores). A yardstick that skips the fp8 pool's
rounding to the working dtype (`_unrounded`, a mutant) is told apart on the cases whose scales do not
dequantize exactly.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given

import lowerings
from oracle import materialize
from oracle.reference import attention, fp8_dequantizes_exactly, kv_read_exactly, working_dtype_output
from parity import yardstick
from parity.case_run import run_case, run_yardstick
from parity.invocation import RunOptions
from parity.outcome import CaseOutcome
from parity.policy import load as load_policy
from strategies import cases, profile_settings
from tests.oracle.oracle_cases import build_case

FP32_NOISE = 1e-6  # of max|O|: two fp32 attentions' difference at ordinary scores (tests/oracle/test_fast_engine.py)
SCORE_NOISE = 2.0 ** -20  # of max|O| per unit of max|LSE_ref|: an fp32 score's rounding (16 fp32 eps) moves p by as much
ODD_SCALES = (0.37, 1.3)  # do not dequantize exactly into bf16 / fp16: the rounded pool differs from the exact one


def _sdpa(inputs, ref_out):
    return lowerings.get("sdpa").run_output(inputs)


def _unrounded(inputs, ref_out):
    """Mutant: the oracle's output rounded, the fp8 pool read exactly (its rounding to the working dtype skipped)."""
    return ref_out.to(inputs.q.dtype)


def _figures(inputs, make) -> tuple[torch.Tensor, float]:
    ref = attention(inputs)
    y = make(inputs, ref.out)
    return y, (y.double() - ref.out.double()).abs().max().item()


def _noise(inputs) -> float:
    """How far two fp32 attentions of `inputs` may be apart, in output units: `FP32_NOISE` of max|O|, and
    `SCORE_NOISE` of it per unit of the largest |LSE| (at huge scores fp32 attention itself is that uncertain)."""
    ref = attention(inputs)
    lse = ref.lse[torch.isfinite(ref.lse)].abs()
    size = lse.max().item() if lse.numel() else 0.0
    return (FP32_NOISE + SCORE_NOISE * size) * max(ref.out.abs().max().item(), 1e-30)


def _disagreement(case, mine_from=None) -> tuple[int, float, str]:
    """(elements more than one working-dtype step and fp32 noise apart, the difference of the two yardstick errors
    in units of that noise, label) between the default yardstick (or `mine_from(inputs, oracle_out)`) and `sdpa` on
    `case`."""
    inputs = materialize(case, "cpu")
    mine, e_mine = _figures(inputs, mine_from or (lambda i, r: yardstick.get(yardstick.DEFAULT).output(i, r)))
    theirs, e_theirs = _figures(inputs, _sdpa)
    step = torch.finfo(inputs.q.dtype).eps * torch.maximum(mine.double().abs(), theirs.double().abs())
    noise = _noise(inputs)
    far = int(((mine.double() - theirs.double()).abs() > step + noise).sum())
    return far, abs(e_mine - e_theirs) / noise, case.short()


def _odd_scales(case):
    if case.kv_dtype != "float8_e4m3fn":
        return case
    return dataclasses.replace(case, k_scale=ODD_SCALES[case.seed % 2], v_scale=ODD_SCALES[(case.seed + 1) % 2])


@profile_settings("ci", max_examples=30)
@given(case=cases(lowerings.get("sdpa"), limits=None))
def test_the_default_yardstick_is_the_working_dtype_sdpa(case):
    for c in (case, _odd_scales(case)):
        far, rel, label = _disagreement(c)
        assert far == 0, f"{label}: {far} element(s) more than one working-dtype step from sdpa's"
        assert rel <= 1.0, f"{label}: the yardstick's error differs from sdpa's by {rel:.2f}x the fp32 noise"


def test_skipping_the_fp8_rounding_is_told_apart():
    case = build_case((0, 37, 70), 5, 2, 3, 64, 4, dtype="bfloat16", kv_dtype="float8_e4m3fn",
                      k_scale=ODD_SCALES[0], v_scale=ODD_SCALES[1], window=(9, 2))
    assert _disagreement(case, working_dtype_output)[0] == 0
    far, _, _ = _disagreement(case, _unrounded)
    assert far > 0, "the unrounded fp8 pool's yardstick is within a step of sdpa's everywhere"


def test_which_scales_dequantize_exactly():
    assert fp8_dequantizes_exactly(0.25, "bfloat16") and fp8_dequantizes_exactly(4.0, "float16")
    assert not fp8_dequantizes_exactly(0.37, "bfloat16") and not fp8_dequantizes_exactly(3.0, "float16")
    assert fp8_dequantizes_exactly(2.0 ** -15, "float16")  # 2^-9 * 2^-15 = 2^-24: fp16's smallest subnormal
    assert not fp8_dequantizes_exactly(2.0 ** -16, "float16")  # below it: e4m3's smallest values are lost
    assert fp8_dequantizes_exactly(2.0 ** -16, "bfloat16")
    assert not fp8_dequantizes_exactly(256.0, "float16")  # 448 * 256 > 65504
    assert not fp8_dequantizes_exactly(0.0, "bfloat16") and not fp8_dequantizes_exactly(float("inf"), "bfloat16")
    fp8 = build_case((3,), 2, 1, 2, 16, 4, kv_dtype="float8_e4m3fn", k_scale=0.5, v_scale=0.37)
    assert not kv_read_exactly(fp8) and kv_read_exactly(dataclasses.replace(fp8, v_scale=2.0))
    assert kv_read_exactly(build_case((3,), 2, 1, 2, 16, 4))


def test_run_case_judges_with_the_default_yardstick():
    """`check`'s yardstick is the default; its figure is in every judged output comparison, and a working set
    that does not fit skips it with the reason."""
    policy = load_policy(None)
    case = build_case((5, 33), 3, 2, 2, 64, 16, kv_dtype="float8_e4m3fn", k_scale=0.37, v_scale=2.0)
    out = run_case(lowerings.get("context"), case, policy, RunOptions(), yardstick.get(yardstick.DEFAULT))
    assert out.status == "pass", out.failures
    assert out.comparisons[0].figures["yardstick_max_abs"] > 0 and "yardstick" in out.phases
    inputs = materialize(case, "cpu")
    skipped = CaseOutcome("x", case, "pass")
    assert run_yardstick(yardstick.get(yardstick.DEFAULT), inputs, RunOptions(memory_bytes=1), skipped,
                         attention(inputs).out) is None
    assert any("working-dtype yardstick" in why for why in skipped.skipped.values()), skipped.skipped


def test_the_oracle_output_must_be_the_cases():
    inputs = materialize(build_case((3,), 2, 1, 2, 16, 4), "cpu")
    with pytest.raises(Exception, match="oracle_out"):
        working_dtype_output(inputs, attention(inputs).out.double())


def test_the_report_says_which_yardstick_judged(tmp_path):
    import json

    from parity import cli

    code = cli.main(["check", "--device", "cpu", "--lowering", "sdpa", "--max-examples", "3", "--no-isolate", "--quiet",
                     "--limit", "max_batch=2", "--limit", "max_context=40", "--limit", "max_production_context=0",
                     "--report", str(tmp_path / "r")])
    assert code == 0
    settings = json.loads((tmp_path / "r" / "parity.json").read_text())["settings"]
    assert settings["yardstick"] == yardstick.DEFAULT == "rounded-oracle"
