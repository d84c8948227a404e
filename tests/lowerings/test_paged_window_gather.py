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
    case = build_case(spec["context_lens"], spec["block_size"], spec["num_kv_heads"], spec["group"], spec["head_dim"],
                      spec["page_size"], **{k: v for k, v in spec.items() if k not in (
                          "context_lens", "block_size", "num_kv_heads", "group", "head_dim", "page_size")}, seed=5)
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
