"""The golden oracle: drafter block attention in fp32 (or fp64) over the gathered keys.

docs/semantics.md sections 2-3, literally: query `i` of request `b` sits at `p = L_b + i`; it sees key `t`
iff `0 <= t < L_b + K`, `t >= p - left` (unless `left == -1`) and `t <= p + right` (unless
`right == -1`), intersected with an optional caller's key subset. `O = softmax(scale * q.k) @ v` and
`LSE = ln sum exp(scale * q.k)` (natural log). A row with no visible key gives `O = 0`, `LSE = -inf`.

It reads exactly the values a lowering reads (fp8 pools dequantized as `stored * scale`, the bf16/fp16
block), upcast to the compute precision. Keys are processed in chunks of absolute positions with an
online softmax, so memory is bounded by the chunk, not by `L`; GQA never repeats K/V. This module
imports nothing from `lowerings/`.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field

import torch

from oracle.case import Case
from oracle.dtypes import TORCH_DTYPES, interpreting, torch_dtype
from oracle.errors import InvalidInput
from oracle.inputs import Inputs
from oracle.summary import OutputSummary, summary_of_figures, summary_of_tensors

DEFAULT_CHUNK = 2048


@dataclass(frozen=True)
class OracleResult:
    """`out`: `[B, K, Hq, D]`, `lse`: `[B, K, Hq]` natural log, both in the compute precision. `figures`: the Triton
    engine's per-program statistics of both (`oracle/_finish_kernel.py`), which `summary()` reads instead of
    reducing `out` and `lse` with torch ops; None from the torch engine."""

    out: torch.Tensor
    lse: torch.Tensor
    figures: torch.Tensor | None = field(default=None, repr=False, compare=False)

    def summary(self) -> OutputSummary:
        """`OutputSummary` of this result (one transfer, waiting for the device; kept for later calls)."""
        kept = self.__dict__.get("_summary")
        if kept is None:
            if self.figures is not None:
                kept = summary_of_figures(self.figures, self.out.numel())
            else:
                kept = summary_of_tensors(self.out, self.lse)
            object.__setattr__(self, "_summary", kept)
        return kept


def visible(case: Case, window: tuple[int, int] | None = None, *, device: str | torch.device = "cpu") -> torch.Tensor:
    """Boolean `[B, K, T]` visibility of docs/semantics.md section 2 (`T = max_b L_b + K`, absolute positions)."""
    return _visible_chunk(case, window or case.window, 0, case.max_keys,
                          torch.tensor(case.context_lens, device=device))


def future_block_keys_mask(case: Case, right: int | None = None) -> torch.Tensor:
    """Boolean `[B, K, 1, T]`: for query `i`, the later block keys `j` with `i < j <= min(K-1, i+right)`
    (part B of the windowed merge, docs/semantics.md 4.3); `right` defaults to the case's, -1 unbounded."""
    right = case.window[1] if right is None else right
    B, K, T = case.batch_size, case.block_size, case.max_keys
    mask = torch.zeros((B, K, 1, T), dtype=torch.bool)
    for b, L in enumerate(case.context_lens):
        for i in range(K):
            hi = K - 1 if right == -1 else min(K - 1, i + right)
            if hi > i:
                mask[b, i, 0, L + i + 1: L + hi + 1] = True
    return mask


def _visible_chunk(case: Case, window: tuple[int, int], t0: int, t1: int, lens: torch.Tensor) -> torch.Tensor:
    left, right = window
    K = case.block_size
    t = torch.arange(t0, t1, device=lens.device).view(1, 1, -1)
    p = (lens.view(-1, 1, 1) + torch.arange(K, device=lens.device).view(1, -1, 1))
    vis = t < (lens.view(-1, 1, 1) + K)
    if left != -1:
        vis = vis & (t >= p - left)
    if right != -1:
        vis = vis & (t <= p + right)
    return vis.expand(lens.shape[0], case.block_size, t1 - t0)


@contextlib.contextmanager
def _exact_fp32_matmul():
    """No TF32 inside the oracle: its precision is the point."""
    old_cuda = torch.backends.cuda.matmul.allow_tf32
    old_cudnn = torch.backends.cudnn.allow_tf32
    old_prec = torch.get_float32_matmul_precision()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old_cuda
        torch.backends.cudnn.allow_tf32 = old_cudnn
        torch.set_float32_matmul_precision(old_prec)


def check_inputs(inputs: Inputs) -> None:
    """Raise `InvalidInput` naming the tensor when `inputs` does not match its case."""
    c = inputs.case
    B, K, Hq, Hkv, D, ps = c.batch_size, c.block_size, c.num_q_heads, c.num_kv_heads, c.head_dim, c.page_size
    pool_shape = (c.num_pages, ps, Hkv, D) if c.layout == "NHD" else (c.num_pages, Hkv, ps, D)
    want = {
        "q": ((B, K, Hq, D), torch_dtype(c.dtype)),
        "k_pool": (pool_shape, torch_dtype(c.kv_dtype)),
        "v_pool": (pool_shape, torch_dtype(c.kv_dtype)),
        "k_block": ((B, K, Hkv, D), torch_dtype(c.dtype)),
        "v_block": ((B, K, Hkv, D), torch_dtype(c.dtype)),
    }
    device = inputs.q.device
    for name, (shape, dtype) in want.items():
        t = getattr(inputs, name)
        if not isinstance(t, torch.Tensor):
            raise InvalidInput(name, f"a torch.Tensor, got {type(t).__name__}")
        if tuple(t.shape) != shape:
            raise InvalidInput(name, f"shape {shape} for this case ({c.layout}), got {tuple(t.shape)}")
        if t.dtype != dtype:
            raise InvalidInput(name, f"dtype {dtype} for this case, got {t.dtype}")
        if t.device != device:
            raise InvalidInput(name, f"on q's device {device}, got {t.device}")
    pt = inputs.page_table
    if pt.dim() != 2 or pt.shape[0] != B or pt.shape[1] < c.max_pages_per_request:
        raise InvalidInput("page_table", f"shape [B={B}, >= {c.max_pages_per_request}], got {tuple(pt.shape)}")
    if pt.dtype not in (torch.int32, torch.int64):
        raise InvalidInput("page_table", f"dtype int32 or int64, got {pt.dtype}")
    if pt.device != device:
        raise InvalidInput("page_table", f"on q's device {device}, got {pt.device}")
    cl = inputs.context_lens
    if tuple(cl.shape) != (B,) or cl.dtype not in (torch.int32, torch.int64) or cl.device != device:
        raise InvalidInput("context_lens", f"an int32 tensor of shape [{B}] on {device}, got {cl.dtype} {tuple(cl.shape)} on {cl.device}")


ENGINES = ("auto", "torch", "triton")


def attention(inputs: Inputs, *, window: tuple[int, int] | None = None, key_mask: torch.Tensor | None = None,
              future_block_keys_right: int | None = None, precision: torch.dtype = torch.float32,
              chunk: int = DEFAULT_CHUNK, engine: str = "auto", kv_rounded: bool = False,
              round_p: bool = False) -> OracleResult:
    """Oracle attention of a case: `O [B, K, Hq, D]` and natural-log `LSE [B, K, Hq]` in `precision`.

    `window` overrides the case's `(left, right)` (e.g. `(W-1, 0)` for part A of a windowed merge);
    `future_block_keys_right` restricts each query `i` to the later block keys `i < j <= min(K-1,
    i + right)` (part B, -1 unbounded); `key_mask`, boolean and broadcastable to `[B, K, Hq, T]` over
    absolute key positions `T = max_b L_b + K`, restricts each row to any other key subset.

    `engine`: `"torch"` scores `chunk` keys at a time with torch ops (fp32 or fp64, any device, any
    key mask); `"triton"` is one Triton kernel (`oracle/_fast.py`: in fp32 exact products, fp32 sums, no
    TF32; in fp64 fp64 throughout) without an explicit `key_mask`, compiled on a GPU or interpreted on a CPU;
    `"auto"` (default) takes the Triton engine on CUDA where it applies, else torch.

    `kv_rounded`: read an fp8 pool's keys and values as the working dtype holds them, dequantized (`stored *
    scale`, in fp32) and rounded to the case's dtype, as a working-dtype computation over dequantized pages
    does (`working_dtype_output`); no change for a K/V cache in the working dtype.

    `round_p`: the weights `exp(s - m)` (relative to the running row maximum) rounded to the case's dtype before
    they multiply the values, the row sums taken of the unrounded weights: the order of flash kernels, which feed
    `P` to the tensor cores in the working dtype (`working_dtype_output`). Not the oracle: a yardstick.
    """
    check_inputs(inputs)
    window = _checked_options(inputs.case, window, future_block_keys_right, precision, chunk, engine,
                              kv_rounded=kv_rounded, round_p=round_p)
    dev = inputs.q.device
    if engine == "auto":
        on_gpu = dev.type == "cuda" and key_mask is None
        ready = on_gpu and (triton_engine_ready(dev) if precision == torch.float32 else triton_f64_ready(dev))
        engine = "triton" if ready else "torch"
    if engine == "triton":
        if precision != torch.float32 and (kv_rounded or round_p):
            raise InvalidInput("precision", f"torch.float32 with kv_rounded or round_p (a yardstick), got {precision}")
        if key_mask is not None:
            raise InvalidInput("key_mask", "None with engine='triton' (an explicit key mask needs engine='torch')")
        if not triton_engine_ready(dev):
            raise InvalidInput("engine", f"'torch' for tensors on {dev}: the Triton engine needs triton and "
                               "CUDA tensors (or, for CPU tensors, TRITON_INTERPRET=1 set before triton is imported)")
        from oracle._fast import attention_triton  # imports triton: only where the Triton engine runs

        with _exact_fp32_matmul():
            out, lse, figures = attention_triton(inputs, window, future_block_keys_right, kv_rounded=kv_rounded,
                                                 round_p=round_p, precision=precision)
        return OracleResult(out=out, lse=lse, figures=figures)
    key_mask = _row_key_mask(inputs.case, key_mask, future_block_keys_right, dev)
    return _torch_engine(inputs, window, key_mask, precision, chunk, kv_rounded=kv_rounded, round_p=round_p)


def _checked_options(c: Case, window: tuple[int, int] | None, fbk: int | None, precision: torch.dtype, chunk: int,
                     engine: str, *, kv_rounded: bool, round_p: bool) -> tuple[int, int]:
    """`attention`'s options checked (InvalidInput naming the option); returns the window, the case's by default."""
    for flag, v in (("kv_rounded", kv_rounded), ("round_p", round_p)):
        if not isinstance(v, bool):
            raise InvalidInput(flag, f"True or False, got {v!r}")
    if precision not in (torch.float32, torch.float64):
        raise InvalidInput("precision", f"torch.float32 or torch.float64, got {precision}")
    if not isinstance(chunk, int) or chunk < 1:
        raise InvalidInput("chunk", f"a positive integer, got {chunk!r}")
    if engine not in ENGINES:
        raise InvalidInput("engine", f"one of {ENGINES}, got {engine!r}")
    window = tuple(window) if window is not None else c.window
    if len(window) != 2 or any((not isinstance(w, int)) or w < -1 for w in window):
        raise InvalidInput("window", f"a pair (left, right) of integers >= -1, got {window!r}")
    if fbk is not None and (not isinstance(fbk, int) or isinstance(fbk, bool) or fbk < -1):
        raise InvalidInput("future_block_keys_right", f"None or an integer >= -1, got {fbk!r}")
    return window


def _row_key_mask(c: Case, key_mask: torch.Tensor | None, fbk: int | None, dev: torch.device) -> torch.Tensor | None:
    """The key subset of each row, boolean `[B, K, Hq, T]` on `dev`: the caller's `key_mask` and the later block keys
    of `future_block_keys_mask(c, fbk)`, intersected; None when neither restricts the rows."""
    B, K, Hq, T = c.batch_size, c.block_size, c.num_q_heads, c.max_keys
    if key_mask is not None:
        if not isinstance(key_mask, torch.Tensor) or key_mask.dtype != torch.bool:
            raise InvalidInput("key_mask", "a boolean tensor broadcastable to [B, K, Hq, T]")
        try:
            key_mask = key_mask.to(dev).expand(B, K, Hq, T)
        except RuntimeError:
            raise InvalidInput("key_mask", f"broadcastable to [B={B}, K={K}, Hq={Hq}, T={T}], got {tuple(key_mask.shape)}") from None
    if fbk is not None:
        fmask = future_block_keys_mask(c, fbk).to(dev).expand(B, K, Hq, T)
        key_mask = fmask if key_mask is None else (key_mask & fmask)
    return key_mask


def _torch_engine(inputs: Inputs, window: tuple[int, int], key_mask: torch.Tensor | None, precision: torch.dtype,
                  chunk: int, *, kv_rounded: bool, round_p: bool) -> OracleResult:
    """The torch engine of `attention`: `chunk` keys at a time, an online softmax in `precision`; `key_mask`
    `[B, K, Hq, T]` (or None) restricts each row's keys."""
    c = inputs.case
    B, K, Hq, Hkv, D = c.batch_size, c.block_size, c.num_q_heads, c.num_kv_heads, c.head_dim
    G, T = c.group_size, c.max_keys
    dev = inputs.q.device
    lens = inputs.context_lens.to(torch.long)
    p_dtype = inputs.q.dtype if round_p else None
    q = inputs.q.to(precision).view(B, K, Hkv, G, D)
    scale = c.softmax_scale
    m = torch.full((B, Hkv, G, K), float("-inf"), dtype=precision, device=dev)
    l = torch.zeros((B, Hkv, G, K), dtype=precision, device=dev)
    acc = torch.zeros((B, Hkv, G, K, D), dtype=precision, device=dev)
    with _exact_fp32_matmul():
        for t0 in range(0, T, chunk):
            t1 = min(T, t0 + chunk)
            k, v, valid = gather_keys(inputs, t0, t1, lens, precision, kv_rounded)
            vis = _visible_chunk(c, window, t0, t1, lens) & valid.unsqueeze(1)  # [B, K, C]
            vis = vis.view(B, 1, 1, K, t1 - t0)
            if key_mask is not None:
                km = key_mask[..., t0:t1].reshape(B, K, Hkv, G, t1 - t0).permute(0, 2, 3, 1, 4)
                vis = vis & km
            s = torch.einsum("bkhgd,bchd->bhgkc", q, k) * scale
            s = s.masked_fill(~vis, float("-inf"))
            m_new = torch.maximum(m, s.amax(dim=-1))
            m_safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
            alpha = torch.exp(m - m_safe)
            p = torch.exp(s - m_safe.unsqueeze(-1))
            l = l * alpha + p.sum(dim=-1)
            pw = p if p_dtype is None else p.to(p_dtype).to(precision)
            acc = acc * alpha.unsqueeze(-1) + torch.einsum("bhgkc,bchd->bhgkd", pw, v)
            m = m_new
    has = l > 0
    out = torch.where(has.unsqueeze(-1), acc / torch.where(has, l, torch.ones_like(l)).unsqueeze(-1),
                      torch.zeros_like(acc))
    lse = torch.where(has, m + torch.log(torch.where(has, l, torch.ones_like(l))),
                      torch.full_like(l, float("-inf")))
    # [B, Hkv, G, K, D] -> [B, K, Hq, D]
    out = out.permute(0, 3, 1, 2, 4).reshape(B, K, Hq, D)
    lse = lse.permute(0, 3, 1, 2).reshape(B, K, Hq)
    return OracleResult(out=out, lse=lse)


E4M3_MAX = 448.0  # the largest float8_e4m3fn magnitude
E4M3_SPACING = 2.0 ** -9  # every float8_e4m3fn value is a multiple of its smallest subnormal


def fp8_dequantizes_exactly(scale: float, dtype: str) -> bool:
    """Whether every e4m3 value times `scale` is a `dtype` value: `scale` a power of two whose products stay
    inside `dtype`'s range (at most its max, multiples of its smallest subnormal). Then rounding a dequantized
    pool to the working dtype changes no value (e4m3 has 4 significant bits, bf16 8, fp16 11)."""
    if not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0) or math.frexp(scale)[0] != 0.5:
        return False
    fi = torch.finfo(torch_dtype(dtype))
    return E4M3_MAX * scale <= fi.max and E4M3_SPACING * scale >= fi.smallest_normal * fi.eps


def kv_read_exactly(case: Case) -> bool:
    """Whether the working dtype holds the pool's dequantized values exactly: a pool in the working dtype, or fp8
    with both scales dequantizing exactly (`fp8_dequantizes_exactly`). Then `kv_rounded` changes nothing."""
    if case.kv_dtype == case.dtype:
        return True
    return all(fp8_dequantizes_exactly(s, case.dtype) for s in (case.k_scale, case.v_scale))


def working_dtype_output(inputs: Inputs) -> torch.Tensor:
    """What the working dtype costs a correct kernel: `[B, K, Hq, D]` in the case's dtype, computed in the order of
    flash kernels, the working dtype's real arithmetic: the values a working-dtype computation reads (q and the
    block as given, an fp8 pool dequantized and rounded to the working dtype: `kv_rounded`), fp32 scores of exact
    products, the weights `exp(s - m)` rounded to the working dtype before `P.V` (`round_p`), fp32 sums, the output
    rounded once. The judge's yardstick (`parity.engine.yardstick`): a kernel may be off by a multiple of this one's error.
    One fp32 pass of the oracle's engine (the Triton kernel's `ROUND_P` variant on a GPU)."""
    return attention(inputs, kv_rounded=True, round_p=True).out.to(inputs.q.dtype)


def triton_variant_cases(head_dims: tuple[int, ...], dtypes: tuple[str, ...], kv_dtypes: tuple[str, ...],
                         max_block: int, max_group: int, f64: bool = False) -> list[Case]:
    """Tiny cases that, run with `engine="triton"`, compile every variant of the Triton engine's kernel that cases
    of these head dims, dtypes, KV dtypes ("same" allowed), block sizes up to `max_block` and GQA groups up to
    `max_group` launch (`parity.exec.precompile` compiles them before a run's first case); `f64`: those of the fp64
    variant, whose row blocks are smaller."""
    from oracle._fast import variant_cases

    return variant_cases(tuple(head_dims), tuple(dtypes), tuple(kv_dtypes), max_block, max_group, f64)


def triton_f64_ready(device: torch.device) -> bool:
    """Whether the Triton engine can attend in fp64 on `device` (`oracle._fast.f64_ready`: the installed Triton
    compiles its `F64` variant there); False without a ready Triton engine."""
    if not triton_engine_ready(device):
        return False
    from oracle._fast import f64_ready

    return f64_ready(device)


def triton_kernel():
    """The Triton engine's kernel (a `triton.jit` function), for tools that compile it on their own
    (`scripts/oracle_ptx.py`)."""
    from oracle._fast_kernel import ORACLE_KERNEL

    return ORACLE_KERNEL


def triton_engine_ready(device: torch.device) -> bool:
    """Triton importable, and the tensors on CUDA, or on the CPU with the interpreter switched on."""
    try:
        import triton  # noqa: F401
    except Exception:
        return False
    return device.type == "cuda" or (device.type == "cpu" and interpreting())


def _pool_rows(pool: torch.Tensor, layout: str, pid: torch.Tensor, slot: torch.Tensor) -> torch.Tensor:
    """`[B, C, Hkv, D]`: the pool's rows at pages `pid` and slots `slot` (`[B, C]` each), NHD or HND, by one
    `index_select` (several times faster than advanced indexing on a CPU)."""
    n, a, b, D = pool.shape
    B, C = pid.shape
    if not pool.is_contiguous():
        return pool[pid, slot] if layout == "NHD" else pool[pid, :, slot]
    if layout == "NHD":  # [pages, slot, head, D]
        return pool.view(n * a, b, D).index_select(0, (pid * a + slot).reshape(-1)).view(B, C, b, D)
    heads = torch.arange(a, device=pid.device).view(1, 1, a) * b  # HND [pages, head, slot, D]
    idx = (pid * (a * b) + slot).unsqueeze(-1) + heads
    return pool.view(n * a * b, D).index_select(0, idx.reshape(-1)).view(B, C, a, D)


def gather_keys(inputs: Inputs, t0: int, t1: int, lens: torch.Tensor, precision: torch.dtype,
                  kv_rounded: bool = False):
    """Keys/values of absolute positions `t0..t1-1` for every request: `k, v [B, C, Hkv, D]` in
    `precision` (zero where invalid) and `valid [B, C]` (`t < L_b + K`); `kv_rounded`: an fp8 pool's values
    dequantized in fp32 and rounded to the working dtype (`attention`)."""
    c = inputs.case
    B, K, ps = c.batch_size, c.block_size, c.page_size
    dev = inputs.q.device
    t = torch.arange(t0, t1, device=dev).view(1, -1)
    Lb = lens.view(-1, 1)
    in_ctx = t < Lb
    in_blk = (t >= Lb) & (t < Lb + K)
    from_pool = in_ctx | (in_blk if c.block_storage == "appended" else torch.zeros_like(in_blk))
    col = torch.clamp(t // ps, max=inputs.page_table.shape[1] - 1).expand(B, -1)
    pid = torch.gather(inputs.page_table.to(torch.long), 1, col)
    pid = torch.where(from_pool, pid, torch.zeros_like(pid))
    slot = (t % ps).expand(B, -1)
    fp8 = TORCH_DTYPES["float8_e4m3fn"]
    valid = in_ctx | in_blk
    if c.block_storage == "dense":  # the block's (request, position) pairs in this chunk: a few, written in place
        bi, ci = in_blk.nonzero(as_tuple=True)
        bj = (t0 + ci) - lens[bi]

    def read(pool: torch.Tensor, block: torch.Tensor, kv_scale: float) -> torch.Tensor:
        x = _pool_rows(pool, c.layout, pid, slot)
        if pool.dtype == fp8 and kv_rounded:
            x = (x.to(torch.float32) * kv_scale).to(inputs.q.dtype).to(precision)
        elif pool.dtype == fp8:
            x = x.to(precision).mul_(kv_scale)
        else:
            x = x.to(precision)
        if c.block_storage == "dense":
            x[bi, ci] = block[bi, bj].to(precision)
        return x.masked_fill_(~valid.view(B, -1, 1, 1), 0.0)

    return read(inputs.k_pool, inputs.k_block, c.k_scale), read(inputs.v_pool, inputs.v_block, c.v_scale), valid
