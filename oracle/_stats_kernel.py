"""The statistics the oracle's error bound reads (`oracle.precision.case_stats`), in one Triton launch on a GPU.

Grid `(B * Hkv, T_SPLITS)`: program `(p = b * Hkv + h, t)` reads, of request `b` and KV head `h`, the pool positions
its split `t` covers of the `L_b` (plus `K` for an appended block) positions the request owns, through the page
table (NHD or HND: the slot and head strides say which), never a canary slot; split 0 also reads the request's `K`
queries of heads `h * G .. h * G + G - 1` and, for a dense block, its `K` block keys and values. It stores
`STATS [P, T_SPLITS, 5]`, fp32: the largest query norm, the largest pool key norm and `|v|` (the stored values,
scales not applied), the largest block key norm and `|v|` (0 where none). A NaN anywhere counts as `+inf`, so the
host sees a non-finite statistic (`tl.max` would drop it). Norms: fp32 sums of squares, as `case_stats`'s torch path.
"""

from __future__ import annotations

import triton
import triton.language as tl

from oracle._paged_tile import block_rows, page_of, pool_rows

STATS_RUNTIME_ARGS = ["s_pt_b", "s_pt_c", "Hkv", "appended", "K", "G", "PAGE", "per_split"]


@triton.jit
def _peaks(x):
    """Per row of `x [N, D_PAD]` (fp32, zeros where masked): `(norm, max |x|)`, a NaN as `+inf`."""
    n = tl.sqrt(tl.sum(x * x, 1))
    a = tl.max(tl.abs(x), 1)
    n = tl.where(n == n, n, float("inf"))
    a = tl.where(a == a, a, float("inf"))
    return n, a


@triton.jit(do_not_specialize=STATS_RUNTIME_ARGS)
def _stats_kernel(
    Q, KP, VP, KB, VB, PT, LENS, STATS,
    s_qb, s_qk, s_qh,
    s_kp_page, s_kp_slot, s_kp_head,
    s_vp_page, s_vp_slot, s_vp_head,
    s_kb_b, s_kb_k, s_kb_h,
    s_vb_b, s_vb_k, s_vb_h,
    s_pt_b, s_pt_c,
    Hkv, appended, K, G, PAGE, per_split,
    D: tl.constexpr, D_PAD: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_T: tl.constexpr, K_PAD: tl.constexpr,
):
    pid = tl.program_id(0)
    sp = tl.program_id(1)
    b = pid // Hkv
    h = pid % Hkv
    d = tl.arange(0, D_PAD)
    d_ok = d < D
    own = tl.load(LENS + b).to(tl.int32)
    if appended != 0:
        own += K

    kn = tl.zeros([BLOCK_T], tl.float32)
    vm = tl.zeros([BLOCK_T], tl.float32)
    start = sp * per_split
    end = tl.minimum(own, start + per_split)
    for t0 in range(start, end, BLOCK_T):
        t = t0 + tl.arange(0, BLOCK_T)
        t_ok = t < end
        page = page_of(PT, b, t, t_ok, s_pt_b, s_pt_c, PAGE)
        slot = t % PAGE
        mask = t_ok[:, None] & d_ok[None, :]
        k = pool_rows(KP, page, slot, h, d, s_kp_page, s_kp_slot, s_kp_head, mask).to(tl.float32)
        v = pool_rows(VP, page, slot, h, d, s_vp_page, s_vp_slot, s_vp_head, mask).to(tl.float32)
        k_norm, _ = _peaks(k)
        _, v_peak = _peaks(v)
        kn = tl.maximum(kn, k_norm)
        vm = tl.maximum(vm, v_peak)

    qn = tl.zeros([BLOCK_R], tl.float32)
    bkn = tl.zeros([K_PAD], tl.float32)
    bvm = tl.zeros([K_PAD], tl.float32)
    if sp == 0:
        for r0 in range(0, K * G, BLOCK_R):
            rows = r0 + tl.arange(0, BLOCK_R)
            r_ok = rows < K * G
            q = tl.load(Q + b.to(tl.int64) * s_qb + (rows // G)[:, None] * s_qk + (h * G + rows % G)[:, None] * s_qh
                        + d[None, :], mask=r_ok[:, None] & d_ok[None, :], other=0.0).to(tl.float32)
            q_norm, _ = _peaks(q)
            qn = tl.maximum(qn, q_norm)
        if appended == 0:
            j = tl.arange(0, K_PAD)
            mask = (j < K)[:, None] & d_ok[None, :]
            kb = block_rows(KB, b, j, h, d, s_kb_b, s_kb_k, s_kb_h, mask).to(tl.float32)
            vb = block_rows(VB, b, j, h, d, s_vb_b, s_vb_k, s_vb_h, mask).to(tl.float32)
            bkn, _ = _peaks(kb)
            _, bvm = _peaks(vb)

    out = (pid * tl.num_programs(1) + sp).to(tl.int64) * 5
    tl.store(STATS + out, tl.max(qn, 0))
    tl.store(STATS + out + 1, tl.max(kn, 0))
    tl.store(STATS + out + 2, tl.max(vm, 0))
    tl.store(STATS + out + 3, tl.max(bkn, 0))
    tl.store(STATS + out + 4, tl.max(bvm, 0))


STATS_KERNEL = _stats_kernel
