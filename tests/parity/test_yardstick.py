"""The default yardstick (`parity.engine.yardstick.WorkingDtype`): the case attended in the working dtype's real arithmetic,
in the order of flash kernels (fp32 scores, the weights rounded to the working dtype before P.V, fp32 sums, one
rounding of the output), against a dense computation of the same order written here, on drawn CPU cases.

The dense one takes every key at once (one row maximum), the yardstick's engine keys in chunks with a running
maximum: for contexts within one chunk both round the same weights, so every output element is the same or one
working-dtype step apart (fp32 sums in other orders). Mutants told apart: the yardstick of issue 47's first
complaint (the oracle's output rounded: `RoundedOracle`, whose error is half an ulp by construction) and one that
skips the fp8 pool's rounding to the working dtype.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from hypothesis import given

import lowerings
from oracle import materialize
from oracle.reference import attention, fp8_dequantizes_exactly, gather_keys, kv_read_exactly, working_dtype_output
from parity.front import cli
from parity.engine import yardstick
from parity.engine.case_run import run_case, run_yardstick
from parity.engine.invocation import RunOptions
from parity.engine.judge import compare
from parity.engine.outcome import CaseOutcome
from parity.engine.policy import load as load_policy
from strategies import cases, profile_settings
from tests.oracle.oracle_cases import build_case

ODD_SCALES = (0.37, 1.3)  # do not dequantize exactly into bf16 / fp16: the rounded pool differs from the exact one


def dense_flash_order(inputs, *, kv_rounded: bool = True, round_p: bool = True) -> torch.Tensor:
    """`[B, K, Hq, D]` in the working dtype: every visible key at once, fp32 scores, `exp(s - rowmax)` rounded to the
    working dtype (when `round_p`) before P.V, the row sum of the unrounded weights, one rounding of the output."""
    c = inputs.case
    B, K, Hq, Hkv, D, G, T = (c.batch_size, c.block_size, c.num_q_heads, c.num_kv_heads, c.head_dim, c.group_size,
                              c.max_keys)
    lens = inputs.context_lens.to(torch.long)
    k, v, valid = gather_keys(inputs, 0, T, lens, torch.float32, kv_rounded=kv_rounded)
    q = inputs.q.float().view(B, K, Hkv, G, D)
    s = torch.einsum("bkhgd,bthd->bhgkt", q, k) * c.softmax_scale
    left, right = c.window
    t = torch.arange(T).view(1, 1, -1)
    p_abs = lens.view(-1, 1, 1) + torch.arange(K).view(1, -1, 1)
    vis = (t < lens.view(-1, 1, 1) + K) & valid.view(B, 1, T) & (p_abs >= 0)  # [B, K, T]
    if left != -1:
        vis = vis & (t >= p_abs - left)
    if right != -1:
        vis = vis & (t <= p_abs + right)
    s = s.masked_fill(~vis.view(B, 1, 1, K, T), float("-inf"))
    m = s.amax(-1, keepdim=True)
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    p = torch.exp(s - m)
    pw = p.to(inputs.q.dtype).float() if round_p else p
    l = p.sum(-1, keepdim=True)
    o = torch.einsum("bhgkt,bthd->bhgkd", pw, v) / torch.where(l > 0, l, torch.ones_like(l))
    return o.permute(0, 3, 1, 2, 4).reshape(B, K, Hq, D).to(inputs.q.dtype)


def _odd_scales(case):
    if case.kv_dtype != "float8_e4m3fn":
        return case
    return dataclasses.replace(case, k_scale=ODD_SCALES[case.seed % 2], v_scale=ODD_SCALES[(case.seed + 1) % 2])


@profile_settings("ci", max_examples=30)
@given(case=cases(lowerings.get("sdpa"), limits=None))
def test_the_default_yardstick_is_the_flash_order(case):
    for c in (case, _odd_scales(case)):
        if c.max_keys > 2048:  # past one chunk the running maximum rounds other weights: not this test's claim
            continue
        inputs = materialize(c, "cpu")
        got = yardstick.get(yardstick.DEFAULT).output(inputs)
        step = torch.finfo(inputs.q.dtype).eps
        want = dense_flash_order(inputs)
        diff = (got.double() - want.double()).abs()
        tol = step * torch.maximum(got.double().abs(), want.double().abs()) + 1e-6 * want.double().abs().max()
        assert int((diff > tol).sum()) == 0, f"{c.short()}: the yardstick is not the flash order"


def test_rounding_p_is_what_the_yardstick_adds():
    """The working-dtype yardstick rounds the weights before P.V: its output differs from the rounded oracle's (the
    yardstick issue 47 complained of, half an ulp off by construction) by a working-dtype step on many elements, and
    its error is at least that one's. A yardstick that skips the rounding is told apart."""
    case = build_case((700, 90), 4, 2, 4, 64, 16, dtype="bfloat16")
    inputs = materialize(case, "cpu")
    ref = attention(inputs, precision=torch.float64).out
    out = {name: yardstick.get(name).output(inputs, attention(inputs).out).double()
           for name in (yardstick.WORKING_DTYPE, yardstick.ROUNDED_ORACLE)}
    err = {name: (o - ref).abs().max().item() for name, o in out.items()}
    assert err[yardstick.WORKING_DTYPE] == pytest.approx((dense_flash_order(inputs).double() - ref).abs().max().item(),
                                                         rel=0.05)
    assert err[yardstick.WORKING_DTYPE] >= err[yardstick.ROUNDED_ORACLE], err
    apart = int((out[yardstick.WORKING_DTYPE] != out[yardstick.ROUNDED_ORACLE]).sum())
    assert apart > ref.numel() // 20, f"only {apart} of {ref.numel()} elements differ: P was not rounded"


def _steps_apart(a: torch.Tensor, b: torch.Tensor) -> int:
    """Elements of two working-dtype outputs more than one working-dtype step apart."""
    step = torch.finfo(a.dtype).eps
    a, b = a.double(), b.double()
    return int(((a - b).abs() > step * torch.maximum(a.abs(), b.abs()) + 1e-6 * b.abs().max()).sum())


def test_skipping_the_fp8_rounding_is_told_apart():
    case = build_case((0, 37, 70), 5, 2, 3, 64, 4, dtype="bfloat16", kv_dtype="float8_e4m3fn",
                      k_scale=ODD_SCALES[0], v_scale=ODD_SCALES[1], window=(9, 2))
    inputs = materialize(case, "cpu")
    got = working_dtype_output(inputs)
    assert _steps_apart(got, dense_flash_order(inputs)) == 0
    assert _steps_apart(got, dense_flash_order(inputs, kv_rounded=False)) > 0, "the unrounded fp8 pool's is the same"


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


def test_a_failure_names_what_the_yardstick_is():
    inputs = materialize(build_case((40,), 2, 1, 2, 64, 16, dtype="float16"), "cpu")
    ref = attention(inputs, precision=torch.float64)
    y = working_dtype_output(inputs)
    bad = ref.out.to(torch.float16) + 0.05
    tol = load_policy(None).for_case("x", "float16", ())[0]
    cmp = compare("output", bad, None, ref.out, ref.lse, dtype="float16", tol=tol, yardstick_out=y,
                  yardstick_name=yardstick.DEFAULT)
    line = next(f for f in cmp.failures if "yardstick rule" in f)
    assert "the working-dtype reference's (fp32 scores, P rounded to float16 before P.V, output rounded) error" in line
    assert "SDPA" not in line


def test_the_report_says_which_yardstick_judged(tmp_path):
    code = cli.main(["check", "--device", "cpu", "--lowering", "sdpa", "--max-examples", "3", "--no-isolate", "--quiet",
                     "--limit", "max_batch=2", "--limit", "max_context=40", "--limit", "max_production_context=0",
                     "--report", str(tmp_path / "r")])
    assert code == 0
    settings = json.loads((tmp_path / "r" / "parity.json").read_text())["settings"]
    assert settings["yardstick"] == yardstick.DEFAULT == "working-dtype"
