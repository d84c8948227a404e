"""Tensors of a case, built deterministically from its spec.

`materialize(case, device)` draws the logical values (queries, each request's context keys/values in
position order, the block's keys/values) from one generator seeded by `case.seed`, in an order that
depends on the shapes and lengths only: the page assignment, the layout and the block storage change
where the values sit, never what they are. Pool slots no request owns (spare pages, the tail of each
request's last page, and the block's slots when the block is not appended) hold a canary (NaN by
default) so that a lowering which reads them cannot pass by luck.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from oracle.case import Case
from oracle.errors import InvalidInput

TORCH_DTYPES = {
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float8_e4m3fn": getattr(torch, "float8_e4m3fn", None),
    "int32": torch.int32,
    "int64": torch.int64,
}
CANARIES = ("nan", "large", "zero")


def torch_dtype(name: str) -> torch.dtype:
    dt = TORCH_DTYPES.get(name)
    if dt is None:
        raise InvalidInput("dtype", f"{name!r} is not available in torch {torch.__version__}")
    return dt


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

    @property
    def device(self) -> torch.device:
        return self.q.device

    @property
    def scale(self) -> float:
        return self.case.softmax_scale

    def tensors(self) -> dict[str, torch.Tensor]:
        """Every tensor a lowering receives, by name (for hashing before and after a call)."""
        return {"q": self.q, "k_pool": self.k_pool, "v_pool": self.v_pool, "page_table": self.page_table,
                "context_lens": self.context_lens, "k_block": self.k_block, "v_block": self.v_block}

    def clone(self) -> "Inputs":
        """A deep copy (same strides for the page table view)."""
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
    """`(page, slot)` of position `t` of request `b` (SEMANTICS.md section 1)."""
    return case.pages[b][t // case.page_size], t % case.page_size


def _quantize(x: torch.Tensor, kv_dtype: torch.dtype, scale: float) -> torch.Tensor:
    """Store fp32 values in the pool dtype: fp8 stores `x / scale` (dequantized as `stored * scale`)."""
    if kv_dtype == TORCH_DTYPES["float8_e4m3fn"]:
        return (x / scale).clamp(-448.0, 448.0).to(kv_dtype)
    return x.to(kv_dtype)


def _dequantize(x: torch.Tensor, scale: float) -> torch.Tensor:
    return x.float() * scale if x.dtype == TORCH_DTYPES["float8_e4m3fn"] else x.float()


def materialize(case: Case, device: str | torch.device = "cpu", *, canary: str = "nan") -> Inputs:
    """Build a case's tensors on `device`, deterministically from `case.seed` (see module docstring)."""
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise InvalidInput("device", f"a torch device such as 'cpu' or 'cuda', got {device!r} ({err})") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise InvalidInput("device", "'cuda' was asked for but torch sees no CUDA device here")
    if canary not in CANARIES:
        raise InvalidInput("canary", f"one of {CANARIES}, got {canary!r}")
    c = case
    dt, kvdt = torch_dtype(c.dtype), torch_dtype(c.kv_dtype)
    B, K, Hq, Hkv, D, ps = c.batch_size, c.block_size, c.num_q_heads, c.num_kv_heads, c.head_dim, c.page_size
    gen = torch.Generator(device="cpu").manual_seed(c.seed)
    total_ctx = sum(c.context_lens)
    # Logical values, in a draw order independent of pages/layout/storage.
    q = torch.randn((B, K, Hq, D), generator=gen)
    k_ctx = torch.randn((total_ctx, Hkv, D), generator=gen)
    v_ctx = torch.randn((total_ctx, Hkv, D), generator=gen)
    k_blk = torch.randn((B, K, Hkv, D), generator=gen)
    v_blk = torch.randn((B, K, Hkv, D), generator=gen)

    is_fp8 = kvdt == TORCH_DTYPES["float8_e4m3fn"]
    if is_fp8:
        # The block's dense K/V carry values the fp8 pool represents exactly (for power-of-two scales), so
        # appending them and reading the dense suffix mean the same keys.
        k_blk = _dequantize(_quantize(k_blk * c.k_scale, kvdt, c.k_scale), c.k_scale)
        v_blk = _dequantize(_quantize(v_blk * c.v_scale, kvdt, c.v_scale), c.v_scale)
        k_ctx = k_ctx * c.k_scale
        v_ctx = v_ctx * c.v_scale
    k_block = k_blk.to(dt)
    v_block = v_blk.to(dt)

    # Pool in NHD [pages, page_size, Hkv, D], canary everywhere first.
    fill = canary_value(canary, kvdt)
    k_pool = torch.full((c.num_pages, ps, Hkv, D), fill, dtype=torch.float32)
    v_pool = torch.full((c.num_pages, ps, Hkv, D), fill, dtype=torch.float32)
    k_pool = _quantize(k_pool, kvdt, 1.0) if not is_fp8 else k_pool.to(kvdt)
    v_pool = _quantize(v_pool, kvdt, 1.0) if not is_fp8 else v_pool.to(kvdt)
    off = 0
    for b, L in enumerate(c.context_lens):
        if L:
            t = torch.arange(L)
            page_ids = torch.tensor(c.pages[b], dtype=torch.long)[t // ps]
            k_pool[page_ids, t % ps] = _quantize(k_ctx[off:off + L], kvdt, c.k_scale)
            v_pool[page_ids, t % ps] = _quantize(v_ctx[off:off + L], kvdt, c.v_scale)
        if c.block_storage == "appended":
            t = torch.arange(L, L + K)
            page_ids = torch.tensor(c.pages[b], dtype=torch.long)[t // ps]
            k_pool[page_ids, t % ps] = _quantize(k_block[b].float(), kvdt, c.k_scale)
            v_pool[page_ids, t % ps] = _quantize(v_block[b].float(), kvdt, c.v_scale)
        off += L
    if c.layout == "HND":
        k_pool = k_pool.permute(0, 2, 1, 3).contiguous()
        v_pool = v_pool.permute(0, 2, 1, 3).contiguous()

    # Page table: owned pages in order, then a spare page (or page 0 when the pool has none).
    spare = c.spare_pages()
    filler = spare[0] if spare else 0
    cols = max(1, c.max_pages_per_request)
    pt_dtype = torch_dtype(c.page_table_dtype)
    table = torch.full((B, cols + c.page_table_pad), filler, dtype=pt_dtype)
    for b, row in enumerate(c.pages):
        table[b, : len(row)] = torch.tensor(row, dtype=pt_dtype)
    if c.page_table_pad:
        # Columns past the view hold ids far outside the pool: reading through the row stride shows.
        table[:, cols:] = -(2**31) if pt_dtype == torch.int32 else -(2**40)
    table = table.to(device)
    page_table = table[:, :cols]

    return Inputs(
        case=c,
        q=q.to(dt).to(device),
        k_pool=k_pool.to(device),
        v_pool=v_pool.to(device),
        page_table=page_table,
        context_lens=torch.tensor(c.context_lens, dtype=torch.int32, device=device),
        context_lens_host=tuple(c.context_lens),
        k_block=k_block.to(device),
        v_block=v_block.to(device),
        canary=canary,
    )
