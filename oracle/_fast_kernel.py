"""The oracle's fast engine: one Triton kernel, fp32-exact, for production-scale cases on a GPU.

Same semantics as `reference.attention`'s torch engine (docs/semantics.md 2-3), same precision class: every
product is exact and every sum is an fp32 sum. The tensor cores are used without losing that:

- `q . k`: q and k are bf16 or fp16 (fp8 keys are converted to q's dtype, exactly: e4m3 values are
  bf16 and fp16 values). A product of two 8-bit (11-bit) significands fits in fp32's 24 bits, so the
  MMA's products are exact and it accumulates them in fp32. `k_scale` multiplies the fp32 score.
- `KV_ROUNDED` (a variant of its own, launched only for an fp8 pool whose scales do not dequantize exactly into
  q's dtype): the pool's keys and values dequantized (`stored * scale`, fp32) and rounded to q's dtype before use,
  as a working-dtype computation over dequantized pages reads them (`reference.working_dtype_output`, the
  judge's yardstick); the scales are then 1. Off, the kernel is the one above, op for op.
- `p @ v`: the fp32 probabilities `p` are split into three bf16 terms `p1 + p2 + p3 == p` (8 + 8 + 8
  significand bits, exact for normal values), fp16 values into two bf16 terms `v1 + v2 == v` (exact),
  and the products summed in fp32: `p @ v` to fp32 accuracy, never TF32 (TF32 would round p to 11 bits).
- `ROUND_P` (the judge's yardstick, `reference.working_dtype_output`): `p` rounded to q's dtype and one
  tensor-core dot with the values in q's dtype, the order of flash kernels; off, the kernel is the one above.
- `F64` (the golden reference, `oracle.reference.attention(precision=torch.float64)` on a GPU): q, k and v in fp64,
  fp64 dots, softmax and accumulators, the scales read in fp64 from `SC` (`[scale * k_scale, v_scale, scale]`).
- exponentials and the online softmax in fp32, like the torch engine; splits of the key range across
  programs (flash-decoding) merge in `_finish_kernel.py` (fp64, rounded once to the partials' dtype).

Grid `(B * Hkv, row_blocks, splits)`: a program takes `BLOCK_R` query rows `r = i * G + g` (query `i`,
head `h * G + g`) of one request and KV head, and one split of the request's key positions; it reads
each key once per row block, through the page table (NHD or HND), then the dense block suffix when
the block is not in the pool. Masks follow the case's window and, for part B of a windowed merge, the
later block keys `i < j <= min(K-1, i + right)`.

Under the interpreter (CPU tests) `UPCAST` turns tiles into fp32 before the products (the interpreter
does not emulate bf16 products), so the CPU checks the indexing and masking, the GPU the precision.
"""

from __future__ import annotations

import triton
import triton.language as tl

from oracle._paged_tile import block_rows, page_of, pool_rows


@triton.jit
def _nearest_bf16(x):
    """fp32 `x` rounded to the nearest bf16 (ties to even), as fp32. The interpreter (triton 3.9) truncates an fp32
    to bf16 conversion, the compiled kernel rounds to nearest: the interpreter's path rounds by hand first, then
    converts exactly."""
    bits = x.to(tl.int32, bitcast=True)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _f64(x, UPCAST: tl.constexpr):
    """A 16-bit (or fp8) tile as fp64, exactly (through fp32). Compiled, the conversion is an inline `cvt.f64.f32`
    marked impure: triton 3.6 hoists a plain `.to(tl.float64)` into the fp64 dot's operand layout, which it then
    fails to lower from a 16-bit load (`ConvertTritonGPUToLLVM`); an impure op is not hoisted. The interpreter
    (`UPCAST`) converts directly."""
    if UPCAST:
        return x.to(tl.float32).to(tl.float64)
    else:
        return tl.inline_asm_elementwise("cvt.f64.f32 $0, $1;", "=d,f", [x.to(tl.float32)], dtype=tl.float64,
                                         is_pure=False, pack=1)


@triton.jit
def _tile(q, k, v, t, t_ok, pos, i_row, row_ok, L, acc, m_i, l_i,
          qk_scale, v_scale, left, right, fbk, fbk_right, K,
          V_SPLIT: tl.constexpr, UPCAST: tl.constexpr, ROUND_P: tl.constexpr, F64: tl.constexpr = False):
    """Fold one tile of keys `t [BLOCK_N]` (values `k, v [BLOCK_N, D_PAD]`) into the online softmax; `fbk`
    (0/1, run time): part B of a windowed merge, only the later block keys."""
    if F64:  # through fp32 (exact): fp8 converts to fp64 no other way
        s = tl.dot(_f64(q, UPCAST), tl.trans(_f64(k, UPCAST)))
    elif UPCAST:
        s = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)), input_precision="ieee")
    else:
        s = tl.dot(q, tl.trans(k.to(q.dtype)))
    s = s * qk_scale
    vis = t_ok[None, :] & row_ok[:, None] & (t[None, :] < L + K)
    if left >= 0:
        vis = vis & (t[None, :] >= pos[:, None] - left)
    if right >= 0:
        vis = vis & (t[None, :] <= pos[:, None] + right)
    if fbk != 0:
        j = t[None, :] - L
        hi = i_row[:, None] + fbk_right
        if fbk_right < 0:
            hi = i_row[:, None] * 0 + (K - 1)
        vis = vis & (j > i_row[:, None]) & (j <= hi) & (j <= K - 1)
    s = tl.where(vis, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp(m_i - m_safe)
    p = tl.exp(s - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    if F64:
        pv = tl.dot(p, _f64(v, UPCAST))
    elif ROUND_P:  # the yardstick's order: P in q's dtype before P.V, as flash kernels feed the tensor cores
        if UPCAST:
            if q.dtype == tl.bfloat16:
                pw = _nearest_bf16(p)
            else:
                pw = p.to(tl.float16).to(tl.float32)
            pv = tl.dot(pw, v.to(tl.float32), input_precision="ieee")
        else:
            pv = tl.dot(p.to(q.dtype), v.to(q.dtype))
    elif UPCAST:
        pv = tl.dot(p, v.to(tl.float32), input_precision="ieee")
    else:
        p1 = p.to(tl.bfloat16)
        r1 = p - p1.to(tl.float32)
        p2 = r1.to(tl.bfloat16)
        p3 = (r1 - p2.to(tl.float32)).to(tl.bfloat16)
        if V_SPLIT:
            vf = v.to(tl.float32)
            v1 = vf.to(tl.bfloat16)
            v2 = (vf - v1.to(tl.float32)).to(tl.bfloat16)
            pv = tl.dot(p1, v1)
            pv = tl.dot(p2, v1, pv)
            pv = tl.dot(p3, v1, pv)
            pv = tl.dot(p1, v2, pv)
            pv = tl.dot(p2, v2, pv)
        else:
            vb = v.to(tl.bfloat16)
            pv = tl.dot(p1, vb)
            pv = tl.dot(p2, vb, pv)
            pv = tl.dot(p3, vb, pv)
    acc = acc * alpha[:, None] + pv * v_scale
    return acc, m_new, l_i


# Values that change from case to case are run-time arguments, never specialized on (no "== 1" or
# "divisible by 16" variants): a sweep over K, GQA groups, page sizes, windows, batch sizes and page-table
# views compiles the kernel once per (D, row block, dtypes), not once per case shape. The block's storage
# (`appended`) and the window-B mask (`fbk`) are run-time switches too: as constexprs they made four
# variants of each (a cold cache compiled 100 variants, over a second each: docs/gpu/2026-12-03-h200-session22.md);
# the arithmetic each case runs is the same either way, only its masks read the switches. The
# tensor strides stay specialized: with D in {64, 128} they are multiples of 16 in every case, which keeps
# the loads vectorized.
RUNTIME_ARGS = ["s_pt_b", "s_pt_c", "Hkv", "n_splits", "left", "right", "appended", "fbk", "fbk_right", "K", "G",
                "PAGE", "R_TOT"]


@triton.jit(do_not_specialize=RUNTIME_ARGS)
def _oracle_kernel(
    Q, KP, VP, KB, VB, PT, LENS, ACC, M, LS,
    s_qb, s_qk, s_qh,
    s_kp_page, s_kp_slot, s_kp_head,
    s_vp_page, s_vp_slot, s_vp_head,
    s_kb_b, s_kb_k, s_kb_h,
    s_vb_b, s_vb_k, s_vb_h,
    s_pt_b, s_pt_c,
    Hkv, n_splits, sm_scale, k_scale, v_scale, left, right, appended, fbk, fbk_right, K, G, PAGE, R_TOT,
    D: tl.constexpr, D_PAD: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr, K_PAD: tl.constexpr,
    V_SPLIT: tl.constexpr, UPCAST: tl.constexpr, KV_ROUNDED: tl.constexpr = False, ROUND_P: tl.constexpr = False,
    F64: tl.constexpr = False, SC=None,
):
    pid_bh = tl.program_id(0)
    rb = tl.program_id(1)
    sp = tl.program_id(2)
    b = pid_bh // Hkv
    h = pid_bh % Hkv
    L = tl.load(LENS + b).to(tl.int32)

    rows = rb * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = rows < K * G
    i_row = rows // G
    g = rows % G
    pos = L + i_row
    d = tl.arange(0, D_PAD)
    d_ok = d < D
    q = tl.load(Q + b.to(tl.int64) * s_qb + i_row[:, None] * s_qk + (h * G + g)[:, None] * s_qh + d[None, :],
                mask=row_ok[:, None] & d_ok[None, :], other=0.0)

    if F64:  # fp64 throughout, the scales read in fp64 from SC (a float argument would be rounded to fp32)
        m_i = tl.full([BLOCK_R], float("-inf"), tl.float64)
        l_i = tl.zeros([BLOCK_R], tl.float64)
        acc = tl.zeros([BLOCK_R, D_PAD], tl.float64)
        qk_pool = tl.load(SC)
        v_pool = tl.load(SC + 1)
        qk_block = tl.load(SC + 2)
    else:
        m_i = tl.full([BLOCK_R], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_R], tl.float32)
        acc = tl.zeros([BLOCK_R, D_PAD], tl.float32)
        qk_pool = sm_scale * k_scale
        v_pool = v_scale
        qk_block = sm_scale

    # The pool's key range for this request, narrowed by the window, then this program's split of it.
    hi = L + 0
    if appended != 0:
        hi = L + K
    lo = L * 0
    if left >= 0:
        lo = tl.maximum(L - left, 0)
    if right >= 0:
        hi = tl.minimum(hi, L + K + right)
    if fbk != 0:
        lo = tl.maximum(lo, L + 1)
    total = tl.maximum(hi - lo, 0)
    per = tl.cdiv(tl.cdiv(total, n_splits), BLOCK_N) * BLOCK_N
    start = lo + sp * per
    end = tl.minimum(hi, start + per)
    for t0 in range(start, end, BLOCK_N):
        t = t0 + tl.arange(0, BLOCK_N)
        t_ok = t < end
        page = page_of(PT, b, t, t_ok, s_pt_b, s_pt_c, PAGE)
        slot = t % PAGE
        kv_mask = t_ok[:, None] & d_ok[None, :]
        k = pool_rows(KP, page, slot, h, d, s_kp_page, s_kp_slot, s_kp_head, kv_mask)
        v = pool_rows(VP, page, slot, h, d, s_vp_page, s_vp_slot, s_vp_head, kv_mask)
        if KV_ROUNDED:
            k_deq = k.to(tl.float32) * k_scale
            v_deq = v.to(tl.float32) * v_scale
            if UPCAST:
                if Q.dtype.element_ty == tl.bfloat16:
                    k_deq = _nearest_bf16(k_deq)
                    v_deq = _nearest_bf16(v_deq)
            k_rounded = k_deq.to(q.dtype)
            v_rounded = v_deq.to(q.dtype)
            acc, m_i, l_i = _tile(q, k_rounded, v_rounded, t, t_ok, pos, i_row, row_ok, L, acc, m_i, l_i,
                                  sm_scale, 1.0, left, right, fbk, fbk_right, K,
                                  V_SPLIT, UPCAST, ROUND_P)
        else:
            acc, m_i, l_i = _tile(q, k, v, t, t_ok, pos, i_row, row_ok, L, acc, m_i, l_i,
                                  qk_pool, v_pool, left, right, fbk, fbk_right, K,
                                  V_SPLIT, UPCAST, ROUND_P, F64)

    if appended == 0:
        if sp == 0:
            j = tl.arange(0, K_PAD)
            j_ok = j < K
            kv_mask = j_ok[:, None] & d_ok[None, :]
            kb = block_rows(KB, b, j, h, d, s_kb_b, s_kb_k, s_kb_h, kv_mask)
            vb = block_rows(VB, b, j, h, d, s_vb_b, s_vb_k, s_vb_h, kv_mask)
            acc, m_i, l_i = _tile(q, kb, vb, L + j, j_ok, pos, i_row, row_ok, L, acc, m_i, l_i,
                                  qk_block, 1.0, left, right, fbk, fbk_right, K,
                                  V_SPLIT, UPCAST, ROUND_P, F64)

    # Partials of this split: acc (unnormalized), running max, running sum, in fp32.
    base = ((sp * tl.num_programs(0) + pid_bh) * R_TOT + rows).to(tl.int64)
    tl.store(M + base, m_i)
    tl.store(LS + base, l_i)
    tl.store(ACC + base[:, None] * D_PAD + d[None, :], acc)



ORACLE_KERNEL = _oracle_kernel  # the handle oracle/_fast.py launches (the kernel keeps its name: the profiler lists it)
