"""Torch emulations of the paged kernels the production lowerings call (CPU or CUDA, working dtype).

They compute the way a flash kernel does: scores from the working-dtype q and k accumulated in fp32,
an fp32 softmax, probabilities rounded to the working dtype for the P.V product with fp32
accumulation, and the output rounded once. The LSE comes back in base 2, as flashinfer returns it.
This is deliberately not the oracle: it reads through its own page-table code, in the working dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lowerings import counters
from oracle.rules import LOG2E

FP8 = getattr(torch, "float8_e4m3fn", None)
# Rows gathered at once are bounded so that memory stays small on long contexts.
MAX_GATHER_ELEMS = 1 << 24
GATHER_WINDOW_ONLY = True  # `paged_attention` gathers only a window's keys (False: all of them, for a test)
GROUP_DECODE_ROWS = True  # one gather for consecutive one-query rows on the same page-table row (False: per row)


def read_pool(pool: torch.Tensor, pid: torch.Tensor, slot: torch.Tensor, layout: str, scale: float,
               dtype: torch.dtype) -> torch.Tensor:
    x = pool[pid, slot] if layout == "NHD" else pool[pid, :, slot]
    if pool.dtype == FP8:
        return (x.float() * scale).to(dtype)
    return x


def append_paged_kv(k_pool: torch.Tensor, v_pool: torch.Tensor, page_table: torch.Tensor, context_lens: list[int],
                    k_block: torch.Tensor, v_block: torch.Tensor, *, layout: str, page_size: int,
                    k_scale: float = 1.0, v_scale: float = 1.0) -> None:
    """Write the block's K/V `[B, K, Hkv, D]` into the pool at positions `L_b .. L_b+K-1`, in place."""
    counters.record("torch.append_paged_kv")
    B, K = k_block.shape[:2]
    dev = k_pool.device
    for b in range(B):
        t = torch.arange(context_lens[b], context_lens[b] + K, device=dev)
        pid = page_table[b].to(torch.long)[t // page_size]
        slot = t % page_size
        for pool, blk, sc in ((k_pool, k_block[b], k_scale), (v_pool, v_block[b], v_scale)):
            val = (blk.float() / sc).to(pool.dtype) if pool.dtype == FP8 else blk.to(pool.dtype)
            if layout == "NHD":
                pool[pid, slot] = val
            else:
                pool[pid, :, slot] = val


@dataclass(frozen=True)
class PagedOptions:
    """The keyword options of `paged_attention`: the pools' `layout` ("NHD" `[pages, page_size, Hkv, D]` or "HND"
    `[pages, Hkv, page_size, D]`) and `page_size`, the softmax `scale` on `<q, k>`, `window_left=W` (keys
    `t >= p - W`; -1 none), `causal` (keys `t <= p`), `k_scale`/`v_scale` (an fp8 pool's dequantization:
    `stored * scale`)."""

    layout: str
    page_size: int
    scale: float
    window_left: int = -1
    causal: bool = False
    k_scale: float = 1.0
    v_scale: float = 1.0


def _gather_keys(k_pool: torch.Tensor, v_pool: torch.Tensor, table: torch.Tensor, t: torch.Tensor,
                 valid: torch.Tensor, o: PagedOptions, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values `[n, span, Hkv, D]` in `dtype` at absolute positions `t [n, span]` of page-table rows
    `table [n, P]`; zeros where `valid [n, span]` is False (page 0 read in their place, never used)."""
    layout, page_size, k_scale, v_scale = o.layout, o.page_size, o.k_scale, o.v_scale
    col = torch.clamp(t // page_size, max=table.shape[1] - 1)
    pid = torch.gather(table.to(torch.long), 1, col)
    pid = torch.where(valid, pid, torch.zeros_like(pid))
    slot = t % page_size
    z = torch.zeros((), dtype=dtype, device=t.device)
    n, span = t.shape
    k = torch.where(valid.view(n, span, 1, 1), read_pool(k_pool, pid, slot, layout, k_scale, dtype), z)
    v = torch.where(valid.view(n, span, 1, 1), read_pool(v_pool, pid, slot, layout, v_scale, dtype), z)
    return k, v


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float):
    """Flash-style attention of `q [N, M, Hq, D]` over `k, v [N, T, Hkv, D]` with `mask [N, M, T]`.

    Returns `out [N, M, Hq, D]` in q's dtype and `lse [N, M, Hq]` fp32 in base 2 (`-inf` for empty rows).
    """
    N, M, Hq, D = q.shape
    Hkv = k.shape[2]
    G = Hq // Hkv
    qf = q.float().view(N, M, Hkv, G, D)
    s = torch.einsum("nmhgd,nthd->nhgmt", qf, k.float()) * scale
    s = s.masked_fill(~mask.view(N, 1, 1, M, -1), float("-inf"))
    m = s.amax(dim=-1, keepdim=True)
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    p = torch.exp(s - m)
    l = p.sum(dim=-1, keepdim=True)
    o = torch.einsum("nhgmt,nthd->nhgmd", p.to(q.dtype).float(), v.float())
    o = torch.where(l > 0, o / torch.where(l > 0, l, torch.ones_like(l)), torch.zeros_like(o))
    lse = torch.where(l > 0, (m + torch.log(torch.where(l > 0, l, torch.ones_like(l)))) * LOG2E,
                      torch.full_like(l, float("-inf"))).squeeze(-1)
    out = o.permute(0, 3, 1, 2, 4).reshape(N, M, Hq, D).to(q.dtype)
    return out, lse.permute(0, 3, 1, 2).reshape(N, M, Hq)


def paged_attention(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, page_table: torch.Tensor,
                    kv_lens: list[int], **options):
    """Paged attention of `q [N, M, Hq, D]` (M queries per row at the last M positions of the row's
    `kv_lens[n]` keys, bottom-right aligned as flashinfer aligns them) over page-table rows
    `page_table [N, P]`. Keyword options (`PagedOptions`): `layout`, `page_size` and `scale` required;
    `window_left=W` keeps keys `t >= p - W`; `causal` keeps `t <= p`; `k_scale`, `v_scale` (default 1.0).
    Returns `out [N, M, Hq, D]` (q's dtype) and `lse [N, M, Hq]` fp32 base 2.
    """
    try:
        o = PagedOptions(**options)
    except TypeError as err:
        raise TypeError(f"paged_attention(): {err}") from None
    layout, window_left, causal = o.layout, o.window_left, o.causal
    N, M, Hq, D = q.shape
    dev = q.device
    if N == 0:
        return q.new_zeros(q.shape), torch.zeros((0, M, Hq), device=dev)
    if GROUP_DECODE_ROWS and M == 1 and N > 1:
        runs = _same_table_runs(page_table)
        if len(runs) < N:
            done = _grouped_decode_rows(q, k_pool, v_pool, page_table, kv_lens, runs, o)
            if done is not None:
                return done
    Hkv = k_pool.shape[2] if layout == "NHD" else k_pool.shape[1]
    lens = torch.tensor(kv_lens, device=dev, dtype=torch.long)
    T = max(int(max(kv_lens)), 1)
    # Under a window, a row's visible keys lie in its last `M + window_left` positions: only those are
    # gathered (from a per-row start), not all T (part A of a windowed merge at 128K keys and a 4K window
    # gathered 32x what it used, docs/gpu/2026-12-03-h200-session13.md). Keys
    # outside the window had weight exactly 0, so only the order of the fp32 sums changes.
    span = window_left + M if (GATHER_WINDOW_ONLY and window_left >= 0 and window_left + M < T) else T
    rows_per = max(1, MAX_GATHER_ELEMS // max(1, span * Hkv * D))
    outs, lses = [], []
    for n0 in range(0, N, rows_per):
        n1 = min(N, n0 + rows_per)
        ln = lens[n0:n1].view(-1, 1)
        start = torch.clamp(ln - span, min=0) if span < T else torch.zeros_like(ln)
        t = start + torch.arange(span, device=dev).view(1, -1)  # [n, span] absolute key positions
        valid = t < ln
        k, v = _gather_keys(k_pool, v_pool, page_table[n0:n1], t, valid, o, q.dtype)
        pos = ln - M + torch.arange(M, device=dev).view(1, -1)  # [n, M]
        mask = valid.view(-1, 1, span) & torch.ones((1, M, 1), dtype=torch.bool, device=dev)
        if window_left >= 0:
            mask = mask & (t.view(-1, 1, span) >= (pos - window_left).unsqueeze(-1))
        if causal:
            mask = mask & (t.view(-1, 1, span) <= pos.unsqueeze(-1))
        out, lse = attend(q[n0:n1], k, v, mask, o.scale)
        outs.append(out)
        lses.append(lse)
    return torch.cat(outs), torch.cat(lses)


def _same_table_runs(page_table: torch.Tensor) -> list[tuple[int, int]]:
    """`[(n0, n1), ...]`: the runs of consecutive rows whose page-table rows are equal (one device sync)."""
    N = page_table.shape[0]
    same = (page_table[1:] == page_table[:-1]).all(dim=1).tolist() if N > 1 else []
    runs, n0 = [], 0
    for n in range(1, N):
        if not same[n - 1]:
            runs.append((n0, n))
            n0 = n
    runs.append((n0, N))
    return runs


def _grouped_decode_rows(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, page_table: torch.Tensor,
                         kv_lens: list[int], runs: list[tuple[int, int]], o: PagedOptions):
    """`paged_attention` of one-query rows `q [N, 1, Hq, D]`, the rows of each run in `runs` (consecutive rows
    on the same page-table row: the K decode rows of one request) read through one gather of the keys the
    run's rows can see, instead of one gather per row. Each row keeps its own length and window (its own
    mask), so it attends to exactly the keys it did alone; only the order of the fp32 sums changes. Decode
    rows at 128K keys gathered each request's keys K times.
    None where it would read no fewer keys than the rows alone (rows of one run far apart under a window)."""
    N, _, Hq, D = q.shape
    dev = q.device
    window_left = o.window_left
    Hkv = k_pool.shape[2] if o.layout == "NHD" else k_pool.shape[1]
    R = max(n1 - n0 for n0, n1 in runs)
    G = len(runs)
    first = [n0 for n0, _ in runs]
    lens_g = torch.zeros((G, R), dtype=torch.long)  # per group and row slot; 0 for the padding slots
    rows_g = torch.full((G, R), -1, dtype=torch.long)
    for g, (n0, n1) in enumerate(runs):
        lens_g[g, : n1 - n0] = torch.tensor(kv_lens[n0:n1], dtype=torch.long)
        rows_g[g, : n1 - n0] = torch.arange(n0, n1)
    real = rows_g >= 0
    hi = lens_g.max(dim=1).values  # [G] the keys gathered end at the longest row's length
    lo = torch.where(real, lens_g, torch.full_like(lens_g, 1 << 62)).min(dim=1).values  # [G] shortest real row
    if GATHER_WINDOW_ONLY and window_left >= 0:  # a row of length n sees keys n-1-W .. n-1
        start_g = torch.clamp(lo - 1 - window_left, min=0)
    else:
        start_g = torch.zeros_like(lo)
    span = max(int((hi - start_g).max()), 1)
    T = max(int(max(kv_lens)), 1)
    row_span = window_left + 1 if (GATHER_WINDOW_ONLY and 0 <= window_left and window_left + 1 < T) else T
    if G * span >= N * row_span:
        return None
    lens_g, rows_g, real, start_g = lens_g.to(dev), rows_g.to(dev), real.to(dev), start_g.to(dev)
    q_g = q[rows_g.clamp(min=0).view(-1), 0].view(G, R, Hq, D)
    table_g = page_table[first]
    groups_per = max(1, MAX_GATHER_ELEMS // max(1, span * max(Hkv * D, Hq * R)))  # the keys and the scores
    out = q.new_zeros((N, 1, Hq, D))
    lse = torch.full((N, 1, Hq), float("-inf"), device=dev)
    for g0 in range(0, G, groups_per):
        g1 = min(G, g0 + groups_per)
        t = start_g[g0:g1].view(-1, 1) + torch.arange(span, device=dev).view(1, -1)  # [g, span]
        ln = lens_g[g0:g1]  # [g, R]
        valid = t < ln.max(dim=1, keepdim=True).values
        k, v = _gather_keys(k_pool, v_pool, table_g[g0:g1], t, valid, o, q.dtype)
        tt = t.view(-1, 1, span)
        mask = tt < ln.unsqueeze(-1)  # [g, R, span]: each row its own length
        if window_left >= 0:
            mask = mask & (tt >= (ln - 1 - window_left).unsqueeze(-1))
        og, l2 = attend(q_g[g0:g1], k, v, mask, o.scale)  # [g, R, Hq, D], [g, R, Hq]
        keep = real[g0:g1]
        idx = rows_g[g0:g1][keep]
        out[idx, 0] = og[keep]
        lse[idx, 0] = l2[keep]
    return out, lse
