"""One Triton kernel: merge the later block keys into a causal windowed decode (docs/semantics.md 4.3).

A non-causal windowed layer (window ``(W-1, W-1)``) is lowered as

- part A: a causal windowed decode anchored at each query's own position (keys
  ``max(0, p_i - W + 1) .. p_i``), computed elsewhere and given here as ``O_A`` and ``LSE_A``;
- part B: the block keys that come after query ``i`` inside the right window,
  ``j`` with ``i < j <= min(K - 1, i + right)`` (``right = W - 1``; ``right == -1``: all later keys),
  scores ``s_j = scale * <q_i, k_j>``;
- merge, in fp32 and rounded once to the output dtype::

      LSE = logaddexp(LSE_A, LSE_B)
      O   = O_A + sigmoid(LSE_B - LSE_A) * (O_B - O_A)

  An empty part B (``i = K - 1``, or ``right == 0``) has weight exactly 0: its rows are stored as
  ``O_A`` and ``LSE_A`` unchanged, bit for bit, and never produce NaN.

One launch (``"merge_future_block_keys"``), grid ``(B * Hkv * n_row_blocks,)``: each program takes the
``R = K * G`` query rows that share a KV head (packed ``r = i * G + g``, padded to
``R_PAD = max(16, next_pow2(R))``, masked loads and stores), computes all their part-B scores with one
``tl.dot`` against the block's (at most ``KB_PAD``) keys, masks them per row, and merges in place-safe
order: every row is read (O_A, LSE_A) before a barrier and written after it, and no two programs touch
the same row, so ``out`` / ``out_lse`` may alias ``o_a`` / ``lse_a`` (the production in-place update).

LSE bases: ``lse_a`` is read in base ``lse_a_base`` (2.0 as flashinfer / trtllm-gen return it, or
``math.e``), converted to log2 units for the merge (a multiplication by exactly 1.0 for base 2), and the
merged LSE is written back in the same base.

Interpreter: as in ``_hybrid_kernel``, the constexpr ``UPCAST`` converts loaded tiles to fp32 when the
kernel runs under ``TRITON_INTERPRET=1`` (the interpreter does not emulate bf16 arithmetic); on a GPU
the dots are bf16/fp16 MMAs with fp32 accumulation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from oracle.rules import LN2

from ._triton_env import ensure_interpreter_on_cpu, kernel_is_interpreted

ensure_interpreter_on_cpu()  # before the kernel below is decorated

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

__all__ = ["merge_future_block_keys_triton", "merges_future_block_keys", "MergeOptions", "LAUNCH_MERGE_FUTURE",
           "MAX_BLOCK", "KERNELS"]

LAUNCH_MERGE_FUTURE = "merge_future_block_keys"
SUPPORTED_HEAD_DIMS = (16, 32, 64, 128, 256)
MAX_BLOCK = 64  # largest K (block size) the kernel takes: all block keys sit in one [KB_PAD, D] tile
_ACT_DTYPES = (torch.bfloat16, torch.float16)


@triton.jit(do_not_specialize=["right"])
def _merge_future_block_keys_kernel(
    q_ptr, kb_ptr, vb_ptr, oa_ptr, la_ptr, out_ptr, ol_ptr,
    Hkv, G, R, K, n_row_blocks, right,
    qk_scale2, a_to_log2, log2_to_base,
    stride_qb, stride_qk, stride_qh, stride_qd,
    stride_kbb, stride_kbk, stride_kbh, stride_kbd,
    stride_vbb, stride_vbk, stride_vbh, stride_vbd,
    stride_oab, stride_oak, stride_oah, stride_oad,
    stride_lab, stride_lak, stride_lah,
    stride_ob, stride_ok, stride_oh, stride_od,
    stride_lb, stride_lk, stride_lh,
    BLOCK_R: tl.constexpr, KB_PAD: tl.constexpr, D: tl.constexpr, UPCAST: tl.constexpr,
):
    pid = tl.program_id(0)
    rb = pid % n_row_blocks
    bh = pid // n_row_blocks
    kvh = bh % Hkv
    b = bh // Hkv
    b64 = b.to(tl.int64)

    rows = rb * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = rows < R
    qi = rows // G  # query (block position) of the row
    qh = kvh * G + rows % G  # query head of the row
    qi64 = qi.to(tl.int64)
    qh64 = qh.to(tl.int64)
    d = tl.arange(0, D)
    j = tl.arange(0, KB_PAD)
    jv = j < K

    # ---- reads: q, the block keys/values, part A of this program's rows ----
    q = tl.load(q_ptr + b64 * stride_qb + qi64[:, None] * stride_qk + qh64[:, None] * stride_qh
                + d[None, :] * stride_qd, mask=row_ok[:, None], other=0.0)
    kb = tl.load(kb_ptr + b64 * stride_kbb + j[:, None] * stride_kbk + kvh * stride_kbh
                 + d[None, :] * stride_kbd, mask=jv[:, None], other=0.0)
    vb = tl.load(vb_ptr + b64 * stride_vbb + j[:, None] * stride_vbk + kvh * stride_vbh
                 + d[None, :] * stride_vbd, mask=jv[:, None], other=0.0)
    o_a = tl.load(oa_ptr + b64 * stride_oab + qi64[:, None] * stride_oak + qh64[:, None] * stride_oah
                  + d[None, :] * stride_oad, mask=row_ok[:, None], other=0.0).to(tl.float32)
    lse_a_raw = tl.load(la_ptr + b64 * stride_lab + qi64 * stride_lak + qh64 * stride_lah,
                        mask=row_ok, other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
        kb = kb.to(tl.float32)
        vb = vb.to(tl.float32)
    # In-place safety: every read of the rows this program owns happens before any of its writes,
    # also across the threads of the CTA (replicated layouts may load one element in several threads).
    tl.debug_barrier()

    # ---- part B: later block keys inside the right window, log2 units ----
    s = tl.dot(q, tl.trans(kb)) * qk_scale2
    later = (j[None, :] > qi[:, None]) & jv[None, :]
    in_window = (right < 0) | (j[None, :] <= qi[:, None] + right)
    allowed = later & in_window & row_ok[:, None]
    s = tl.where(allowed, s, float("-inf"))
    m_b = tl.max(s, axis=1)
    has_b = m_b > float("-inf")
    m_ref = tl.where(has_b, m_b, 0.0)
    p = tl.math.exp2(s - m_ref[:, None])  # exactly 0 on masked keys
    l_b = tl.sum(p, axis=1)
    l_safe = tl.where(has_b, l_b, 1.0)
    if UPCAST:
        o_b = tl.dot(p, vb)
    else:
        o_b = tl.dot(p.to(vb.dtype), vb)
    o_b = o_b / l_safe[:, None]
    lse_b2 = m_ref + tl.math.log2(l_safe)

    # ---- merge in log2 units: sigmoid(LSE_B - LSE_A) = 1 / (1 + 2^(lse_a2 - lse_b2)) ----
    lse_a2 = lse_a_raw * a_to_log2
    diff = tl.where(has_b, lse_a2 - lse_b2, 0.0)
    w = 1.0 / (1.0 + tl.math.exp2(diff))
    hi = tl.maximum(lse_a2, lse_b2)
    lse2 = hi + tl.math.log2(1.0 + tl.math.exp2(-tl.abs(diff)))
    o = o_a + w[:, None] * (o_b - o_a)
    o = tl.where(has_b[:, None], o, o_a)  # empty part B: O_A bit for bit (also keeps -0.0)
    lse = tl.where(has_b, lse2 * log2_to_base, lse_a_raw)  # and LSE_A without a base round trip

    tl.store(out_ptr + b64 * stride_ob + qi64[:, None] * stride_ok + qh64[:, None] * stride_oh
             + d[None, :] * stride_od, o.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])
    tl.store(ol_ptr + b64 * stride_lb + qi64 * stride_lk + qh64 * stride_lh, lse, mask=row_ok)


KERNELS = {LAUNCH_MERGE_FUTURE: _merge_future_block_keys_kernel}


def merges_future_block_keys(K: int, right: int) -> bool:
    """Whether any query of a ``K``-token block has a later block key inside ``right`` (-1: unbounded).

    False for ``K == 1`` or ``right == 0``: then the merge is the identity and part A is the answer.
    """
    return K > 1 and right != 0


def _next_pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def _span(t: torch.Tensor) -> tuple[int, int]:
    """Byte range [lo, hi) that the elements of ``t`` occupy."""
    if t.numel() == 0:
        return (t.data_ptr(), t.data_ptr())
    lo = t.data_ptr()
    hi = lo + (sum((s - 1) * st for s, st in zip(t.shape, t.stride())) + 1) * t.element_size()
    return lo, hi


def _same_view(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.stride() == b.stride()
            and a.dtype == b.dtype)


def _check_alias(name: str, out: torch.Tensor, src_name: str, src: torch.Tensor) -> None:
    """``out`` may be exactly ``src`` (in place) or disjoint from it; a partial overlap is refused."""
    if _same_view(out, src):
        return
    a0, a1 = _span(out)
    b0, b1 = _span(src)
    if a0 < b1 and b0 < a1:
        raise ValueError(f"{name} overlaps {src_name} without being the same view: pass {src_name} itself "
                         f"for an in-place update, or a disjoint buffer")


@dataclass(frozen=True)
class MergeOptions:
    """The keyword options of :func:`merge_future_block_keys_triton` (meanings there); ``scale`` and ``right``
    have no default."""

    scale: float
    right: int
    lse_a_base: float = 2.0
    out: torch.Tensor | None = None
    out_lse: torch.Tensor | None = None
    launches: list | None = None
    skip_when_empty: bool = True


@dataclass(frozen=True)
class _Operands:
    """The tensors of one call and their sizes (validated)."""

    q: torch.Tensor
    k_block: torch.Tensor
    v_block: torch.Tensor
    o_a: torch.Tensor
    lse_a: torch.Tensor
    B: int
    K: int
    Hq: int
    Hkv: int
    D: int


def merge_future_block_keys_triton(q: torch.Tensor, k_block: torch.Tensor, v_block: torch.Tensor, o_a: torch.Tensor,
                                   lse_a: torch.Tensor, **options) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge part B (later block keys in the right window) into part A, one Triton kernel.

    Args (``options`` are keyword-only, ``scale`` and ``right`` required: the fields of :class:`MergeOptions`):
        q: ``[B, K, Hq, D]`` bf16/fp16 block queries.
        k_block, v_block: ``[B, K, Hkv, D]`` the block's own keys/values, dtype of ``q``
            (``Hq % Hkv == 0``; query head ``h`` reads KV head ``h // (Hq // Hkv)``).
        o_a: ``[B, K, Hq, D]`` bf16/fp16 part-A output (normalized).
        lse_a: ``[B, K, Hq]`` float32 part-A LSE in base ``lse_a_base``.
        scale: softmax scale on ``<q, k>``.
        right: right window in keys (``W - 1``); ``-1`` = all later block keys; ``0`` = none.
        lse_a_base: base of ``lse_a`` and of the returned LSE: ``2.0`` (flashinfer, trtllm-gen) or
            ``math.e`` (natural); any base > 0, != 1 works.
        out: optional ``[B, K, Hq, D]`` buffer of ``o_a``'s dtype; may be ``o_a`` itself (in place).
        out_lse: optional ``[B, K, Hq]`` float32 buffer; may be ``lse_a`` itself (in place).
        launches: optional list; ``"merge_future_block_keys"`` is appended when the kernel runs.
        skip_when_empty: when no query has a later key in the window (``K == 1`` or ``right == 0``),
            launch nothing and return part A: ``o_a``/``lse_a`` copied into ``out``/``out_lse``
            (nothing at all when those are ``o_a``/``lse_a`` themselves, or fresh clones when not
            given). Bit-identical to what the kernel would write. ``False`` always runs the kernel.

    Returns:
        ``(O, LSE)``: ``O`` ``[B, K, Hq, D]`` in ``o_a``'s dtype and ``LSE`` ``[B, K, Hq]`` float32 in
        base ``lse_a_base``.

    Raises:
        ValueError: on any shape, dtype, device or aliasing problem, before anything is launched.
        TypeError: on an unknown option, or without ``scale`` or ``right``.
    """
    try:
        opts = MergeOptions(**options)
    except TypeError as err:
        raise TypeError(f"merge_future_block_keys_triton(): {err}") from None
    t = _checked_operands(q, k_block, v_block, o_a, lse_a)
    scale, base = _checked_scalars(opts)
    _check_buffers(t, opts.out, opts.out_lse)
    out, out_lse = opts.out, opts.out_lse
    if opts.skip_when_empty and not merges_future_block_keys(t.K, opts.right):
        return _part_a(t, out, out_lse)
    interp = kernel_is_interpreted(_merge_future_block_keys_kernel)
    if q.device.type == "cpu" and not interp:
        raise ValueError("q is on the CPU but the Triton kernel was compiled for a GPU: set "
                         "TRITON_INTERPRET=1 before importing lowerings._merge_kernel, or pass CUDA tensors")
    if out is None:
        out = torch.empty_like(o_a, memory_format=torch.contiguous_format)
    if out_lse is None:
        out_lse = torch.empty((t.B, t.K, t.Hq), dtype=torch.float32, device=q.device)
    _launch(t, out, out_lse, opts.right, scale, base, bool(interp))
    if opts.launches is not None:
        opts.launches.append(LAUNCH_MERGE_FUTURE)
    return out, out_lse


def _checked_operands(q: torch.Tensor, k_block: torch.Tensor, v_block: torch.Tensor, o_a: torch.Tensor,
                      lse_a: torch.Tensor) -> _Operands:
    """The operands checked (kind, rank, device, shapes, dtypes); ValueError naming the first problem."""
    for name, t, dims in (("q", q, 4), ("k_block", k_block, 4), ("v_block", v_block, 4), ("o_a", o_a, 4),
                          ("lse_a", lse_a, 3)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != dims:
            raise ValueError(f"{name} must be {dims}-D, got shape {tuple(t.shape)}")
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device}, expected {q.device} (the device of q)")
    if q.dtype not in _ACT_DTYPES:
        raise ValueError(f"q must be bfloat16 or float16, got {q.dtype}")
    B, K, Hq, D = (int(x) for x in q.shape)
    if D not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"head dim D (q.shape[3]) must be a power of two in {SUPPORTED_HEAD_DIMS}, got {D}")
    if B < 1 or K < 1:
        raise ValueError(f"q must have B >= 1 and K >= 1, got shape {tuple(q.shape)}")
    if K > MAX_BLOCK:
        raise ValueError(f"block size K (q.shape[1]) must be <= {MAX_BLOCK}, got {K}")
    Hkv = int(k_block.shape[2])
    if Hkv < 1 or Hq % Hkv != 0:
        raise ValueError(f"Hq (q.shape[2]={Hq}) must be a multiple of Hkv (k_block.shape[2]={Hkv})")
    for name, t in (("k_block", k_block), ("v_block", v_block)):
        if tuple(t.shape) != (B, K, Hkv, D):
            raise ValueError(f"{name} must have shape [B, K, Hkv, D]={[B, K, Hkv, D]}, got {list(t.shape)}")
        if t.dtype != q.dtype:
            raise ValueError(f"{name} dtype must equal q's {q.dtype}, got {t.dtype}")
    if tuple(o_a.shape) != (B, K, Hq, D):
        raise ValueError(f"o_a must have shape {[B, K, Hq, D]}, got {list(o_a.shape)}")
    if o_a.dtype not in _ACT_DTYPES:
        raise ValueError(f"o_a must be bfloat16 or float16, got {o_a.dtype}")
    if tuple(lse_a.shape) != (B, K, Hq) or lse_a.dtype != torch.float32:
        raise ValueError(f"lse_a must be {[B, K, Hq]} float32, got {list(lse_a.shape)} {lse_a.dtype}")
    return _Operands(q, k_block, v_block, o_a, lse_a, B, K, Hq, Hkv, D)


def _checked_scalars(o: MergeOptions) -> tuple[float, float]:
    """`(scale, lse_a_base)` as floats, `right` checked; ValueError naming the first problem."""
    right = o.right
    if isinstance(right, bool) or not isinstance(right, int) or right < -1:
        raise ValueError(f"right must be an int >= -1 (-1 = unbounded), got {right!r}")
    try:
        scale = float(o.scale)
        base = float(o.lse_a_base)
    except (TypeError, ValueError):
        raise ValueError(f"scale and lse_a_base must be floats, got {o.scale!r}, {o.lse_a_base!r}") from None
    if not math.isfinite(scale):
        raise ValueError(f"scale must be finite, got {scale}")
    if not (math.isfinite(base) and base > 0.0 and base != 1.0):
        raise ValueError(f"lse_a_base must be a finite base > 0 and != 1 (2.0 or math.e), got {o.lse_a_base!r}")
    return scale, base


def _check_buffers(t: _Operands, out: torch.Tensor | None, out_lse: torch.Tensor | None) -> None:
    """The caller's output buffers: their shape, dtype and device, and no partial overlap with part A's tensors
    or with each other (exactly part A's tensors: an in-place update)."""
    B, K, Hq, D, device = t.B, t.K, t.Hq, t.D, t.q.device
    if out is not None:
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != (B, K, Hq, D) or out.dtype != t.o_a.dtype \
                or out.device != device:
            raise ValueError(f"out must be a {[B, K, Hq, D]} {t.o_a.dtype} tensor on {device}")
        _check_alias("out", out, "o_a", t.o_a)
    if out_lse is not None:
        if not isinstance(out_lse, torch.Tensor) or tuple(out_lse.shape) != (B, K, Hq) \
                or out_lse.dtype != torch.float32 or out_lse.device != device:
            raise ValueError(f"out_lse must be a {[B, K, Hq]} float32 tensor on {device}")
        _check_alias("out_lse", out_lse, "lse_a", t.lse_a)
    if out is not None and out_lse is not None:
        a0, a1 = _span(out)
        b0, b1 = _span(out_lse)
        if a0 < b1 and b0 < a1:
            raise ValueError("out and out_lse overlap")


def _part_a(t: _Operands, out: torch.Tensor | None, out_lse: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Part A as the result, no launch (no query has a later key in its window): copied into `out`/`out_lse`,
    nothing done where they are part A's own tensors, fresh clones where not given."""
    if out is None:
        out = t.o_a.clone()
    elif not _same_view(out, t.o_a):
        out.copy_(t.o_a)
    if out_lse is None:
        out_lse = t.lse_a.clone()
    elif not _same_view(out_lse, t.lse_a):
        out_lse.copy_(t.lse_a)
    return out, out_lse


def _launch(t: _Operands, out: torch.Tensor, out_lse: torch.Tensor, right: int, scale: float, base: float,
            upcast: bool) -> None:
    """One launch of the kernel over every row block of every (request, KV head)."""
    G = t.Hq // t.Hkv
    R = t.K * G
    r_pad = max(16, _next_pow2(R))
    block_r = min(r_pad, 128 if t.D <= 128 else 64)
    n_row_blocks = r_pad // block_r
    kb_pad = max(16, _next_pow2(t.K))
    ln_base = math.log(base)
    a_to_log2 = ln_base / LN2  # exactly 1.0 for base 2
    log2_to_base = LN2 / ln_base
    grid = (t.B * t.Hkv * n_row_blocks,)
    _merge_future_block_keys_kernel[grid](
        t.q, t.k_block, t.v_block, t.o_a, t.lse_a, out, out_lse,
        t.Hkv, G, R, t.K, n_row_blocks, int(right),
        scale * 1.4426950408889634, a_to_log2, log2_to_base,
        *(s for x in (t.q, t.k_block, t.v_block, t.o_a, t.lse_a, out, out_lse) for s in x.stride()),
        BLOCK_R=block_r, KB_PAD=kb_pad, D=t.D, UPCAST=upcast,
        num_warps=4 if block_r <= 64 else 8,
    )


KERNELS = (_merge_future_block_keys_kernel,)  # the handle lowerings.merges counts compilations of
