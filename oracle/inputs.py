"""Tensors of a case, built deterministically from its spec.

`materialize(case, device)` takes each request's logical values (its queries, context keys/values in
position order, block keys/values) from `oracle.values`: streams of the request's own, keyed by the
case `seed`, the request's `value_keys` entry and the position, shaped by the case's value regime.
The page assignment, the layout and the block storage change where the values sit, never what they
are; removing a request or shortening a context leaves every other value as it was. Pool slots no
request owns (spare pages, the tail of each request's last page, and the block's slots when the
block is not appended) hold a canary (NaN by default) so that a lowering which reads them cannot
pass by luck.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import torch

from oracle import _device_values
from oracle.case import Case
from oracle.dtypes import TORCH_DTYPES, page_table_int32, torch_dtype
from oracle.errors import InvalidInput
from oracle.values import RequestValues, case_values

__all__ = ["BUILDS", "CANARIES", "GUARD", "GUARD_ROWS", "GuardedBuffer", "Inputs", "TORCH_DTYPES", "VIEW_ALIGN_BYTES",
           "attach_output_buffers", "canary_value", "guarded_buffer", "materialize", "page_table_int32", "poison_bits",
           "slot_index", "torch_dtype", "warm_build", "warm_build_cases"]

CANARIES = ("nan", "large", "zero")


@dataclass
class Inputs:
    """The tensors of one case on one device.

    - `q`: `[B, K, Hq, D]` in `case.dtype`.
    - `k_pool`, `v_pool`: NHD `[num_pages, page_size, Hkv, D]` or HND `[num_pages, Hkv, page_size, D]`,
      in `case.kv_dtype` (fp8 values dequantize as `stored * k_scale` / `stored * v_scale`).
    - `page_table`: `[B, max_pages]` int32/int64 (a strided row view when `case.page_table_pad > 0`);
      entries past a request's pages point at a spare page.
    - `context_lens`: int32 `[B]` on the device; `context_lens_host`: the same as a tuple.
    - `k_block`, `v_block`: the block's keys/values, dense `[B, K, Hkv, D]` in `case.dtype`; also in the
      pool at positions `L_b .. L_b+K-1` when `case.block_storage == "appended"`.
    - `out`, `lse_out`: output buffers the lowering must write, `[B, K, Hq, D]` in `case.dtype` and
      `[B, K, Hq]` float32, or None. The runner gives them only to a lowering that declares
      `writes_given_output = True` (see `attach_output_buffers`): poisoned views of larger guarded buffers.
    """

    case: Case
    q: torch.Tensor
    k_pool: torch.Tensor
    v_pool: torch.Tensor
    page_table: torch.Tensor
    context_lens: torch.Tensor
    context_lens_host: tuple[int, ...]
    k_block: torch.Tensor
    v_block: torch.Tensor
    canary: str = "nan"
    out: torch.Tensor | None = None
    lse_out: torch.Tensor | None = None

    @property
    def device(self) -> torch.device:
        return self.q.device

    @property
    def scale(self) -> float:
        return self.case.softmax_scale

    def tensors(self) -> dict[str, torch.Tensor]:
        """Every input tensor a lowering receives, by name (for hashing before and after a call); the
        output buffers `out`/`lse_out` are not inputs and are not listed."""
        return {"q": self.q, "k_pool": self.k_pool, "v_pool": self.v_pool, "page_table": self.page_table,
                "context_lens": self.context_lens, "k_block": self.k_block, "v_block": self.v_block}

    def clone(self) -> "Inputs":
        """A deep copy of the inputs (same strides for the page table view); no output buffers."""
        pt_base = self.page_table
        if self.case.page_table_pad:
            buf = torch.empty((pt_base.shape[0], pt_base.shape[1] + self.case.page_table_pad),
                              dtype=pt_base.dtype, device=pt_base.device)
            buf.fill_(-(2**31) if pt_base.dtype == torch.int32 else -(2**40))
            buf[:, : pt_base.shape[1]] = pt_base
            pt = buf[:, : pt_base.shape[1]]
        else:
            pt = pt_base.clone()
        return Inputs(self.case, self.q.clone(), self.k_pool.clone(), self.v_pool.clone(), pt,
                      self.context_lens.clone(), self.context_lens_host, self.k_block.clone(), self.v_block.clone(),
                      self.canary)


def canary_value(kind: str, dtype: torch.dtype) -> float:
    if kind == "nan":
        return float("nan")
    if kind == "zero":
        return 0.0
    if kind == "large":
        # Large and finite: scores of ~1e4 * |q| swamp the softmax, so a read shows even behind a `where`.
        return 448.0 if dtype == TORCH_DTYPES["float8_e4m3fn"] else 1.0e4
    raise InvalidInput("canary", f"one of {CANARIES}, got {kind!r}")


def slot_index(case: Case, b: int, t: int) -> tuple[int, int]:
    """`(page, slot)` of position `t` of request `b` (docs/semantics.md section 1)."""
    return case.pages[b][t // case.page_size], t % case.page_size


def _quantize(x: torch.Tensor, kv_dtype: torch.dtype, scale: float) -> torch.Tensor:
    """Store fp32 values in the pool dtype: fp8 stores `x / scale` (dequantized as `stored * scale`)."""
    if kv_dtype == TORCH_DTYPES["float8_e4m3fn"]:
        return (x / scale).clamp(-448.0, 448.0).to(kv_dtype)
    return x.to(kv_dtype)


def _dequantize(x: torch.Tensor, scale: float) -> torch.Tensor:
    return x.float() * scale if x.dtype == TORCH_DTYPES["float8_e4m3fn"] else x.float()


BUILDS = ("auto", "host", "device", "counter")


def materialize(case: Case, device: str | torch.device = "cpu", *, canary: str = "nan", build: str = "auto") -> Inputs:
    """Build a case's tensors on `device`, deterministically from the case (see module docstring).

    `build="host"` draws the values with CPU generators and copies the tensors over (the same values on
    every device); `"device"` draws them with generators on `device` and writes the pool there, one
    request at a time (nothing of the pool's size crosses from the host; on CUDA the values differ from
    the host build's but are just as deterministic on that device type; on the CPU the two builds draw
    the same values, only the NaN canary's bits differ); `"auto"` (default) is `"device"` on CUDA and
    `"host"` on CPU. Either way the values do not depend on the pages, layout or block storage. A format 3
    case's device build on CUDA draws counter-based (`oracle._device_values`: a few kernel launches for the
    whole case, other values than the host build's); `"counter"` runs that build on any device (on a CPU
    under Triton's interpreter: how the CPU tests check it).
    """
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise InvalidInput("device", f"a torch device such as 'cpu' or 'cuda', got {device!r} ({err})") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise InvalidInput("device", "'cuda' was asked for but torch sees no CUDA device here")
    if canary not in CANARIES:
        raise InvalidInput("canary", f"one of {CANARIES}, got {canary!r}")
    if build not in BUILDS:
        raise InvalidInput("build", f"one of {BUILDS}, got {build!r}")
    if build == "counter" and case.version < 3:
        raise InvalidInput("build", f"'counter' is case format 3's device build; this case is format {case.version}")
    on_device = build in ("device", "counter") or (build == "auto" and device.type == "cuda")
    where = device if on_device else torch.device("cpu")
    c = case
    # Page table: owned pages in order, then a spare page (or page 0 when the pool has none); columns
    # past a padded view hold ids far outside the pool, so reading through the row stride shows. Built
    # first: its rows are where each request's values go (one host-to-device copy for the whole case).
    table = _page_table(c, where)
    if build == "counter" or (on_device and where.type == "cuda" and c.version >= 3):
        q, k_pool, v_pool, k_block, v_block = _assemble_counter(c, where, canary, table)
    else:
        q, k_pool, v_pool, k_block, v_block = _assemble(
            c, where, canary, case_values(c, where, host_order=not on_device), host=not on_device, table=table)
    return Inputs(
        case=c, q=q.to(device), k_pool=k_pool.to(device), v_pool=v_pool.to(device),
        page_table=table.to(device),
        context_lens=torch.tensor(c.context_lens, dtype=torch.int32, device=device),
        context_lens_host=tuple(c.context_lens), k_block=k_block.to(device), v_block=v_block.to(device),
        canary=canary,
    )


def warm_build_cases() -> list[Case]:
    """Tiny cases that launch every compiled variant of format 3's device build kernel: each pool dtype through
    a page table (read as int32 whatever its dtype: `page_table_int32`), each dense dtype
    (queries, the block, fp32 for a regime's directions); the regime's switches are run-time arguments, not
    variants."""
    return [Case(context_lens=(1,), block_size=1, num_q_heads=1, num_kv_heads=1, head_dim=64, page_size=1,
                 pages=((0, 1),), num_pages=3, dtype=dtype, kv_dtype=kv, k_scale=2.0 if kv != dtype else 1.0,
                 v_scale=0.5 if kv != dtype else 1.0, values=values, value_keys=(0,), block_storage="appended")
            for dtype in ("bfloat16", "float16") for kv in (dtype, "float8_e4m3fn") for values in ("plain", "huge")]


def warm_build(device: str | torch.device) -> int:
    """Compile format 3's device build on `device` for `warm_build_cases()`, so that no case pays for it;
    returns the cases built. Nothing to do but on CUDA (the host build runs no kernel)."""
    device = torch.device(device)
    if device.type != "cuda":
        return 0
    cases = warm_build_cases()
    for case in cases:
        materialize(case, device)
    torch.cuda.synchronize(device)
    return len(cases)


def _assemble_counter(c: Case, device: torch.device, canary: str, table: torch.Tensor):
    """`(q, k_pool, v_pool, k_block, v_block)` of format 3's device build: the pools hold the canary, then
    `oracle._device_values.draw` writes every request's streams (a few kernel launches in all); a block the
    case stores in the pool is appended there in one write per pool."""
    kvdt = torch_dtype(c.kv_dtype)
    B, K, Hkv, D, ps = c.batch_size, c.block_size, c.num_kv_heads, c.head_dim, c.page_size
    shape = (c.num_pages, ps, Hkv, D) if c.layout == "NHD" else (c.num_pages, Hkv, ps, D)
    k_pool, v_pool = (_filled(shape, canary_value(canary, kvdt), kvdt, device) for _ in range(2))
    q, k_block, v_block = _device_values.draw(c, device, table, k_pool, v_pool)
    if c.block_storage == "appended" and B and K:
        at = [(c.pages[b][(L + j) // ps], (L + j) % ps) for b, L in enumerate(c.context_lens) for j in range(K)]
        pid, slot = torch.tensor(at, dtype=torch.long).t().to(device, non_blocking=True)
        for pool, blk, scale in ((k_pool, k_block, c.k_scale), (v_pool, v_block, c.v_scale)):
            _put(pool, c.layout, pid, slot, _quantize(blk.reshape(B * K, Hkv, D).float(), kvdt, scale))
    return q, k_pool, v_pool, k_block, v_block


def _put(pool: torch.Tensor, layout: str, pid: torch.Tensor, slot: torch.Tensor, x: torch.Tensor) -> None:
    """Write `x [n, Hkv, D]` at pool positions `(pid[i], slot[i])`, NHD or HND."""
    if layout == "NHD":
        pool[pid, slot] = x
    else:
        pool[pid, :, slot] = x


def _page_table(c: Case, device: torch.device) -> torch.Tensor:
    """Owned pages in order, then a spare page (or page 0); a strided row view when `page_table_pad`."""
    spare = c.spare_pages()
    filler = spare[0] if spare else 0
    cols = max(1, c.max_pages_per_request)
    pt_dtype = torch_dtype(c.page_table_dtype)
    table = torch.full((c.batch_size, cols + c.page_table_pad), filler, dtype=pt_dtype)
    for b, row in enumerate(c.pages):
        table[b, : len(row)] = torch.tensor(row, dtype=pt_dtype)
    if c.page_table_pad:
        table[:, cols:] = -(2**31) if pt_dtype == torch.int32 else -(2**40)
    return table.to(device)[:, :cols]


def _filled(shape: tuple[int, ...], value: float, dtype: torch.dtype, device: torch.device,
            converted: bool = False) -> torch.Tensor:
    """`torch.full` in any dtype (fp8 through its byte pattern), without an fp32 tensor of the same size.
    `converted`: the bits of an fp32 `value` converted on the CPU (the host build's NaN is bf16 0xFFFF,
    `torch.full`'s 0x7FC0)."""
    if dtype == TORCH_DTYPES["float8_e4m3fn"] or converted:
        as_int = {1: torch.uint8, 2: torch.int16}[torch.empty((), dtype=dtype).element_size()]
        bits = torch.tensor([value], dtype=torch.float32).to(dtype).view(as_int).item()
        return torch.full(shape, bits, dtype=as_int, device=device).view(dtype)
    return torch.full(shape, value, dtype=dtype, device=device)


def _assemble(c: Case, device: torch.device, canary: str, values: Iterable[RequestValues], *, host: bool,
              table: torch.Tensor):
    """`(q, k_pool, v_pool, k_block, v_block)` on `device` from each request's values (in batch order):
    the pool in its layout, canaries everywhere first (`host`: the host build's canary bits), then each
    request's context (and its block when appended) written into its own slots, found through `table`
    (the case's page table on `device`: no host-to-device copy, hence no synchronization, per request)."""
    dt, kvdt = torch_dtype(c.dtype), torch_dtype(c.kv_dtype)
    B, K, Hq, Hkv, D, ps = c.batch_size, c.block_size, c.num_q_heads, c.num_kv_heads, c.head_dim, c.page_size
    is_fp8 = kvdt == TORCH_DTYPES["float8_e4m3fn"]
    shape = (c.num_pages, ps, Hkv, D) if c.layout == "NHD" else (c.num_pages, Hkv, ps, D)
    fill = canary_value(canary, kvdt)
    k_pool, v_pool = (_filled(shape, fill, kvdt, device, converted=host) for _ in range(2))
    q = torch.empty((B, K, Hq, D), dtype=dt, device=device)
    k_block = torch.empty((B, K, Hkv, D), dtype=dt, device=device)
    v_block = torch.empty((B, K, Hkv, D), dtype=dt, device=device)

    for b, val in enumerate(values):
        L = c.context_lens[b]
        q[b] = val.q
        kb, vb = val.kb, val.vb
        if is_fp8:
            # The block's dense K/V carry values the fp8 pool represents exactly (for power-of-two scales),
            # so appending them and reading the dense suffix mean the same keys.
            kb = _dequantize(_quantize(kb, kvdt, c.k_scale), c.k_scale)
            vb = _dequantize(_quantize(vb, kvdt, c.v_scale), c.v_scale)
        k_block[b], v_block[b] = kb, vb
        row = table[b, : len(c.pages[b])].long()
        if L:
            t = torch.arange(L, device=device)
            pid, slot = row[t // ps], t % ps
            _put(k_pool, c.layout, pid, slot, _quantize(val.k, kvdt, c.k_scale))
            _put(v_pool, c.layout, pid, slot, _quantize(val.v, kvdt, c.v_scale))
        if c.block_storage == "appended":
            t = torch.arange(L, L + K, device=device)
            pid, slot = row[t // ps], t % ps
            _put(k_pool, c.layout, pid, slot, _quantize(k_block[b].float(), kvdt, c.k_scale))
            _put(v_pool, c.layout, pid, slot, _quantize(v_block[b].float(), kvdt, c.v_scale))
        del val
    return q, k_pool, v_pool, k_block, v_block


# ---- output buffers: poisoned views with guard elements -------------------------------------------------
#
# A lowering that writes into buffers the framework gives it (`writes_given_output = True`) gets `out` and
# `lse_out` as views of larger flat buffers: guard elements, the view, guard elements. Each guard holds at
# least `GUARD` elements, the view's size, and `GUARD_ROWS` query rows (`[Hq, D]` of `out`, `[Hq]` of the
# LSE): a kernel that stores its padded rows unmasked (up to 128 rows per program) overruns the end by up
# to that many rows, and an overrun that stays inside the allocation is reported, not a heap corruption
# that crashes the process later (isolated runs survive that too, as a crash). The view holds a
# quiet NaN with a payload torch never produces itself (POISON), the guards another one (GUARD_BITS), so
# after the call "never written" (POISON still there), "wrote NaN" (any other NaN) and "wrote past the
# end" (a guard changed) are told apart bit for bit. Each view starts a multiple of `VIEW_ALIGN_BYTES` from the
# start of its allocation (the first guard rounded up), so its address is aligned as a fresh allocation's:
# Triton specializes a pointer argument on its 16-byte alignment, and a view whose alignment followed the batch
# size (a guard of the view's own size: 84*B bytes of an LSE of K=7, Hq=3) made `hybrid_paged[splits=4]` compile a
# third variant of its merge kernel in one shape family, a false alarm of the compile bound
# (docs/gpu/2026-12-03-h200-session17.md).

GUARD = 64
GUARD_ROWS = 128
VIEW_ALIGN_BYTES = 512  # the CUDA caching allocator's block alignment
# dtype -> (poison bits, guard bits). torch's canonical NaNs are bf16 0x7FC0, fp16 0x7E00, fp32 0x7FC00000.
_POISON_BITS = {
    torch.bfloat16: (0x7FC1, 0x7FC2),
    torch.float16: (0x7E01, 0x7E02),
    torch.float32: (0x7FC0DEAD, 0x7FC0BEEF),
}
_INT_OF = {2: torch.int16, 4: torch.int32}


def poison_bits(dtype: torch.dtype) -> tuple[int, int]:
    """(poison, guard) bit patterns of `dtype` (as signed ints of the same width)."""
    if dtype not in _POISON_BITS:
        raise InvalidInput("output dtype", f"one of {sorted(str(d) for d in _POISON_BITS)}, got {dtype}")
    return _POISON_BITS[dtype]


@dataclass
class GuardedBuffer:
    """A poisoned view and the flat buffer around it: `flat[:GUARD]`, `view`, `flat[GUARD + numel:]`."""

    view: torch.Tensor
    flat: torch.Tensor
    guard: int = GUARD

    @property
    def numel(self) -> int:
        return self.view.numel()

    def int_bits(self, t: torch.Tensor) -> torch.Tensor:
        return t.view(_INT_OF[t.element_size()])

    def before(self) -> torch.Tensor:
        return self.flat[: self.guard]

    def after(self) -> torch.Tensor:
        return self.flat[self.guard + self.numel:]


def guarded_buffer(shape: tuple[int, ...], dtype: torch.dtype, device: str | torch.device,
                   guard: int | None = None) -> GuardedBuffer:
    """A contiguous `shape` (`[B, K, ...]`) view filled with POISON and `guard` elements of GUARD_BITS on
    either side (default: the most of `GUARD`, the view's size, and `GUARD_ROWS` rows `shape[2:]`, rounded up
    to whole `VIEW_ALIGN_BYTES`: the view is as aligned as a fresh allocation)."""
    poison, guard_bits = poison_bits(dtype)
    n = 1
    for s in shape:
        n *= int(s)
    if guard is None:
        row = n // max(1, int(shape[0]) * int(shape[1])) if len(shape) >= 2 else 1
        guard = max(GUARD, n, GUARD_ROWS * row)
        per = VIEW_ALIGN_BYTES // torch.empty((), dtype=dtype).element_size()
        guard = -(-guard // per) * per
    int_dt = _INT_OF[torch.empty((), dtype=dtype).element_size()]
    flat_bits = torch.full((n + 2 * guard,), guard_bits, dtype=int_dt, device=device)
    flat_bits[guard: guard + n] = poison
    flat = flat_bits.view(dtype)
    return GuardedBuffer(view=flat[guard: guard + n].view(shape), flat=flat, guard=guard)


def attach_output_buffers(inputs: Inputs) -> tuple[GuardedBuffer, GuardedBuffer]:
    """Give `inputs` poisoned, guarded `out` and `lse_out` buffers; returns them (for the checks after)."""
    c = inputs.case
    B, K, Hq, D = c.batch_size, c.block_size, c.num_q_heads, c.head_dim
    out = guarded_buffer((B, K, Hq, D), inputs.q.dtype, inputs.device)
    lse = guarded_buffer((B, K, Hq), torch.float32, inputs.device)
    inputs.out, inputs.lse_out = out.view, lse.view
    return out, lse
