"""The last step of the oracle's Triton engine: merge the key-range splits, normalize, write the result in place.

`oracle/_fast_kernel.py` leaves, per split `s`, program `p = b * Hkv + h` and padded row `r` (`r = i * G + g`), the
unnormalized `ACC [S, P, R_TOT, D_PAD]`, the running maximum `M` and sum `LS [S, P, R_TOT]` (fp32, or fp64 for the
`F64` variant). This kernel, one program per (request and KV head, row block), merges them in fp64 (exact differences
`m_s - max_s m_s`, fp64 `exp` and `log`: it adds no error but the final rounding to the partials' dtype), and stores

- `OUT [B, K, Hq, D]` and the natural-log `LSE [B, K, Hq]` in the partials' dtype; a row no split saw gets
  `(0, -inf)`, a row whose partials hold a NaN or an infinite maximum `(NaN, NaN)`;
- `FIG [P * row_blocks, 5]` in fp64, per program, over its valid rows and the values as stored: `max |O|` over
  finite elements, `sum O^2` over finite elements, `min |LSE|` and `max |LSE|` over finite LSEs (`inf` and 0 where
  none), and the count of non-finite outputs plus NaN or `+inf` LSEs. The host reads them in one transfer
  (`oracle.reference.OutputSummary`) instead of reducing the output with torch ops.
"""

from __future__ import annotations

import triton
import triton.language as tl

FINISH_RUNTIME_ARGS = ["S", "P", "R_TOT", "Hkv", "K", "G", "s_ob", "s_ok", "s_oh", "s_lb", "s_lk", "s_lh"]


@triton.jit(do_not_specialize=FINISH_RUNTIME_ARGS)
def _finish_kernel(
    ACC, M, LS, OUT, LSE, FIG,
    S, P, R_TOT, Hkv, K, G,
    s_ob, s_ok, s_oh, s_lb, s_lk, s_lh,
    D: tl.constexpr, D_PAD: tl.constexpr, BLOCK_R: tl.constexpr,
):
    pid = tl.program_id(0)
    rb = tl.program_id(1)
    b = pid // Hkv
    h = pid % Hkv
    rows = rb * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = rows < K * G
    d = tl.arange(0, D_PAD)
    d_ok = d < D
    ok2 = row_ok[:, None] & d_ok[None, :]

    mx = tl.full([BLOCK_R], float("-inf"), tl.float64)  # the splits' largest running maximum, per row
    for s in range(0, S):
        base = ((s * P + pid) * R_TOT + rows).to(tl.int64)
        mx = tl.maximum(mx, tl.load(M + base, mask=row_ok, other=float("-inf")).to(tl.float64))
    safe = tl.where(mx == float("-inf"), 0.0, mx)
    l = tl.zeros([BLOCK_R], tl.float64)
    a = tl.zeros([BLOCK_R, D_PAD], tl.float64)
    for s in range(0, S):
        base = ((s * P + pid) * R_TOT + rows).to(tl.int64)
        m_s = tl.load(M + base, mask=row_ok, other=float("-inf")).to(tl.float64)
        w = tl.exp(m_s - safe)  # exp(-inf) = 0: an empty split adds nothing
        l += w * tl.load(LS + base, mask=row_ok, other=0.0).to(tl.float64)
        acc = tl.load(ACC + base[:, None] * D_PAD + d[None, :], mask=ok2, other=0.0).to(tl.float64)
        a += w[:, None] * acc
    has = l > 0
    nan_row = l != l  # a NaN or an infinite maximum in a partial: NaN out, as the merge's arithmetic gives
    o = tl.where(has[:, None], a / tl.where(has, l, 1.0)[:, None], tl.where(nan_row[:, None], float("nan"), 0.0))
    lse = tl.where(has, mx + tl.log(tl.where(has, l, 1.0)), tl.where(nan_row, float("nan"), float("-inf")))

    i_row = rows // G
    head = h * G + rows % G
    o_off = b.to(tl.int64) * s_ob + i_row[:, None] * s_ok + head[:, None] * s_oh + d[None, :]
    l_off = b.to(tl.int64) * s_lb + i_row * s_lk + head * s_lh
    o_st = o.to(OUT.dtype.element_ty)  # fp64 to fp32 rounds to nearest, compiled and interpreted
    tl.store(OUT + o_off, o_st, mask=ok2)
    lse_st = lse.to(LSE.dtype.element_ty)
    tl.store(LSE + l_off, lse_st, mask=row_ok)

    o_abs = tl.abs(o_st.to(tl.float64))
    l_abs = tl.abs(lse_st.to(tl.float64))
    o_fin = o_abs < float("inf")  # False for NaN and +-inf
    l_fin = row_ok & (l_abs < float("inf"))
    oa = tl.where(ok2 & o_fin, o_abs, 0.0)
    f = (pid * tl.num_programs(1) + rb).to(tl.int64) * 5
    tl.store(FIG + f, tl.max(tl.max(oa, 1), 0))
    tl.store(FIG + f + 1, tl.sum(tl.sum(oa * oa, 1), 0))
    tl.store(FIG + f + 2, tl.min(tl.where(l_fin, l_abs, float("inf")), 0))
    tl.store(FIG + f + 3, tl.max(tl.where(l_fin, l_abs, 0.0), 0))
    l_bad = row_ok & ~l_fin & ~(lse_st < 0)  # NaN and +inf; an empty row's -inf is not one
    n_bad = tl.sum(tl.sum((ok2 & ~o_fin).to(tl.int32), 1), 0) + tl.sum(l_bad.to(tl.int32), 0)
    tl.store(FIG + f + 4, n_bad.to(tl.float64))


FINISH_KERNEL = _finish_kernel
