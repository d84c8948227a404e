"""The yardstick's SDPA calls (`lowerings.torch_emulation.sdpa_batch`) give the same bits as the form they
replaced, which passed working-dtype tensors and a boolean mask and let SDPA's math backend upcast, convert
the mask and cast back (about a third more kernel launches per call; on a GPU the yardstick is launch-bound,
docs/lab/performance-log.md, section 4). `previous_sdpa_batch` below is that form, kept verbatim as the reference.

Runs on the CPU in CI; the same comparison on the GPU is in docs/gpu/2026-12-03-h200-session16.md (its script,
gpu_yardstick_ab.py, is retired: lab/README.md)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings

from lowerings import paged, torch_emulation
from lowerings.torch_emulation import SDPA_GROUPED_ELEMENTS, Sdpa, sdpa_batches
from oracle.inputs import Inputs, materialize
from strategies import Limits, build_case, cases


def previous_sdpa_batch(inputs: Inputs, rows: list[int], *, with_lse: bool, meta=None):
    """`sdpa_batch` as it was before the fp32 calls (commit b6d5375), unchanged but for `meta` (the index
    vectors today's caller copies for every batch at once), which it ignores."""
    c = inputs.case
    ps, K, D, G, Hkv = c.page_size, c.block_size, c.head_dim, c.group_size, c.num_kv_heads
    dev, dt = inputs.device, inputs.q.dtype
    n = len(rows)
    lens_host = [inputs.context_lens_host[b] for b in rows]
    T = lens_host[0] + K
    whole = rows == list(range(c.batch_size))
    idx = None if whole else torch.tensor(rows).to(dev, non_blocking=True)
    pick = (lambda x: x) if whole else (lambda x: x.index_select(0, idx))
    L = torch.tensor(lens_host).to(dev, non_blocking=True).view(n, 1)
    t = torch.arange(T, device=dev).view(1, T)
    ctx = t < L
    table = pick(inputs.page_table).to(torch.long)
    pid = torch.where(ctx, torch.gather(table, 1, (t // ps).clamp(max=table.shape[1] - 1).expand(n, T)), 0)
    pid, slot, h = pid.view(n, 1, T), (t % ps).view(1, 1, T), torch.arange(Hkv, device=dev).view(1, Hkv, 1)
    bi = torch.arange(n).repeat_interleave(K).tolist()
    bt = [L_b + j for L_b in lens_host for j in range(K)]
    bi, bt = (torch.tensor(x).to(dev, non_blocking=True) for x in (bi, bt))
    pad = ~(t < L + K)
    kv = []
    for pool, blk, sc in ((inputs.k_pool, inputs.k_block, c.k_scale), (inputs.v_pool, inputs.v_block, c.v_scale)):
        x = pool[pid, slot, h] if c.layout == "NHD" else pool[pid, h, slot]
        x = (x.float() * sc).to(dt) if x.dtype == paged.FP8 else x
        x[bi, :, bt] = pick(blk).reshape(n * K, Hkv, D)
        x.masked_fill_(pad.view(n, 1, T, 1), 0)
        kv.append(x)
    k, v = kv
    q = pick(inputs.q).transpose(1, 2).reshape(n, Hkv, G * K, D)
    pos = L.view(n, 1, 1) + torch.arange(K, device=dev).view(1, K, 1)
    tt = t.view(1, 1, T)
    mask = (tt < L.view(n, 1, 1) + K).expand(n, K, T)
    left, right = c.window
    if left != -1:
        mask = mask & (tt >= pos - left)
    if right != -1:
        mask = mask & (tt <= pos + right)
    mask = mask.repeat(1, G, 1).unsqueeze(1)
    heads = [(0, Hkv)] if n * c.num_q_heads * T * D <= SDPA_GROUPED_ELEMENTS else [(h, h + 1) for h in range(Hkv)]
    o_parts, lse_parts = [], []
    for h0, h1 in heads:
        m = h1 - h0
        qh, kh, vh = (x[:, h0:h1].reshape(n * m, -1, D) for x in (q, k, v))
        mh = mask.expand(n, m, G * K, T).reshape(n * m, G * K, T)
        o_parts.append(F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mh, scale=c.softmax_scale).view(n, m, G * K, D))
        if with_lse:
            s = torch.matmul(qh.float(), kh.float().transpose(-1, -2)) * c.softmax_scale
            lse_parts.append(torch.logsumexp(s.masked_fill(~mh, float("-inf")), dim=-1).view(n, m, G * K))
            del s
    o = torch.cat(o_parts, dim=1).view(n, Hkv, G, K, D).reshape(n, c.num_q_heads, K, D).transpose(1, 2)
    lse = torch.cat(lse_parts, dim=1).view(n, c.num_q_heads, K).transpose(1, 2) if with_lse else None
    return o, lse


def both_ways(inputs: Inputs, monkeypatch) -> tuple:
    """(output, LSE) of `Sdpa().run` now and with the previous form patched in."""
    now = Sdpa().run(inputs)
    with monkeypatch.context() as m:
        m.setattr(torch_emulation, "sdpa_batch", previous_sdpa_batch)
        before = Sdpa().run(inputs)
    return now, before


def assert_same_bits(now, before, what: str) -> None:
    assert now.out.dtype == before.out.dtype and torch.equal(now.out, before.out), f"output differs: {what}"
    assert torch.equal(now.lse, before.lse), f"LSE differs: {what}"


def test_the_yardstick_calls_give_the_previous_bits(monkeypatch):
    """Ragged batches of several requests (all heads in one call, one mask for every head), windows,
    causal layers, fp8 pools, both layouts and block storages, bf16 and fp16: output and LSE bit for bit."""
    seen = {"cases": 0, "several_batches": 0, "fp8": 0}

    @settings(max_examples=60, derandomize=True, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(case=cases(Sdpa(), limits=Limits(max_batch=8, max_context=700, kv_dtypes=("same", "float8_e4m3fn"))))
    def run(case):
        now, before = both_ways(materialize(case), monkeypatch)
        assert_same_bits(now, before, case.short())
        seen["cases"] += 1
        seen["several_batches"] += len(sdpa_batches(case)) > 1
        seen["fp8"] += case.kv_dtype == "float8_e4m3fn"

    run()
    assert seen["fp8"] >= 5, seen


@pytest.mark.parametrize("lens, kv_heads, group", [((8200, 30, 7), 4, 16), ((33000,), 2, 16), ((4000, 4000), 8, 16)])
def test_the_yardstick_calls_give_the_previous_bits_one_head_at_a_time(monkeypatch, lens, kv_heads, group):
    """Past `SDPA_GROUPED_ELEMENTS` each KV head is its own call (a request alone, or several requests whose
    mask is not shared across heads): the same bits there too, in several batches."""
    case = build_case(dict(context_lens=list(lens), block_size=5, num_kv_heads=kv_heads, group=group, head_dim=128,
                           page_size=16, window=("noncausal_swa", 300), dtype="bfloat16", kv_dtype="same",
                           k_scale=1.0, v_scale=1.0, scale=None, layout="HND", block_storage="dense",
                           page_table_dtype="int32", page_table_pad=0, spare_pages=1, extra_pages=0, perm_seed=3,
                           seed=11))
    first = sdpa_batches(case)[0]  # the longest request's batch: one call per KV head
    assert len(first) * case.num_q_heads * (max(lens) + 5) * 128 > SDPA_GROUPED_ELEMENTS, first
    now, before = both_ways(materialize(case), monkeypatch)
    assert_same_bits(now, before, case.short())


def test_the_comparison_sees_a_mask_one_key_short(monkeypatch):
    """Negative control: the bit comparison fails when the new form hides one more key (the window's oldest)."""
    case = build_case(dict(context_lens=[40, 17], block_size=3, num_kv_heads=2, group=2, head_dim=64, page_size=16,
                           window=("noncausal_swa", 8), dtype="bfloat16", kv_dtype="same", k_scale=1.0, v_scale=1.0,
                           scale=None, layout="NHD", block_storage="dense", page_table_dtype="int32",
                           page_table_pad=0, spare_pages=1, extra_pages=0, perm_seed=0, seed=1))
    inputs = materialize(case)
    real_where = torch.where

    def narrower(cond, *rest):
        if len(rest) == 2 and all(isinstance(x, float) for x in rest):  # the additive mask: drop each row's first key
            cond = cond & torch.cat([torch.zeros_like(cond[..., :1]), cond[..., :-1]], dim=-1)
        return real_where(cond, *rest)

    monkeypatch.setattr(torch_emulation.torch, "where", narrower)
    now = Sdpa().run(inputs)
    monkeypatch.undo()
    with monkeypatch.context() as m:
        m.setattr(torch_emulation, "sdpa_batch", previous_sdpa_batch)
        before = Sdpa().run(inputs)
    assert not torch.equal(now.out, before.out)
