"""Tile loads shared by the oracle's Triton kernels (`_fast_kernel.py`, `_stats_kernel.py`), inlined where called.

A paged pool is `[pages, PAGE, Hkv, D]` (NHD) or `[pages, Hkv, PAGE, D]` (HND); the slot and head strides say which.
The page table `PT [B, max_pages]` (int32) maps request `b`'s key position `t` to page `PT[b, t // PAGE]`, slot
`t % PAGE`. A dense block is `[B, K, Hkv, D]`. Offsets are int64 (a pool or batch past 2**31 elements).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def page_of(PT, b, t, t_ok, s_pt_b, s_pt_c, PAGE):
    """The pool page (int64) of request `b`'s key positions `t` (`[BLOCK]`); 0 where `t_ok` is false."""
    return tl.load(PT + b.to(tl.int64) * s_pt_b + (t // PAGE) * s_pt_c, mask=t_ok, other=0).to(tl.int64)


@triton.jit
def pool_rows(P, page, slot, h, d, s_page, s_slot, s_head, mask):
    """`[BLOCK, D_PAD]` of pool `P`, KV head `h`, at (`page`, `slot`) (`[BLOCK]` each), columns `d`, in the pool's
    dtype; 0 where `mask` (`[BLOCK, D_PAD]`) is false."""
    return tl.load(P + page[:, None] * s_page + slot[:, None] * s_slot + h * s_head + d[None, :],
                   mask=mask, other=0.0)


@triton.jit
def block_rows(P, b, j, h, d, s_b, s_k, s_h, mask):
    """`[K_PAD, D_PAD]` of dense block `P` (`[B, K, Hkv, D]`), request `b`, KV head `h`, block rows `j`, columns `d`,
    in the block's dtype; 0 where `mask` is false."""
    return tl.load(P + b.to(tl.int64) * s_b + j[:, None] * s_k + h * s_h + d[None, :], mask=mask, other=0.0)
