"""Hybrid paged split-KV attention: paged context + dense block suffix in one softmax (Triton).

docs/semantics.md section 4.4 (seed 003, the DFlash hybrid-context kernel). For every request ``b``, query
``i < K`` and query head ``h`` (KV head ``h // G``, ``G = Hq // Hkv``)::

    keys  = context positions 0 .. L_b - 1   (paged pool, page_table[b, t // page_size], slot t % page_size)
          + the K dense block keys            (k_block[b, :], positions L_b .. L_b + K - 1)
    s_t   = scale * <q, k_t>                  (context keys dequantized: stored * k_scale)
    O     = sum_t softmax(s)_t v_t            (context values dequantized: stored * v_scale)
    LSE   = ln sum_t exp(s_t)                 (NATURAL log, fp32)

Non-causal and unwindowed: every query of a request sees the same key set, so the ``R = K * G`` query
rows that share a KV head are processed together by one program (rows packed as ``r = i * G + g``,
padded to ``R_PAD = max(16, next_pow2(R))`` with masked loads and stores; padded rows are never
stored). Scores are kept in log2 units (``scale * log2(e)`` folded into one multiplier) and the online
softmax runs in fp32 with ``exp2``; the returned LSE is converted back to natural log.

Two paths, both CUDA-graph safe (context lengths are read on the device, grids depend only on host
shapes and the split count):

- single pass (``hybrid_paged_single``): grid ``(B * Hkv * n_row_blocks,)``; each program walks all
  context tiles of its request, then folds the block keys into the same softmax and writes O and LSE.
- split-KV / flash-decoding (``hybrid_paged_split`` then ``hybrid_paged_merge_splits``): grid
  ``(B * Hkv * n_row_blocks, num_splits)``; split ``s`` handles a contiguous range of context tiles
  (derived on the device from ``ctx_len[b]``) and writes its unnormalized partial accumulator and
  running max / sum to a workspace; the merge kernel computes the block-key part and combines it with
  all partials. ``num_splits`` is a runtime kernel argument (not constexpr, not specialized), so
  changing the batch size or the split count never compiles a new kernel.

Values that change from step to step in serving are never specialized on either (Triton would compile
a variant for "== 1" and for "divisible by 16"): the longest context ``max_ctx``, the page table's
strides (its width follows the longest request), and the workspace strides that follow the split count.
Specialized, a 500-case sweep compiled three variants in one shape family.

Empty splits (``L = 0``, ``L`` shorter than a tile, more splits than tiles) write ``m = -inf, l = 0,
acc = 0`` and contribute exactly nothing; every ``exp2(-inf - -inf)`` is guarded. Each query always has
its K block keys, so the final row sum is positive.

On a GPU the two dots run as bf16/fp16 tensor-core MMAs with fp32 accumulation (fp8 context tiles are
converted to the query dtype, which is exact for e4m3). Under ``TRITON_INTERPRET=1`` the interpreter
does not emulate bf16 arithmetic, so the constexpr switch ``UPCAST`` converts every loaded tile to fp32
right after the load; the launcher sets it from the kernel object actually built (see
``_triton_env.kernel_is_interpreted``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from oracle.rules import LOG2E

from ._triton_env import ensure_interpreter_on_cpu, kernel_is_interpreted

ensure_interpreter_on_cpu()  # before the kernels below are decorated

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

__all__ = [
    "KERNELS",
    "HybridOptions",
    "HybridTensors",
    "HybridWorkspace",
    "alloc_workspace",
    "ctas_per_sm",
    "default_num_splits",
    "hybrid_paged_attention",
    "padded_rows",
    "plan_num_splits",
    "split_starts",
    "planned_launches",
    "row_block_size",
    "run_hybrid",
    "LAUNCH_SINGLE",
    "LAUNCH_SPLIT",
    "LAUNCH_MERGE",
    "SUPPORTED_HEAD_DIMS",
    "MAX_SPLITS",
]

LAUNCH_SINGLE = "hybrid_paged_single"
LAUNCH_SPLIT = "hybrid_paged_split"
LAUNCH_MERGE = "hybrid_paged_merge_splits"

SUPPORTED_HEAD_DIMS = (16, 32, 64, 128, 256)
MAX_SPLITS = 32  # upper bound of the default heuristic (a caller may pass more explicitly)
MERGE_BLOCK_R = 16  # query rows per program of the split-merge kernel
MIN_TILES_PER_SPLIT = 8  # heuristic: a split should stream at least this many context tiles
_DEFAULT_NUM_SMS = 132  # the SM count the split heuristic was tuned on; used when no CUDA device can be queried

_ACT_DTYPES = (torch.bfloat16, torch.float16)
_FP8 = getattr(torch, "float8_e4m3fn", None)


# ----------------------------------------------------------------------------------------------------
# Device helpers
# ----------------------------------------------------------------------------------------------------


@triton.jit
def _load_q_rows(q_ptr, b, kvh, rows, G, R, stride_qb, stride_qk, stride_qh, stride_qd,
                 D: tl.constexpr, UPCAST: tl.constexpr):
    """Query rows ``rows`` (packed ``r = i * G + g``) of KV head ``kvh``: [BLOCK_R, D], zeros if padded."""
    d = tl.arange(0, D)
    row_ok = rows < R
    qi = rows // G
    qh = kvh * G + rows % G
    ptrs = (q_ptr + b.to(tl.int64) * stride_qb + qi[:, None].to(tl.int64) * stride_qk
            + qh[:, None].to(tl.int64) * stride_qh + d[None, :] * stride_qd)
    q = tl.load(ptrs, mask=row_ok[:, None], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    return q


@triton.jit
def _online_step(acc, m_i, l_i, s, v, UPCAST: tl.constexpr):
    """One online-softmax update with a score tile ``s`` [BLOCK_R, N] (log2 units, -inf = masked)."""
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    # A row whose max is still -inf has seen no key: use 0 as the reference so that
    # exp2(-inf - 0) = 0 instead of exp2(-inf - -inf) = NaN.
    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.math.exp2(m_i - m_ref)
    p = tl.math.exp2(s - m_ref[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None]
    if UPCAST:
        acc = tl.dot(p, v, acc)
    else:
        acc = tl.dot(p.to(v.dtype), v, acc)
    return acc, m_new, l_i


@triton.jit
def _context_range(acc, m_i, l_i, q, k_pool, v_pool, pt_row, stride_ptp, kvh, start, end,
                   stride_kp, stride_ks, stride_kh, stride_kd,
                   stride_vp, stride_vs, stride_vh, stride_vd,
                   qk_scale2,
                   PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr,
                   UPCAST: tl.constexpr):
    """Fold context tokens ``start .. end-1`` (gathered per token through the page table row)."""
    d = tl.arange(0, D)
    tok = tl.arange(0, BLOCK_N)
    for n0 in range(start, end, BLOCK_N):
        idx = n0 + tok
        valid = idx < end
        page = tl.load(pt_row + (idx // PAGE_SIZE) * stride_ptp, mask=valid, other=0).to(tl.int64)
        slot = (idx % PAGE_SIZE).to(tl.int64)
        k_off = page * stride_kp + slot * stride_ks + kvh * stride_kh
        v_off = page * stride_vp + slot * stride_vs + kvh * stride_vh
        k = tl.load(k_pool + k_off[:, None] + d[None, :] * stride_kd, mask=valid[:, None], other=0.0)
        v = tl.load(v_pool + v_off[:, None] + d[None, :] * stride_vd, mask=valid[:, None], other=0.0)
        if UPCAST:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        else:  # fp8 -> q dtype (exact for e4m3); a no-op for a bf16/fp16 pool
            k = k.to(q.dtype)
            v = v.to(q.dtype)
        s = tl.dot(q, tl.trans(k)) * qk_scale2
        s = tl.where(valid[None, :], s, float("-inf"))
        acc, m_i, l_i = _online_step(acc, m_i, l_i, s, v, UPCAST)
    return acc, m_i, l_i


@triton.jit
def _block_keys(acc, m_i, l_i, q, kb_ptr, vb_ptr, b, kvh, K,
                stride_kbb, stride_kbk, stride_kbh, stride_kbd,
                stride_vbb, stride_vbk, stride_vbh, stride_vbd,
                qk_scale2,
                KB_PAD: tl.constexpr, D: tl.constexpr, UPCAST: tl.constexpr):
    """Fold the K dense block keys of request ``b`` into the softmax."""
    d = tl.arange(0, D)
    j = tl.arange(0, KB_PAD)
    jv = j < K
    kb = tl.load(kb_ptr + b.to(tl.int64) * stride_kbb + j[:, None] * stride_kbk + kvh * stride_kbh
                 + d[None, :] * stride_kbd, mask=jv[:, None], other=0.0)
    vb = tl.load(vb_ptr + b.to(tl.int64) * stride_vbb + j[:, None] * stride_vbk + kvh * stride_vbh
                 + d[None, :] * stride_vbd, mask=jv[:, None], other=0.0)
    if UPCAST:
        kb = kb.to(tl.float32)
        vb = vb.to(tl.float32)
    s = tl.dot(q, tl.trans(kb)) * qk_scale2
    s = tl.where(jv[None, :], s, float("-inf"))
    return _online_step(acc, m_i, l_i, s, vb, UPCAST)


@triton.jit
def _store_rows(out_ptr, lse_ptr, acc, m_i, l_i, b, kvh, rows, G, R,
                stride_ob, stride_ok, stride_oh, stride_od,
                stride_lb, stride_lk, stride_lh,
                D: tl.constexpr):
    """Normalize and store O (out dtype) and the natural-log LSE (fp32) of the real rows only."""
    d = tl.arange(0, D)
    row_ok = rows < R
    qi = rows // G
    qh = kvh * G + rows % G
    l_pos = l_i > 0.0
    inv_l = tl.where(l_pos, 1.0 / tl.where(l_pos, l_i, 1.0), 0.0)
    o = acc * inv_l[:, None]
    lse = tl.where(l_pos, (m_i + tl.math.log2(tl.where(l_pos, l_i, 1.0))) * 0.6931471805599453,
                   float("-inf"))
    o_ptrs = (out_ptr + b.to(tl.int64) * stride_ob + qi[:, None].to(tl.int64) * stride_ok
              + qh[:, None].to(tl.int64) * stride_oh + d[None, :] * stride_od)
    tl.store(o_ptrs, o.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])
    l_ptrs = lse_ptr + b.to(tl.int64) * stride_lb + qi.to(tl.int64) * stride_lk + qh.to(tl.int64) * stride_lh
    tl.store(l_ptrs, lse, mask=row_ok)


@triton.jit
def _context_length(ctx_len_ptr, b, max_ctx):
    """L_b read on the device, clamped to [0, page-table capacity] so no page id past the row is read."""
    L = tl.load(ctx_len_ptr + b).to(tl.int32)
    return tl.minimum(tl.maximum(L, 0), max_ctx)


# ----------------------------------------------------------------------------------------------------
# Kernels
# ----------------------------------------------------------------------------------------------------


_WS = ["stride_wab", "stride_wah", "stride_was", "stride_war", "stride_wmb", "stride_wmh", "stride_wms", "stride_wmr"]
DO_NOT_SPECIALIZE = {  # per kernel: its arguments that take run-time values (tests/lowerings/test_specialization.py)
    "_hybrid_single_kernel": ["max_ctx", "stride_ptb", "stride_ptp"],
    "_hybrid_split_kernel": ["max_ctx", "num_splits", "stride_ptb", "stride_ptp", *_WS],
    "_hybrid_merge_splits_kernel": ["num_splits", *_WS],
}


@triton.jit(do_not_specialize=DO_NOT_SPECIALIZE["_hybrid_single_kernel"])
def _hybrid_single_kernel(
    q_ptr, k_pool, v_pool, pt_ptr, ctx_len_ptr, kb_ptr, vb_ptr, out_ptr, lse_ptr,
    Hkv, G, R, K, n_row_blocks, max_ctx,
    qk_scale2_ctx, qk_scale2_blk, v_scale,
    stride_qb, stride_qk, stride_qh, stride_qd,
    stride_kp, stride_ks, stride_kh, stride_kd,
    stride_vp, stride_vs, stride_vh, stride_vd,
    stride_ptb, stride_ptp,
    stride_kbb, stride_kbk, stride_kbh, stride_kbd,
    stride_vbb, stride_vbk, stride_vbh, stride_vbd,
    stride_ob, stride_ok, stride_oh, stride_od,
    stride_lb, stride_lk, stride_lh,
    PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr, KB_PAD: tl.constexpr,
    D: tl.constexpr, UPCAST: tl.constexpr,
):
    pid = tl.program_id(0)
    rb = pid % n_row_blocks
    bh = pid // n_row_blocks
    kvh = bh % Hkv
    b = bh // Hkv
    rows = rb * BLOCK_R + tl.arange(0, BLOCK_R)

    L = _context_length(ctx_len_ptr, b, max_ctx)
    q = _load_q_rows(q_ptr, b, kvh, rows, G, R, stride_qb, stride_qk, stride_qh, stride_qd, D, UPCAST)

    acc = tl.zeros([BLOCK_R, D], dtype=tl.float32)
    m_i = tl.full([BLOCK_R], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_R], dtype=tl.float32)
    pt_row = pt_ptr + b.to(tl.int64) * stride_ptb
    acc, m_i, l_i = _context_range(acc, m_i, l_i, q, k_pool, v_pool, pt_row, stride_ptp, kvh, 0, L,
                                   stride_kp, stride_ks, stride_kh, stride_kd,
                                   stride_vp, stride_vs, stride_vh, stride_vd,
                                   qk_scale2_ctx, PAGE_SIZE, BLOCK_N, D, UPCAST)
    acc = acc * v_scale  # fp8 value dequant of the context part (linear: applied once)
    acc, m_i, l_i = _block_keys(acc, m_i, l_i, q, kb_ptr, vb_ptr, b, kvh, K,
                                stride_kbb, stride_kbk, stride_kbh, stride_kbd,
                                stride_vbb, stride_vbk, stride_vbh, stride_vbd,
                                qk_scale2_blk, KB_PAD, D, UPCAST)
    _store_rows(out_ptr, lse_ptr, acc, m_i, l_i, b, kvh, rows, G, R,
                stride_ob, stride_ok, stride_oh, stride_od, stride_lb, stride_lk, stride_lh, D)


@triton.jit(do_not_specialize=DO_NOT_SPECIALIZE["_hybrid_split_kernel"])
def _hybrid_split_kernel(
    q_ptr, k_pool, v_pool, pt_ptr, ctx_len_ptr, ws_acc, ws_m, ws_l,
    Hkv, G, R, n_row_blocks, max_ctx, num_splits,
    qk_scale2_ctx, v_scale,
    stride_qb, stride_qk, stride_qh, stride_qd,
    stride_kp, stride_ks, stride_kh, stride_kd,
    stride_vp, stride_vs, stride_vh, stride_vd,
    stride_ptb, stride_ptp,
    stride_wab, stride_wah, stride_was, stride_war, stride_wad,
    stride_wmb, stride_wmh, stride_wms, stride_wmr,
    PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr,
    D: tl.constexpr, UPCAST: tl.constexpr,
):
    pid = tl.program_id(0)
    split = tl.program_id(1)
    rb = pid % n_row_blocks
    bh = pid // n_row_blocks
    kvh = bh % Hkv
    b = bh // Hkv
    rows = rb * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = rows < R

    # Split ranges come from the device-resident length: whole tiles, contiguous, possibly empty.
    L = _context_length(ctx_len_ptr, b, max_ctx)
    n_tiles = tl.cdiv(L, BLOCK_N)
    tiles_per_split = tl.cdiv(n_tiles, num_splits)
    start = split * tiles_per_split * BLOCK_N
    end = tl.minimum(start + tiles_per_split * BLOCK_N, L)

    acc = tl.zeros([BLOCK_R, D], dtype=tl.float32)
    m_i = tl.full([BLOCK_R], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_R], dtype=tl.float32)
    if start < end:
        q = _load_q_rows(q_ptr, b, kvh, rows, G, R, stride_qb, stride_qk, stride_qh, stride_qd, D, UPCAST)
        pt_row = pt_ptr + b.to(tl.int64) * stride_ptb
        acc, m_i, l_i = _context_range(acc, m_i, l_i, q, k_pool, v_pool, pt_row, stride_ptp, kvh,
                                       start, end,
                                       stride_kp, stride_ks, stride_kh, stride_kd,
                                       stride_vp, stride_vs, stride_vh, stride_vd,
                                       qk_scale2_ctx, PAGE_SIZE, BLOCK_N, D, UPCAST)
        acc = acc * v_scale

    d = tl.arange(0, D)
    base_a = ws_acc + b.to(tl.int64) * stride_wab + kvh * stride_wah + split.to(tl.int64) * stride_was
    tl.store(base_a + rows[:, None] * stride_war + d[None, :] * stride_wad, acc, mask=row_ok[:, None])
    off_m = b.to(tl.int64) * stride_wmb + kvh * stride_wmh + split.to(tl.int64) * stride_wms + rows * stride_wmr
    tl.store(ws_m + off_m, m_i, mask=row_ok)
    tl.store(ws_l + off_m, l_i, mask=row_ok)


@triton.jit(do_not_specialize=DO_NOT_SPECIALIZE["_hybrid_merge_splits_kernel"])
def _hybrid_merge_splits_kernel(
    q_ptr, kb_ptr, vb_ptr, ws_acc, ws_m, ws_l, out_ptr, lse_ptr,
    Hkv, G, R, K, n_row_blocks, num_splits,
    qk_scale2_blk,
    stride_qb, stride_qk, stride_qh, stride_qd,
    stride_kbb, stride_kbk, stride_kbh, stride_kbd,
    stride_vbb, stride_vbk, stride_vbh, stride_vbd,
    stride_wab, stride_wah, stride_was, stride_war, stride_wad,
    stride_wmb, stride_wmh, stride_wms, stride_wmr,
    stride_ob, stride_ok, stride_oh, stride_od,
    stride_lb, stride_lk, stride_lh,
    BLOCK_R: tl.constexpr, KB_PAD: tl.constexpr, D: tl.constexpr, UPCAST: tl.constexpr,
):
    pid = tl.program_id(0)
    rb = pid % n_row_blocks
    bh = pid // n_row_blocks
    kvh = bh % Hkv
    b = bh // Hkv
    rows = rb * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = rows < R
    d = tl.arange(0, D)

    # The dense block part first: it is never empty, so the running max is finite from here on.
    q = _load_q_rows(q_ptr, b, kvh, rows, G, R, stride_qb, stride_qk, stride_qh, stride_qd, D, UPCAST)
    acc = tl.zeros([BLOCK_R, D], dtype=tl.float32)
    m_i = tl.full([BLOCK_R], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_R], dtype=tl.float32)
    acc, m_i, l_i = _block_keys(acc, m_i, l_i, q, kb_ptr, vb_ptr, b, kvh, K,
                                stride_kbb, stride_kbk, stride_kbh, stride_kbd,
                                stride_vbb, stride_vbk, stride_vbh, stride_vbd,
                                qk_scale2_blk, KB_PAD, D, UPCAST)

    base_a = ws_acc + b.to(tl.int64) * stride_wab + kvh * stride_wah
    base_m = b.to(tl.int64) * stride_wmb + kvh * stride_wmh + rows * stride_wmr
    for s in range(0, num_splits):
        off_m = base_m + s * stride_wms
        m_s = tl.load(ws_m + off_m, mask=row_ok, other=float("-inf"))
        l_s = tl.load(ws_l + off_m, mask=row_ok, other=0.0)
        acc_s = tl.load(base_a + s * stride_was + rows[:, None] * stride_war + d[None, :] * stride_wad,
                        mask=row_ok[:, None], other=0.0)
        m_new = tl.maximum(m_i, m_s)
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        a_run = tl.math.exp2(m_i - m_ref)
        a_s = tl.math.exp2(m_s - m_ref)  # 0 for an empty split (m_s = -inf)
        acc = acc * a_run[:, None] + acc_s * a_s[:, None]
        l_i = l_i * a_run + l_s * a_s
        m_i = m_new

    _store_rows(out_ptr, lse_ptr, acc, m_i, l_i, b, kvh, rows, G, R,
                stride_ob, stride_ok, stride_oh, stride_od, stride_lb, stride_lk, stride_lh, D)


KERNELS = {
    LAUNCH_SINGLE: _hybrid_single_kernel,
    LAUNCH_SPLIT: _hybrid_split_kernel,
    LAUNCH_MERGE: _hybrid_merge_splits_kernel,
}


# ----------------------------------------------------------------------------------------------------
# Host side: sizes, heuristic, workspace
# ----------------------------------------------------------------------------------------------------


def _is_pow2(n: int) -> bool:
    return n > 0 and (n & (n - 1)) == 0


def _next_pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def padded_rows(K: int, G: int) -> int:
    """``R_PAD = max(16, next_pow2(K * G))``: the query rows of one KV head, padded for ``tl.dot``."""
    return max(16, _next_pow2(K * G))


def row_block_size(r_pad: int, head_dim: int) -> int:
    """Rows one program holds (``BLOCK_R``): all ``R_PAD`` rows up to 128 (64 for ``D > 128``)."""
    return min(r_pad, 128 if head_dim <= 128 else 64)


def _block_n(block_r: int, head_dim: int) -> int:
    # 64-token tiles measured best for both paths (132 SMs, bf16, D = 128; R_PAD 16..128).
    return 64


def ctas_per_sm(block_r: int) -> int:
    """Programs of the context kernels that the split heuristic aims to run per SM at once."""
    return 2 if block_r <= 64 else 1  # 4-warp programs pair up on an SM; 8-warp ones (BLOCK_R 128) do not


def _num_sms(device: torch.device | None) -> int:
    if device is not None and device.type == "cuda" and torch.cuda.is_available():
        return _sm_count_cached(device.index if device.index is not None else torch.cuda.current_device())
    return _DEFAULT_NUM_SMS


_SM_CACHE: dict[int, int] = {}


def _sm_count_cached(index: int) -> int:
    if index not in _SM_CACHE:
        _SM_CACHE[index] = int(torch.cuda.get_device_properties(index).multi_processor_count)
    return _SM_CACHE[index]


def default_num_splits(batch: int, num_kv_heads: int, max_ctx_hint: int, *, num_sms: int | None = None,
                       row_blocks: int = 1, block_n: int = 64, ctas_per_sm: int = 2,
                       device: torch.device | None = None) -> int:
    """Split count for the context, from host-side sizes only (never reads device lengths).

    ``programs = batch * num_kv_heads * row_blocks`` programs exist per split, and the GPU runs about
    ``target = ctas_per_sm * num_sms`` of them at once. The answer is
    ``min(target // programs, MAX_SPLITS, ceil(max_ctx_hint / (block_n * MIN_TILES_PER_SPLIT)))``,
    and 1 (single pass, no workspace, one launch) whenever that is below 2, i.e. when the batch alone
    fills the GPU or the capacity is too short to be worth splitting.

    Measured on a 132-SM GPU (L = 8192, D = 128, bf16; CUDA graphs), the best split counts were
    16 / 16 / 8 / 4 / 2 / 1-2 for ``programs`` = 4 / 16 / 32 / 64 / 128 / 256 with 4-warp programs
    (``ctas_per_sm = 2``), and 16 / 16 / 4 / 1-2 for 1 / 8 / 32 / 128 programs of 8 warps
    (``ctas_per_sm = 1``): this rule picks those.

    ``max_ctx_hint`` is a capacity, not a length: use ``page_table.shape[1] * page_size`` (what the
    launcher does) or the engine's maximum sequence length. ``num_sms`` defaults to the current CUDA
    device's SM count (132 when there is no CUDA device). Floor division keeps the grid inside one
    "wave" (a ceil would add a nearly empty second wave).
    """
    if batch < 1 or num_kv_heads < 1:
        raise ValueError(f"batch and num_kv_heads must be >= 1, got {batch} and {num_kv_heads}")
    sms = int(num_sms) if num_sms is not None else _num_sms(device if device is not None else (
        torch.device("cuda") if torch.cuda.is_available() else None))
    programs = batch * num_kv_heads * max(1, row_blocks)
    splits = (max(1, ctas_per_sm) * sms) // programs
    by_capacity = max(1, -(-int(max_ctx_hint) // (block_n * MIN_TILES_PER_SPLIT)))
    splits = min(splits, MAX_SPLITS, by_capacity)
    return splits if splits >= 2 else 1


def plan_num_splits(batch: int, block_size: int, num_q_heads: int, num_kv_heads: int, head_dim: int,
                    max_ctx: int, *, block_n: int | None = None, device: torch.device | None = None,
                    workspace_max_splits: int | None = None) -> int:
    """The split count :func:`hybrid_paged_attention` uses when ``num_splits`` is None.

    Host shapes only: ``block_size`` = K, ``max_ctx`` = ``page_table.shape[1] * page_size`` (the
    capacity), ``workspace_max_splits`` = ``workspace.max_splits`` when a workspace is passed. The
    launcher calls this very function, so a counter's expectation built from it matches the launch.
    """
    r_pad = padded_rows(block_size, num_q_heads // num_kv_heads)
    block_r = row_block_size(r_pad, head_dim)
    bn = _block_n(block_r, head_dim) if block_n is None else int(block_n)
    splits = default_num_splits(batch, num_kv_heads, max_ctx, row_blocks=r_pad // block_r, block_n=bn,
                                ctas_per_sm=ctas_per_sm(block_r), device=device)
    if workspace_max_splits is not None:
        splits = max(1, min(splits, int(workspace_max_splits)))
    return splits


def split_starts(ctx_len: int, num_splits: int, block_size: int, group: int, head_dim: int) -> list[int]:
    """The first context position of each split after the first that holds keys, as ``_hybrid_split_kernel``
    cuts a request's ``ctx_len`` keys: whole ``block_n``-key tiles, ``cdiv(tiles, num_splits)`` per split."""
    bn = _block_n(row_block_size(padded_rows(block_size, group), head_dim), head_dim)
    tiles = -(-ctx_len // bn)
    per = -(-tiles // max(1, num_splits)) * bn  # keys per split
    return [s * per for s in range(1, num_splits) if per and s * per < ctx_len]


def planned_launches(batch: int, block_size: int, num_q_heads: int, num_kv_heads: int, head_dim: int,
                     max_ctx: int, *, num_splits: int | None = None, block_n: int | None = None,
                     device: torch.device | None = None, workspace_max_splits: int | None = None) -> list[str]:
    """Kernel names :func:`hybrid_paged_attention` will append to ``launches`` for these host shapes."""
    if num_splits is None:
        num_splits = plan_num_splits(batch, block_size, num_q_heads, num_kv_heads, head_dim, max_ctx,
                                     block_n=block_n, device=device, workspace_max_splits=workspace_max_splits)
    return [LAUNCH_SINGLE] if num_splits == 1 else [LAUNCH_SPLIT, LAUNCH_MERGE]


@dataclass
class HybridWorkspace:
    """Partial-state buffers of the split-KV path (fp32, fixed addresses, reusable across calls).

    Shapes (``R_PAD = padded_rows(K, G)``):

    - ``acc``: ``[max_batch, num_kv_heads, max_splits, R_PAD, D]`` unnormalized partial output
      ``sum_t exp2(s_t - m) * v_t`` of the split's context tokens (already multiplied by ``v_scale``);
    - ``m``:   ``[max_batch, num_kv_heads, max_splits, R_PAD]`` running max of the scores, log2 units
      (``-inf`` for an empty split);
    - ``l``:   ``[max_batch, num_kv_heads, max_splits, R_PAD]`` running sum ``sum exp2(s - m)``.

    A call with batch ``B <= max_batch``, ``num_splits <= max_splits``, the same ``num_kv_heads`` and
    ``D`` and ``R_PAD <= r_pad`` uses the leading part of the buffers (indexed through their strides),
    so one workspace serves every batch size up to its capacity with stable addresses (CUDA graphs).
    Only rows ``r < R = K * G`` are written and read. The buffers never need initialising: every used
    element is written by the split kernel (empty splits too) before the merge kernel reads it.
    Size: ``max_batch * num_kv_heads * max_splits * R_PAD * (D + 2) * 4`` bytes.
    """

    acc: torch.Tensor
    m: torch.Tensor
    l: torch.Tensor  # noqa: E741  (named as in the flash-decoding literature)

    @classmethod
    def allocate(cls, max_batch: int, num_kv_heads: int, max_splits: int, r_pad: int, head_dim: int,
                 device: torch.device | str) -> "HybridWorkspace":
        for name, v in (("max_batch", max_batch), ("num_kv_heads", num_kv_heads),
                        ("max_splits", max_splits), ("r_pad", r_pad), ("head_dim", head_dim)):
            if int(v) < 1:
                raise ValueError(f"{name} must be >= 1, got {v}")
        shape = (int(max_batch), int(num_kv_heads), int(max_splits), int(r_pad))
        return cls(
            acc=torch.empty(shape + (int(head_dim),), dtype=torch.float32, device=device),
            m=torch.empty(shape, dtype=torch.float32, device=device),
            l=torch.empty(shape, dtype=torch.float32, device=device),
        )

    @property
    def max_batch(self) -> int:
        return self.acc.shape[0]

    @property
    def num_kv_heads(self) -> int:
        return self.acc.shape[1]

    @property
    def max_splits(self) -> int:
        return self.acc.shape[2]

    @property
    def r_pad(self) -> int:
        return self.acc.shape[3]

    @property
    def head_dim(self) -> int:
        return self.acc.shape[4]

    def check(self, batch: int, num_kv_heads: int, num_splits: int, r_pad: int, head_dim: int,
              device: torch.device) -> None:
        """Raise ValueError unless this workspace can hold the partials of that problem."""
        if self.acc.dim() != 5 or self.m.dim() != 4 or self.l.dim() != 4:
            raise ValueError("workspace: acc must be 5-D and m, l 4-D (see HybridWorkspace)")
        if self.m.shape != self.acc.shape[:4] or self.l.shape != self.acc.shape[:4]:
            raise ValueError(f"workspace: m {tuple(self.m.shape)} and l {tuple(self.l.shape)} must equal "
                             f"acc.shape[:4] {tuple(self.acc.shape[:4])}")
        for name, t in (("acc", self.acc), ("m", self.m), ("l", self.l)):
            if t.dtype != torch.float32:
                raise ValueError(f"workspace.{name} must be float32, got {t.dtype}")
            if t.device != device:
                raise ValueError(f"workspace.{name} is on {t.device}, expected {device}")
        problems = []
        if batch > self.max_batch:
            problems.append(f"batch {batch} > max_batch {self.max_batch}")
        if num_kv_heads != self.num_kv_heads:
            problems.append(f"num_kv_heads {num_kv_heads} != {self.num_kv_heads}")
        if num_splits > self.max_splits:
            problems.append(f"num_splits {num_splits} > max_splits {self.max_splits}")
        if r_pad > self.r_pad:
            problems.append(f"R_PAD {r_pad} > r_pad {self.r_pad}")
        if head_dim != self.head_dim:
            problems.append(f"head_dim {head_dim} != {self.head_dim}")
        if problems:
            raise ValueError("workspace too small or mismatched: " + "; ".join(problems))


def alloc_workspace(max_batch: int, Hkv: int, max_splits: int, R_PAD: int, D: int,
                    device: torch.device | str) -> HybridWorkspace:
    """Allocate a :class:`HybridWorkspace` (same as ``HybridWorkspace.allocate``)."""
    return HybridWorkspace.allocate(max_batch, Hkv, max_splits, R_PAD, D, device)


# ----------------------------------------------------------------------------------------------------
# Launcher
# ----------------------------------------------------------------------------------------------------


def _check_tensor(name: str, t, dims: int, device: torch.device | None = None) -> None:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != dims:
        raise ValueError(f"{name} must be {dims}-D, got shape {tuple(t.shape)}")
    if device is not None and t.device != device:
        raise ValueError(f"{name} is on {t.device}, expected {device} (the device of q)")


def _check_scalar(name: str, v) -> float:
    if isinstance(v, torch.Tensor):
        raise ValueError(f"{name} must be a Python float (a host scalar), got a tensor")
    try:
        f = float(v)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a float, got {v!r}") from None
    if not math.isfinite(f):
        raise ValueError(f"{name} must be finite, got {f}")
    return f


@dataclass(frozen=True)
class HybridTensors:
    """The operands of one call of :func:`hybrid_paged_attention` (shapes and dtypes there)."""

    q: torch.Tensor
    k_pool: torch.Tensor
    v_pool: torch.Tensor
    page_table: torch.Tensor
    ctx_len: torch.Tensor
    k_block: torch.Tensor
    v_block: torch.Tensor


@dataclass(frozen=True)
class HybridOptions:
    """The keyword options of :func:`hybrid_paged_attention` (meanings there); ``scale`` has no default."""

    scale: float
    k_scale: float = 1.0
    v_scale: float = 1.0
    num_splits: int | None = None
    out: torch.Tensor | None = None
    lse_out: torch.Tensor | None = None
    workspace: HybridWorkspace | None = None
    launches: list | None = None
    block_n: int | None = None
    num_warps: int | None = None
    num_stages: int | None = None


def hybrid_paged_attention(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, page_table: torch.Tensor,
                           ctx_len: torch.Tensor, k_block: torch.Tensor, v_block: torch.Tensor,
                           **options) -> tuple[torch.Tensor, torch.Tensor]:
    """Non-causal attention of a draft block over its paged context plus its own dense keys.

    Args (``options`` are keyword-only, ``scale`` required: the fields of :class:`HybridOptions`):
        q: ``[B, K, Hq, D]`` bf16 or fp16 queries (any strides).
        k_pool, v_pool: NHD paged pools ``[num_pages, page_size, Hkv, D]``, dtype of ``q`` or
            ``torch.float8_e4m3fn`` (both the same); dequantized value = stored * ``k_scale`` /
            ``v_scale``. ``page_size`` must be a power of two; ``D`` one of ``SUPPORTED_HEAD_DIMS``.
        page_table: ``[B, max_pages]`` int32 or int64 page ids (any strides, e.g. a row slice of a
            larger table). Position ``t`` of request ``b`` is slot ``t % page_size`` of page
            ``page_table[b, t // page_size]``; entries past ``ceil(L_b / page_size)`` are never read.
        ctx_len: ``[B]`` int32 (or int64) context lengths ``L_b`` on the device of ``q``; read inside
            the kernels only (no host sync: CUDA-graph safe). Values are clamped on the device to
            ``[0, max_pages * page_size]`` (a length beyond the table's capacity is a caller bug that
            would otherwise read out of bounds).
        k_block, v_block: ``[B, K, Hkv, D]`` dense block keys/values (positions ``L_b .. L_b+K-1``),
            dtype of ``q``; never written anywhere.
        scale: softmax scale on ``<q, k>`` (e.g. ``D ** -0.5``).
        k_scale, v_scale: dequantization scales of the pool (applied for any pool dtype; 1.0 default).
        num_splits: context splits per (request, KV head). ``None``: :func:`default_num_splits`
            with the capacity hint ``max_pages * page_size``. ``1``: single pass. ``> 1``: split-KV
            plus a merge kernel. A runtime kernel argument: no value compiles a new kernel.
        out: optional ``[B, K, Hq, D]`` output buffer, dtype of ``q``; only its real rows are written.
        lse_out: optional ``[B, K, Hq]`` float32 buffer for the LSE.
        workspace: optional :class:`HybridWorkspace` for the split path (stable addresses); when it
            is given and ``num_splits`` is None the split count is capped at ``workspace.max_splits``.
            Without it the split path allocates a fresh one per call.
        launches: optional list; the names of the kernels launched are appended in order
            (``"hybrid_paged_single"``, or ``"hybrid_paged_split"`` then ``"hybrid_paged_merge_splits"``).
        block_n: context tile size override (power of two >= 16); default 64.
        num_warps, num_stages: launch-config overrides for the context kernels (tuning only).

    Returns:
        ``(O, LSE)``: ``O`` ``[B, K, Hq, D]`` in ``q``'s dtype and ``LSE`` ``[B, K, Hq]`` float32 in
        NATURAL log units (``ln sum_t exp(scale * <q, k_t>)``).

    Raises:
        ValueError: on any shape, dtype, device or size problem, before anything is launched.
        TypeError: on an unknown option or a missing ``scale``.
    """
    try:
        opts = HybridOptions(**options)
    except TypeError as err:
        raise TypeError(f"hybrid_paged_attention(): {err}") from None
    return run_hybrid(HybridTensors(q, k_pool, v_pool, page_table, ctx_len, k_block, v_block), opts)


@dataclass(frozen=True)
class _Shape:
    """The sizes of a call, read off its validated operands."""

    B: int
    K: int
    Hq: int
    Hkv: int
    D: int
    page_size: int
    max_pages: int
    device: torch.device
    dtype: torch.dtype  # q's

    @property
    def G(self) -> int:
        return self.Hq // self.Hkv


@dataclass(frozen=True)
class _Plan:
    """How a call launches: tile sizes, the split count, the interpreter's upcast, the scales in log2 units."""

    r_pad: int
    block_r: int
    block_n: int
    kb_pad: int
    max_ctx: int
    num_splits: int
    upcast: bool
    num_warps: int
    extra: dict
    qk2_ctx: float
    qk2_blk: float
    v_scale: float


def run_hybrid(t: HybridTensors, o: HybridOptions) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`hybrid_paged_attention` of bundled operands and options: everything validated before any launch,
    then the single pass or the split-KV pass and its merge."""
    shape = _checked_operands(t)
    plan = _planned(shape, o)
    B, K, Hq, D = shape.B, shape.K, shape.Hq, shape.D
    out = o.out if o.out is not None else torch.empty((B, K, Hq, D), dtype=shape.dtype, device=shape.device)
    lse_out = o.lse_out if o.lse_out is not None else torch.empty((B, K, Hq), dtype=torch.float32, device=shape.device)
    if plan.num_splits == 1:
        _launch_single(t, out, lse_out, shape, plan)
        if o.launches is not None:
            o.launches.append(LAUNCH_SINGLE)
        return out, lse_out
    ws = o.workspace
    if ws is None:
        ws = HybridWorkspace.allocate(B, shape.Hkv, plan.num_splits, plan.r_pad, D, shape.device)
    if ws.l.stride() != ws.m.stride():
        raise ValueError("workspace.l must have the same strides as workspace.m")
    _launch_split(t, ws, shape, plan)
    if o.launches is not None:
        o.launches.append(LAUNCH_SPLIT)
    _launch_merge(t, ws, out, lse_out, shape, plan)
    if o.launches is not None:
        o.launches.append(LAUNCH_MERGE)
    return out, lse_out


def _checked_operands(t: HybridTensors) -> _Shape:
    """The sizes of `t`, each tensor checked (shape, dtype, device); ValueError naming the first problem."""
    q, k_pool, v_pool = t.q, t.k_pool, t.v_pool
    _check_tensor("q", q, 4)
    if q.dtype not in _ACT_DTYPES:
        raise ValueError(f"q must be bfloat16 or float16, got {q.dtype}")
    device = q.device
    B, K, Hq, D = (int(x) for x in q.shape)
    _check_tensor("k_pool", k_pool, 4, device)
    _check_tensor("v_pool", v_pool, 4, device)
    if k_pool.shape != v_pool.shape:
        raise ValueError(f"k_pool {tuple(k_pool.shape)} and v_pool {tuple(v_pool.shape)} must have one shape")
    num_pages, page_size, Hkv, Dk = (int(x) for x in k_pool.shape)
    pool_dtypes = (q.dtype,) + ((_FP8,) if _FP8 is not None else ())
    if k_pool.dtype not in pool_dtypes:
        raise ValueError(f"k_pool dtype must be {q.dtype} (q's) or float8_e4m3fn, got {k_pool.dtype}")
    if v_pool.dtype != k_pool.dtype:
        raise ValueError(f"v_pool dtype {v_pool.dtype} must equal k_pool dtype {k_pool.dtype}")
    if D not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"head dim D (q.shape[3]) must be a power of two in {SUPPORTED_HEAD_DIMS}, got {D}")
    if Dk != D:
        raise ValueError(f"k_pool head dim (k_pool.shape[3]) must equal q's D={D}, got {Dk}")
    if not _is_pow2(page_size):
        raise ValueError(f"page_size (k_pool.shape[1]) must be a power of two, got {page_size}")
    if num_pages < 1:
        raise ValueError("k_pool must hold at least one page (k_pool.shape[0] >= 1)")
    if Hkv < 1 or Hq % Hkv != 0:
        raise ValueError(f"Hq (q.shape[2]={Hq}) must be a multiple of Hkv (k_pool.shape[2]={Hkv})")
    if B < 1 or K < 1:
        raise ValueError(f"q must have B >= 1 and K >= 1, got shape {tuple(q.shape)}")
    shape = _Shape(B, K, Hq, Hkv, D, page_size, _checked_table(t, B, device), device, q.dtype)
    for name, blk in (("k_block", t.k_block), ("v_block", t.v_block)):
        _check_tensor(name, blk, 4, device)
        if tuple(blk.shape) != (B, K, Hkv, D):
            raise ValueError(f"{name} must have shape [B, K, Hkv, D]={[B, K, Hkv, D]}, got {list(blk.shape)}")
        if blk.dtype != q.dtype:
            raise ValueError(f"{name} dtype must equal q's {q.dtype}, got {blk.dtype}")
    return shape


def _checked_table(t: HybridTensors, B: int, device: torch.device) -> int:
    """The page table's width (its pages per request), the table and the context lengths checked."""
    page_table, ctx_len = t.page_table, t.ctx_len
    _check_tensor("page_table", page_table, 2, device)
    if page_table.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"page_table must be int32 or int64, got {page_table.dtype}")
    if int(page_table.shape[0]) != B:
        raise ValueError(f"page_table.shape[0] must be B={B}, got {page_table.shape[0]}")
    max_pages = int(page_table.shape[1])
    if max_pages < 1:
        raise ValueError("page_table must have at least one column")
    _check_tensor("ctx_len", ctx_len, 1, device)
    if ctx_len.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"ctx_len must be int32 (or int64), got {ctx_len.dtype}")
    if int(ctx_len.shape[0]) != B:
        raise ValueError(f"ctx_len must have shape [B]=[{B}], got {tuple(ctx_len.shape)}")
    return max_pages


def _checked_outputs(o: HybridOptions, shape: _Shape) -> None:
    """The caller's output buffers and split count checked."""
    B, K, Hq, D, device, dtype = shape.B, shape.K, shape.Hq, shape.D, shape.device, shape.dtype
    if o.out is not None:
        _check_tensor("out", o.out, 4, device)
        if tuple(o.out.shape) != (B, K, Hq, D) or o.out.dtype != dtype:
            raise ValueError(f"out must be {[B, K, Hq, D]} {dtype}, got {list(o.out.shape)} {o.out.dtype}")
    if o.lse_out is not None:
        _check_tensor("lse_out", o.lse_out, 3, device)
        if tuple(o.lse_out.shape) != (B, K, Hq) or o.lse_out.dtype != torch.float32:
            raise ValueError(f"lse_out must be {[B, K, Hq]} float32, got {list(o.lse_out.shape)} {o.lse_out.dtype}")
    if o.num_splits is not None:
        if isinstance(o.num_splits, bool) or not isinstance(o.num_splits, int) or o.num_splits < 1:
            raise ValueError(f"num_splits must be an int >= 1 or None, got {o.num_splits!r}")


def _planned(shape: _Shape, o: HybridOptions) -> _Plan:
    """The options checked (scales, buffers, split count, tile override, workspace) and the launch planned."""
    scale = _check_scalar("scale", o.scale)
    k_scale = _check_scalar("k_scale", o.k_scale)
    v_scale = _check_scalar("v_scale", o.v_scale)
    _checked_outputs(o, shape)
    interp = kernel_is_interpreted(_hybrid_single_kernel)
    if shape.device.type == "cpu" and not interp:
        raise ValueError("q is on the CPU but the Triton kernels were compiled for a GPU: set "
                         "TRITON_INTERPRET=1 before importing lowerings._hybrid_kernel, or pass CUDA tensors")
    B, K, Hq, Hkv, D = shape.B, shape.K, shape.Hq, shape.Hkv, shape.D
    r_pad = padded_rows(K, shape.G)
    block_r = row_block_size(r_pad, D)
    block_n = o.block_n
    if block_n is None:
        block_n = _block_n(block_r, D)
    elif not (_is_pow2(int(block_n)) and int(block_n) >= 16):
        raise ValueError(f"block_n must be a power of two >= 16, got {block_n}")
    block_n = int(block_n)
    max_ctx = shape.max_pages * shape.page_size
    if max_ctx >= 2**31:
        raise ValueError(f"page_table capacity max_pages * page_size = {max_ctx} must fit in int32")
    workspace = o.workspace
    if workspace is not None and not isinstance(workspace, HybridWorkspace):
        raise ValueError(f"workspace must be a HybridWorkspace, got {type(workspace).__name__}")
    num_splits = o.num_splits
    if num_splits is None:
        num_splits = plan_num_splits(B, K, Hq, Hkv, D, max_ctx, block_n=block_n, device=shape.device,
                                     workspace_max_splits=None if workspace is None else workspace.max_splits)
    if workspace is not None and num_splits > 1:
        workspace.check(B, Hkv, num_splits, r_pad, D, shape.device)
    return _Plan(r_pad=r_pad, block_r=block_r, block_n=block_n, kb_pad=max(16, _next_pow2(K)), max_ctx=max_ctx,
                 num_splits=num_splits, upcast=bool(interp),
                 num_warps=o.num_warps if o.num_warps is not None else (4 if block_r <= 64 else 8),
                 extra={} if o.num_stages is None else {"num_stages": int(o.num_stages)},
                 qk2_ctx=scale * k_scale * LOG2E, qk2_blk=scale * LOG2E, v_scale=v_scale)


def _strides(*tensors: torch.Tensor) -> tuple[int, ...]:
    """Every stride of each tensor, in order."""
    return tuple(s for t in tensors for s in t.stride())


def _launch_single(t: HybridTensors, out: torch.Tensor, lse_out: torch.Tensor, shape: _Shape, plan: _Plan) -> None:
    """The single pass: each program walks its request's context, then its block keys, and writes O and LSE."""
    n_row_blocks = plan.r_pad // plan.block_r
    _hybrid_single_kernel[(shape.B * shape.Hkv * n_row_blocks,)](
        t.q, t.k_pool, t.v_pool, t.page_table, t.ctx_len, t.k_block, t.v_block, out, lse_out,
        shape.Hkv, shape.G, shape.K * shape.G, shape.K, n_row_blocks, plan.max_ctx,
        plan.qk2_ctx, plan.qk2_blk, plan.v_scale,
        *_strides(t.q, t.k_pool, t.v_pool, t.page_table, t.k_block, t.v_block, out, lse_out),
        PAGE_SIZE=shape.page_size, BLOCK_N=plan.block_n, BLOCK_R=plan.block_r, KB_PAD=plan.kb_pad, D=shape.D,
        UPCAST=plan.upcast, num_warps=plan.num_warps, **plan.extra,
    )


def _launch_split(t: HybridTensors, ws: HybridWorkspace, shape: _Shape, plan: _Plan) -> None:
    """The split-KV pass: split ``s`` of each program's context into the workspace's partials."""
    n_row_blocks = plan.r_pad // plan.block_r
    _hybrid_split_kernel[(shape.B * shape.Hkv * n_row_blocks, plan.num_splits)](
        t.q, t.k_pool, t.v_pool, t.page_table, t.ctx_len, ws.acc, ws.m, ws.l,
        shape.Hkv, shape.G, shape.K * shape.G, n_row_blocks, plan.max_ctx, plan.num_splits,
        plan.qk2_ctx, plan.v_scale,
        *_strides(t.q, t.k_pool, t.v_pool, t.page_table, ws.acc, ws.m),
        PAGE_SIZE=shape.page_size, BLOCK_N=plan.block_n, BLOCK_R=plan.block_r, D=shape.D, UPCAST=plan.upcast,
        num_warps=plan.num_warps, **plan.extra,
    )


def _launch_merge(t: HybridTensors, ws: HybridWorkspace, out: torch.Tensor, lse_out: torch.Tensor, shape: _Shape,
                  plan: _Plan) -> None:
    """The merge: the block keys folded into every split's partials, O and LSE written. It reads
    ``num_splits`` partials per row: small row blocks (more programs) spread its serial loop over the splits
    across the GPU even at batch 1."""
    merge_block_r = min(plan.r_pad, MERGE_BLOCK_R)
    merge_row_blocks = plan.r_pad // merge_block_r
    _hybrid_merge_splits_kernel[(shape.B * shape.Hkv * merge_row_blocks,)](
        t.q, t.k_block, t.v_block, ws.acc, ws.m, ws.l, out, lse_out,
        shape.Hkv, shape.G, shape.K * shape.G, shape.K, merge_row_blocks, plan.num_splits,
        plan.qk2_blk,
        *_strides(t.q, t.k_block, t.v_block, ws.acc, ws.m, out, lse_out),
        BLOCK_R=merge_block_r, KB_PAD=plan.kb_pad, D=shape.D, UPCAST=plan.upcast,
        num_warps=4,
    )


# The handles lowerings.triton_hybrid counts compilations of (the kernels keep their names: the profiler lists them).
KERNELS = (_hybrid_single_kernel, _hybrid_split_kernel, _hybrid_merge_splits_kernel)
