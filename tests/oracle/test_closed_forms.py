"""Closed forms the oracle must reproduce: one visible key, equal scores, the softmax scale, fp8 scales."""

from __future__ import annotations

import math

import pytest
import torch

from oracle import attention, materialize, visible
from tests.oracle.oracle_cases import build_case

FP8 = "float8_e4m3fn"


def _value_at(inputs, b: int, t: int, kvh: int, which: str = "v") -> torch.Tensor:
    """The dequantized fp64 value/key at position t (via case.pages, not the page table)."""
    c = inputs.case
    L = c.context_lens[b]
    if t >= L and c.block_storage == "dense":
        return getattr(inputs, f"{which}_block")[b, t - L, kvh].double()
    pool = getattr(inputs, f"{which}_pool")
    page, slot = c.pages[b][t // c.page_size], t % c.page_size
    x = pool[page, slot, kvh] if c.layout == "NHD" else pool[page, kvh, slot]
    s = (c.k_scale if which == "k" else c.v_scale) if c.kv_dtype == FP8 else 1.0
    return x.double() * s


CONFIGS = [
    dict(dtype="bfloat16"),
    dict(dtype="float16", layout="HND"),
    dict(dtype="bfloat16", kv_dtype=FP8, k_scale=0.5, v_scale=2.0, block_storage="appended"),
    dict(dtype="float16", kv_dtype=FP8, k_scale=2.0, v_scale=0.25, layout="HND"),
]


@pytest.mark.parametrize("precision", [torch.float32, torch.float64])
@pytest.mark.parametrize("cfg", CONFIGS)
def test_single_key_L0_K1(cfg, precision):
    """L = 0, K = 1: each query sees only its own key: O = v exactly, LSE = scale * <q, k>."""
    case = build_case((0, 0, 0), 1, 2, 3, 16, 4, window=(-1, -1), seed=11, **cfg)
    inputs = materialize(case)
    r = attention(inputs, precision=precision)
    for b in range(case.batch_size):
        for h in range(case.num_q_heads):
            kvh = h // case.group_size
            v = _value_at(inputs, b, 0, kvh, "v")
            k = _value_at(inputs, b, 0, kvh, "k")
            assert torch.equal(r.out[b, 0, h], v.to(precision)), (b, h)
            s = case.softmax_scale * float((inputs.q[b, 0, h].double() * k).sum())
            assert abs(r.lse[b, 0, h].item() - s) <= 1e-6 * max(1.0, abs(s))


@pytest.mark.parametrize("cfg", CONFIGS)
def test_window_zero_zero_sees_own_key_only(cfg):
    """Window (0, 0) with a long context: query i sees only position L+i: O is that value exactly."""
    case = build_case((37, 5, 0), 4, 2, 2, 16, 4, window=(0, 0), seed=12, **cfg)
    inputs = materialize(case)
    r = attention(inputs, chunk=8)
    for b, L in enumerate(case.context_lens):
        for i in range(case.block_size):
            for h in range(case.num_q_heads):
                kvh = h // case.group_size
                assert torch.equal(r.out[b, i, h], _value_at(inputs, b, L + i, kvh).float())
                k = _value_at(inputs, b, L + i, kvh, "k")
                s = case.softmax_scale * float((inputs.q[b, i, h].double() * k).sum())
                assert abs(r.lse[b, i, h].item() - s) <= 1e-6 * max(1.0, abs(s))


@pytest.mark.parametrize("cfg", CONFIGS)
def test_key_mask_selecting_one_key(cfg):
    """A key subset of one (context) key, across chunk boundaries: O is that key's value exactly."""
    case = build_case((40, 23), 3, 1, 4, 8, 2, seed=13, **cfg)
    inputs = materialize(case)
    B, K, Hq, T = case.batch_size, case.block_size, case.num_q_heads, case.max_keys
    g = torch.Generator().manual_seed(0)
    pick = torch.stack([torch.randint(0, case.context_lens[b] + K, (K, Hq), generator=g) for b in range(B)])
    key_mask = torch.zeros((B, K, Hq, T), dtype=torch.bool)
    key_mask.scatter_(3, pick.unsqueeze(-1), True)
    for chunk in (2048, 7, 1):
        r = attention(inputs, key_mask=key_mask, chunk=chunk)
        for b in range(B):
            for i in range(K):
                for h in range(Hq):
                    t = int(pick[b, i, h])
                    kvh = h // case.group_size
                    assert torch.equal(r.out[b, i, h], _value_at(inputs, b, t, kvh).float()), (chunk, b, i, h, t)
                    k = _value_at(inputs, b, t, kvh, "k")
                    s = case.softmax_scale * float((inputs.q[b, i, h].double() * k).sum())
                    assert abs(r.lse[b, i, h].item() - s) <= 1e-6 * max(1.0, abs(s))


def _visible_mean(inputs, window, b, i, h):
    c = inputs.case
    vis = visible(c, window)[b, i]
    ts = [t for t in range(vis.shape[0]) if vis[t]]
    vals = torch.stack([_value_at(inputs, b, t, h // c.group_size) for t in ts])
    return vals.mean(0), len(ts)


@pytest.mark.parametrize("window", [(-1, -1), (-1, 0), (2, 2), (3, 0), (0, 5)])
@pytest.mark.parametrize("cfg", CONFIGS[:3])
def test_zero_query_gives_mean_of_visible_values(cfg, window):
    """q = 0: every score is 0, so O is the mean of the visible values and LSE = ln n."""
    case = build_case((9, 0, 30), 5, 2, 2, 16, 4, window=window, seed=14, **cfg)
    inputs = materialize(case)
    inputs.q.zero_()
    r32 = attention(inputs)
    r64 = attention(inputs, precision=torch.float64)
    for b in range(case.batch_size):
        for i in range(case.block_size):
            for h in range(case.num_q_heads):
                mean, n = _visible_mean(inputs, window, b, i, h)
                assert (r64.out[b, i, h] - mean).abs().max().item() <= 1e-12
                assert (r32.out[b, i, h].double() - mean).abs().max().item() <= 1e-6
                assert abs(r64.lse[b, i, h].item() - math.log(n)) <= 1e-12
                assert abs(r32.lse[b, i, h].item() - math.log(n)) <= 1e-6


def _equal_keys(inputs):
    """Make every key of every request the same vector k0 (pool and dense block); returns k0 (fp64)."""
    c = inputs.case
    k0 = inputs.k_block[0, 0].clone()  # [Hkv, D], in case.dtype (fp8: values the pool represents exactly)
    inputs.k_block[:] = k0
    if c.kv_dtype == FP8:
        code = (k0.float() / c.k_scale).to(inputs.k_pool.dtype)
        assert torch.equal(code.float() * c.k_scale, k0.float())
    else:
        code = k0.to(inputs.k_pool.dtype)
    if c.layout == "NHD":
        inputs.k_pool[:] = code
    else:
        inputs.k_pool[:] = code.unsqueeze(1)
    return k0.double()


@pytest.mark.parametrize("scale", [None, 0.3])
@pytest.mark.parametrize("cfg", CONFIGS)
def test_equal_keys_give_mean_and_lse_s_plus_ln_n(cfg, scale):
    """All keys equal: every visible score is s = scale * <q, k0>; O = mean of visible values,
    LSE = s + ln n. With scale 0.3 instead of D ** -0.5 the LSE moves by exactly (0.3 - D**-0.5)<q,k0>."""
    window = (4, 4)
    case = build_case((12, 3), 4, 2, 3, 16, 4, window=window, scale=scale, seed=15, **cfg)
    inputs = materialize(case)
    k0 = _equal_keys(inputs)
    want_scale = 0.3 if scale is not None else 16 ** -0.5
    assert case.softmax_scale == want_scale
    r64 = attention(inputs, precision=torch.float64)
    r32 = attention(inputs)
    for b in range(case.batch_size):
        for i in range(case.block_size):
            for h in range(case.num_q_heads):
                mean, n = _visible_mean(inputs, window, b, i, h)
                s = want_scale * float((inputs.q[b, i, h].double() * k0[h // case.group_size]).sum())
                assert abs(r64.lse[b, i, h].item() - (s + math.log(n))) <= 1e-12
                assert abs(r32.lse[b, i, h].item() - (s + math.log(n))) <= 1e-5
                assert (r64.out[b, i, h] - mean).abs().max().item() <= 1e-12
                assert (r32.out[b, i, h].double() - mean).abs().max().item() <= 1e-6


def test_scale_change_moves_lse_exactly_as_predicted():
    """Same tensors, scale 0.3 vs default: with equal keys LSE(0.3) - LSE(default) = (0.3 - D**-0.5) <q, k0>
    and O does not change."""
    base = build_case((20, 7), 3, 1, 2, 64, 16, seed=16)
    a, b = materialize(base, canary="zero"), materialize(base.replace(scale=0.3), canary="zero")
    assert torch.equal(a.q, b.q) and torch.equal(a.k_pool, b.k_pool) and torch.equal(a.k_block, b.k_block)
    k0a, k0b = _equal_keys(a), _equal_keys(b)
    ra, rb = attention(a, precision=torch.float64), attention(b, precision=torch.float64)
    qk = (a.q.double() * k0a[0]).sum(-1)  # Hkv = 1
    assert (rb.lse - ra.lse - (0.3 - 64 ** -0.5) * qk).abs().max().item() <= 1e-12
    assert (rb.out - ra.out).abs().max().item() <= 1e-12


def test_power_of_two_q_scaling_equals_scale_scaling():
    """scale/2 with q*2 is bit-identical (power-of-two scaling commutes with rounding): the scale is
    applied to the scores exactly once."""
    base = build_case((31, 2), 4, 2, 2, 16, 4, seed=17)
    a = materialize(base.replace(scale=0.25))
    b = materialize(base.replace(scale=0.125))
    b.q.mul_(2)
    for prec in (torch.float32, torch.float64):
        ra, rb = attention(a, precision=prec), attention(b, precision=prec)
        assert torch.equal(ra.out, rb.out) and torch.equal(ra.lse, rb.lse)


@pytest.mark.parametrize("storage", ["dense", "appended"])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_fp8_doubling_v_scale_doubles_output(storage, layout):
    """Same fp8 codes, v_scale 1 -> 2: O doubles exactly, LSE unchanged. k_scale 2 == scale * 2."""
    base = build_case((25, 6), 4, 2, 2, 16, 4, kv_dtype=FP8, layout=layout, block_storage=storage, seed=18)
    one = materialize(base)
    two = materialize(base.replace(v_scale=2.0))
    assert torch.equal(one.v_pool.view(torch.uint8), two.v_pool.view(torch.uint8)), "pool codes differ"
    assert torch.equal(one.k_pool.view(torch.uint8), two.k_pool.view(torch.uint8))
    for prec in (torch.float32, torch.float64):
        r1, r2 = attention(one, precision=prec), attention(two, precision=prec)
        assert torch.equal(r2.out, 2 * r1.out)
        assert torch.equal(r2.lse, r1.lse)
    # k_scale doubles every score, exactly like doubling the softmax scale.
    ks = materialize(base.replace(k_scale=2.0))
    assert torch.equal(one.k_pool.view(torch.uint8), ks.k_pool.view(torch.uint8))
    sc = materialize(base.replace(scale=2 * base.softmax_scale))
    rk, rs = attention(ks), attention(sc)
    assert torch.equal(rk.out, rs.out) and torch.equal(rk.lse, rs.lse)
    assert not torch.equal(rk.lse, attention(one).lse)


def test_fp8_oracle_reads_quantized_values_not_originals():
    """The fp8 oracle equals the oracle on a bf16 case holding exactly the dequantized fp8 values."""
    c8 = build_case((14, 3), 4, 2, 2, 16, 4, kv_dtype=FP8, k_scale=0.5, v_scale=4.0, seed=19)
    i8 = materialize(c8)
    ib = materialize(c8.replace(kv_dtype="bfloat16", k_scale=1.0, v_scale=1.0))
    ib.k_pool.copy_((i8.k_pool.float() * 0.5).to(torch.bfloat16))
    ib.v_pool.copy_((i8.v_pool.float() * 4.0).to(torch.bfloat16))
    ib.k_block.copy_(i8.k_block)
    ib.v_block.copy_(i8.v_block)
    ib.q.copy_(i8.q)
    for prec in (torch.float32, torch.float64):
        r8, rb = attention(i8, precision=prec), attention(ib, precision=prec)
        assert torch.equal(r8.out, rb.out) and torch.equal(r8.lse, rb.lse)
