"""`lowerings.paged.paged_attention` under a window gathers only the keys a row can see (its last
`M + window_left` positions, from a per-row start) instead of all `T`: the same outputs and LSEs as the full
gather to within the order of the fp32 sums (keys outside the window had weight exactly 0), on the torch
lowerings that use it, and the smaller gather is what runs (a check that the fast path is taken)."""

from __future__ import annotations

import pytest
import torch

import lowerings
from lowerings import paged
from lowerings.torch_emulation import ensure_block_in_pool
from oracle.inputs import materialize
from oracle.reference import attention
from tests.oracle.oracle_cases import build_case

CASES = [
    dict(context_lens=(600, 37, 0, 1200), block_size=4, num_kv_heads=2, group=2, head_dim=64, page_size=16,
         window=(31, 31)),
    dict(context_lens=(900, 5), block_size=7, num_kv_heads=1, group=4, head_dim=64, page_size=64,
         window=(100, 6), layout="HND", dtype="float16"),
    dict(context_lens=(333,), block_size=1, num_kv_heads=2, group=1, head_dim=64, page_size=32,
         window=(0, 0), kv_dtype="float8_e4m3fn", k_scale=0.5, v_scale=2.0),
]


@pytest.mark.parametrize("spec", CASES, ids=["nhd-bf16-noncausal", "hnd-fp16", "fp8-window-0"])
@pytest.mark.parametrize("name", ["context", "windowed_merge[eager]"])  # the lowerings that pass a window
def test_the_window_gather_matches_the_full_gather(spec, name, monkeypatch):
    case = build_case(**spec, seed=5)
    lw = lowerings.get(name)
    if lw.supports(case):
        pytest.skip(f"{name} does not take this window: {lw.supports(case)}")
    spans: list[int] = []
    real = paged.read_pool

    def counting(pool, pid, slot, *args, **kw):
        spans.append(int(slot.shape[-1]))
        return real(pool, pid, slot, *args, **kw)

    monkeypatch.setattr(paged, "read_pool", counting)
    fast = lw.run(materialize(case, "cpu"))
    fast_spans = list(spans)
    monkeypatch.setattr(paged, "GATHER_WINDOW_ONLY", False)
    spans.clear()
    full = lw.run(materialize(case, "cpu"))
    T = max(case.context_lens) + case.block_size
    assert max(spans) >= max(case.context_lens) and max(fast_spans) < max(spans)  # the window's keys only
    assert max(fast_spans) <= case.window[0] + case.block_size
    ulp = 2.0 ** -7 if case.dtype == "bfloat16" else 2.0 ** -10
    top = float(full.out.float().abs().max())
    assert float((fast.out.float() - full.out.float()).abs().max()) <= ulp * max(top, 1e-3)
    fin = torch.isfinite(full.lse)
    assert torch.equal(fin, torch.isfinite(fast.lse)) and bool(fin.any())
    assert float((fast.lse[fin] - full.lse[fin]).abs().max()) <= 1e-5 * (1 + float(full.lse[fin].abs().max()))
    ref = attention(materialize(case, "cpu"))  # and both against the oracle, as a check would judge them
    assert float((fast.out.float() - ref.out).abs().max()) <= 8 * ulp * max(top, 1e-3), T


def test_the_comparison_tells_a_window_one_key_short():
    """The negative control of the test above: the same comparison fails when the window gather drops one
    visible key (the full gather with `window_left - 1` against the window gather with `window_left`)."""
    case = build_case((600, 37), 4, 2, 2, 64, 16, window=(31, 31), seed=5)
    inputs = materialize(case, "cpu")
    B, K, Hq, D = inputs.q.shape
    rows = inputs.q.reshape(B * K, 1, Hq, D)
    table = inputs.page_table.repeat_interleave(K, dim=0)
    lens = [L + i + 1 for L in case.context_lens for i in range(K)]
    kw = dict(layout=case.layout, page_size=case.page_size, scale=case.softmax_scale)
    ensure_block_in_pool(inputs)  # the block's keys at positions L.. of each request, as the lowerings put them
    good, lse_good = paged.paged_attention(rows, inputs.k_pool, inputs.v_pool, table, lens, window_left=31, **kw)
    short, lse_short = paged.paged_attention(rows, inputs.k_pool, inputs.v_pool, table, lens, window_left=30, **kw)
    ulp = 2.0 ** -7
    top = float(good.float().abs().max())
    assert float((good.float() - short.float()).abs().max()) > ulp * top
    assert float((lse_good - lse_short).abs().max()) > 1e-5 * (1 + float(lse_good.abs().max()))


# --- one gather per request for one-query rows (`paged.GROUP_DECODE_ROWS`) -----------------------------------

def _both_ways(monkeypatch, run):
    """`run()` with the rows of a request read through one gather, then through one gather per row; the
    number of key positions read from the pools (`read_pool`'s page ids) each way."""
    calls: list[int] = []
    real = paged.read_pool

    def counting(pool, pid, slot, *args, **kw):
        calls.append(int(pid.numel()))
        return real(pool, pid, slot, *args, **kw)

    monkeypatch.setattr(paged, "read_pool", counting)
    grouped = run()
    n_grouped = sum(calls)
    monkeypatch.setattr(paged, "GROUP_DECODE_ROWS", False)
    calls.clear()
    per_row = run()
    return grouped, per_row, n_grouped, sum(calls)


def _close(a_out, a_lse, b_out, b_lse, dtype):
    ulp = 2.0 ** -7 if dtype == torch.bfloat16 else 2.0 ** -10
    top = float(b_out.float().abs().max())
    assert float((a_out.float() - b_out.float()).abs().max()) <= ulp * max(top, 1e-3)
    fin = torch.isfinite(b_lse)
    assert torch.equal(fin, torch.isfinite(a_lse))
    if bool(fin.any()):
        assert float((a_lse[fin] - b_lse[fin]).abs().max()) <= 1e-5 * (1 + float(b_lse[fin].abs().max()))


@pytest.mark.parametrize("spec", [
    dict(context_lens=(700, 33, 64, 1), block_size=5, num_kv_heads=2, group=4, head_dim=128, page_size=16),
    dict(context_lens=(900, 5), block_size=7, num_kv_heads=1, group=4, head_dim=64, page_size=64,
         window=(100, 6), layout="HND", dtype="float16"),
    dict(context_lens=(300, 0, 129), block_size=3, num_kv_heads=2, group=2, head_dim=64, page_size=32,
         kv_dtype="float8_e4m3fn", k_scale=0.5, v_scale=2.0),
], ids=["bf16", "hnd-fp16-window", "fp8"])
@pytest.mark.parametrize("name", ["decode_rows", "windowed_merge[eager]"])  # their rows are one query each
def test_one_gather_per_request_matches_one_per_row(spec, name, monkeypatch):
    case = build_case(**spec, seed=7)
    lw = lowerings.get(name)
    if lw.supports(case):
        pytest.skip(f"{name} does not take this case: {lw.supports(case)}")
    grouped, per_row, n_grouped, n_per_row = _both_ways(monkeypatch, lambda: lw.run(materialize(case, "cpu")))
    assert n_grouped < n_per_row  # the fast path ran: fewer keys read
    _close(grouped.out, grouped.lse, per_row.out, per_row.lse, grouped.out.dtype)
    ref = attention(materialize(case, "cpu"))
    ulp = 2.0 ** -7 if case.dtype == "bfloat16" else 2.0 ** -10
    assert float((grouped.out.float() - ref.out).abs().max()) <= 8 * ulp * max(float(ref.out.abs().max()), 1e-3)


def test_rows_of_one_request_keep_their_own_lengths_and_window(monkeypatch):
    """The grouping is by page-table row alone: rows of one run with any lengths (0 included, as a mutant's
    overridden lengths may be) and a window give what each gives alone; a table whose rows all differ (a
    mutant's wrong mapping) is read row by row."""
    g = torch.Generator().manual_seed(3)
    P, page, Hkv, D, Hq = 12, 8, 2, 64, 4
    k_pool = torch.randn(P, page, Hkv, D, generator=g).to(torch.bfloat16)
    v_pool = torch.randn(P, page, Hkv, D, generator=g).to(torch.bfloat16)
    a, b = torch.randperm(P, generator=g)[:6], torch.randperm(P, generator=g)[:6]
    table = torch.stack([a, a, a, b, b, a]).to(torch.int32)  # runs [0, 3), [3, 5), [5, 6)
    lens = [40, 0, 17, 48, 3, 25]
    q = torch.randn(6, 1, Hq, D, generator=g).to(torch.bfloat16)
    for window in (-1, 5):
        kw = dict(layout="NHD", page_size=page, scale=0.125, window_left=window)
        monkeypatch.setattr(paged, "GROUP_DECODE_ROWS", True)
        (o, l), (o1, l1), n_g, n_r = _both_ways(
            monkeypatch, lambda: paged.paged_attention(q, k_pool, v_pool, table, lens, **kw))
        # unwindowed, a run reads its keys once; under this window its rows lie far apart, so the rows alone
        # read fewer keys and are read alone
        assert n_g < n_r if window < 0 else n_g == n_r
        _close(o, l, o1, l1, torch.bfloat16)
        assert bool(torch.isinf(l[1]).all()) and not bool(o[1].any())  # the empty row stays empty
        alone = [paged.paged_attention(q[n:n + 1], k_pool, v_pool, table[n:n + 1], [lens[n]], **kw) for n in range(6)]
        _close(o, l, torch.cat([x[0] for x in alone]), torch.cat([x[1] for x in alone]), torch.bfloat16)
    monkeypatch.setattr(paged, "GROUP_DECODE_ROWS", True)
    distinct = torch.stack([torch.roll(a, i) for i in range(6)]).to(torch.int32)
    _, _, n_g, n_r = _both_ways(monkeypatch, lambda: paged.paged_attention(q, k_pool, v_pool, distinct, lens,
                                                                             layout="NHD", page_size=page, scale=0.125))
    assert n_g == n_r  # no run of equal rows: row by row


def test_the_comparison_tells_a_row_one_key_short(monkeypatch):
    """The negative control of the two tests above: the same comparison fails when one row of a run reads
    one key fewer."""
    g = torch.Generator().manual_seed(4)
    k_pool = torch.randn(6, 8, 2, 64, generator=g).to(torch.bfloat16)
    v_pool = torch.randn(6, 8, 2, 64, generator=g).to(torch.bfloat16)
    table = torch.randperm(6, generator=g).to(torch.int32).repeat(3, 1)
    q = torch.randn(3, 1, 4, 64, generator=g).to(torch.bfloat16)
    kw = dict(layout="NHD", page_size=8, scale=0.125)
    o, l = paged.paged_attention(q, k_pool, v_pool, table, [30, 31, 32], **kw)
    o1, l1 = paged.paged_attention(q, k_pool, v_pool, table, [30, 31, 31], **kw)
    with pytest.raises(AssertionError):
        _close(o, l, o1, l1, torch.bfloat16)
