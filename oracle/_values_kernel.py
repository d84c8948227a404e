"""The Triton kernel of case format 3's device build (`oracle._device_values`): counter-based normals.

One program writes a tile of `BLOCK_T` positions x `BLOCK_E` row elements of one request's stream: the
standard normal of element `e` of position `t` is Philox (`tl.randn`) keyed by the stream's seed at counter
`t * row + e` (`row = H * D`), so a value depends on the seed, the position and the element only, never on
the tile, the grid or the other requests. It is then shaped by the request's affine regime `x = n * a[d] +
c[h, d]` (plus `s[h, d]` at the request's position `pos[b]`: an attention sink or peak; -1: none), scaled
(an fp8 pool stores `x`, already in stored units, clamped to +-448), and stored in the destination's dtype:
through the page table into a pool (NHD or HND, 64-bit offsets), or densely into `[B, rows, H, D]`.
"""

from __future__ import annotations

import triton
import triton.language as tl


# Values that vary between cases are run-time arguments: no recompile per page size, stride or head count (a
# specialization on `== 1` or divisibility by 16 would make one compile per class of each).
# The regime switches too: one compile per destination dtype and storage (as constexprs they made a process on
# a cold Triton cache spend tens of seconds compiling its warm-up's variants).
RUNTIME_ARGS = ["table_stride", "page_size", "rows", "stride_page", "stride_slot", "stride_head", "D", "HD",
                "AFFINE", "SINK", "CLAMP"]


@triton.jit(do_not_specialize=RUNTIME_ARGS)
def stream_kernel(dst, seeds, lens, a_ptr, c_ptr, s_ptr, pos_ptr, table, table_stride, page_size, rows,
                  stride_page, stride_slot, stride_head, D, HD, AFFINE, SINK, CLAMP,
                  PAGED: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr):
    """Grid `(cdiv(longest stream, BLOCK_T), B, cdiv(H * D, BLOCK_E))`; `lens [B]` int32 positions per request;
    `pos [B]` int32, read when `SINK`: the position that gets `s`."""
    b = tl.program_id(1)
    n_pos = tl.load(lens + b)
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    if tl.program_id(0) * BLOCK_T >= n_pos:
        return
    e = tl.program_id(2) * BLOCK_E + tl.arange(0, BLOCK_E)
    t_ok = t < n_pos
    e_ok = e < HD
    ok = t_ok[:, None] & e_ok[None, :]
    seed = tl.load(seeds + b)
    x = tl.randn(seed, t[:, None] * HD + e[None, :])
    h = e // D
    d = e - h * D
    if AFFINE != 0:
        a = tl.load(a_ptr + b * D + d, mask=e_ok, other=0.0)
        c = tl.load(c_ptr + b * HD + e, mask=e_ok, other=0.0)
        x = x * a[None, :] + c[None, :]
    if SINK != 0:
        s = tl.load(s_ptr + b * HD + e, mask=e_ok, other=0.0)
        x = x + tl.where(t[:, None] == tl.load(pos_ptr + b), s[None, :], 0.0)
    if CLAMP != 0:
        x = tl.minimum(tl.maximum(x, -448.0), 448.0)
    if PAGED:
        page = tl.load(table + b * table_stride + t // page_size, mask=t_ok, other=0).to(tl.int64)
        slot = (t % page_size).to(tl.int64)
        off = (page * stride_page + slot * stride_slot)[:, None] + (h.to(tl.int64) * stride_head + d)[None, :]
    else:
        off = ((b * rows + t).to(tl.int64) * HD)[:, None] + e[None, :]
    tl.store(dst + off, x.to(dst.dtype.element_ty), mask=ok)
