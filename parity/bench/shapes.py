"""Bench shapes, what they cost in memory, and the input sets built over one shared KV pool.

A `Shape` is a uniform batch: `B` requests of `L` context tokens each, a block of `K` queries, `Hq/Hkv`
heads, head dim `D`, pages of `page_size` tokens. The tables sweep hundreds of shapes whose KV
reaches tens of GiB, so the pool is not materialized per shape: one `KVPool` per pool family (KV
heads, head dim, page size, layout, dtype), sized for the family's largest need, is filled with
random values once on the device, and every shape's input sets are page tables over disjoint page
ranges of it (set `s` of a shape owns pages `s * B * P .. (s+1) * B * P - 1`, `P` pages per request).
Each set is a valid `Case` (pages never alias) with its own `Inputs`: the oracle, the judge and every
lowering take it as any other case. The block's K/V are the values at positions `L .. L+K-1` of each
request's pages, so an appended block and a dense one mean the same keys.

These inputs are not `check`'s hardened ones: slots no request of the set owns hold other sets' values,
not NaN canaries. Hardening is `dflash-parity check`'s job; bench judges the output it times.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch

from oracle.case import Case
from oracle.inputs import Inputs, torch_dtype

GiB = 1 << 30
ELEMENT_BYTES = {"bfloat16": 2, "float16": 2}
ORACLE_CHUNK = 2048  # keys per step of the torch oracle (oracle.reference.DEFAULT_CHUNK)
CUDA_SLACK_BYTES = 256 << 20  # flashinfer's 128 MiB float workspace, plan buffers, graph pools
FILL_CHUNK_BYTES = 1 << 30


@dataclass(frozen=True)
class Shape:
    batch: int
    context: int
    q_heads: int
    kv_heads: int
    head_dim: int
    block: int = 7
    page_size: int = 32
    layout: str = "HND"
    dtype: str = "bfloat16"
    storage: str = "appended"
    window: tuple[int, int] = (-1, -1)

    # ---- derived ----------------------------------------------------------------------------------
    @property
    def heads(self) -> str:
        return f"{self.q_heads}/{self.kv_heads}"

    @property
    def group(self) -> int:
        return self.q_heads // self.kv_heads

    @property
    def pages_per_request(self) -> int:
        return -(-(self.context + self.block) // self.page_size)

    @property
    def set_pages(self) -> int:
        return self.batch * self.pages_per_request

    @property
    def element_bytes(self) -> int:
        return ELEMENT_BYTES[self.dtype]

    @property
    def page_bytes(self) -> int:
        """Bytes of one page of K and V together."""
        return 2 * self.page_size * self.kv_heads * self.head_dim * self.element_bytes

    @property
    def small_bytes(self) -> int:
        """q, the dense block K/V, the output and the LSE of one set."""
        e = self.element_bytes
        B, K = self.batch, self.block
        return B * K * (2 * self.q_heads * self.head_dim * e + 2 * self.kv_heads * self.head_dim * e + 4 * self.q_heads)

    @property
    def set_bytes(self) -> int:
        """Bytes of one input set: its pages of the pool plus its small tensors."""
        return self.set_pages * self.page_bytes + self.small_bytes

    def oracle_bytes(self) -> int:
        """An upper estimate of the oracle's working memory (the torch engine's per-chunk gather and
        scores; the Triton engine needs less)."""
        c = min(ORACLE_CHUNK, self.context + self.block)
        return 24 * self.batch * c * self.kv_heads * self.head_dim + 12 * self.batch * self.q_heads * self.block * c

    def need_bytes(self, device: str) -> int:
        """Memory one measurement of this shape needs: one input set, the oracle, and on CUDA some slack."""
        return self.set_bytes + self.oracle_bytes() + (CUDA_SLACK_BYTES if device == "cuda" else 0)

    @property
    def pool_key(self) -> tuple:
        return (self.kv_heads, self.head_dim, self.page_size, self.layout, self.dtype)

    def with_batch(self, batch: int) -> "Shape":
        return replace(self, batch=batch)

    # ---- text ----------------------------------------------------------------------------------------
    def label(self) -> str:
        """`8/2 D=64 L=32768 B=8`"""
        return f"{self.heads} D={self.head_dim} L={self.context} B={self.batch}"

    def to_json(self) -> dict[str, Any]:
        return {"B": self.batch, "L": self.context, "K": self.block, "q_heads": self.q_heads,
                "kv_heads": self.kv_heads, "head_dim": self.head_dim, "page_size": self.page_size,
                "layout": self.layout, "dtype": self.dtype, "block_storage": self.storage,
                "window": list(self.window)}


def fmt_gib(nbytes: float) -> str:
    g = nbytes / GiB
    return f"{g:.1f}" if g >= 0.95 else f"{g:.2g}"


def memory_reason(shape: Shape, device: str, max_gib: float) -> str | None:
    """"needs X GiB > --max-gib Y" when one measurement of `shape` would not fit, else None."""
    need = shape.need_bytes(device)
    if need > max_gib * GiB:
        return f"needs {fmt_gib(need)} GiB > --max-gib {max_gib:g}"
    return None


# ---- the shared pool -------------------------------------------------------------------------------------
@dataclass
class KVPool:
    """K and V pools of one family, filled with N(0, 1) values in the working dtype."""

    key: tuple
    k: torch.Tensor
    v: torch.Tensor

    @property
    def num_pages(self) -> int:
        return int(self.k.shape[0])

    @classmethod
    def allocate(cls, like: Shape, num_pages: int, device: str | torch.device, seed: int = 0) -> "KVPool":
        dims = ((num_pages, like.page_size, like.kv_heads, like.head_dim) if like.layout == "NHD"
                else (num_pages, like.kv_heads, like.page_size, like.head_dim))
        dt = torch_dtype(like.dtype)
        gen = torch.Generator(device=torch.device(device)).manual_seed(seed)
        pools = []
        for _ in range(2):
            t = torch.empty(dims, dtype=dt, device=device)
            step = max(1, FILL_CHUNK_BYTES // max(1, t[0].numel() * t.element_size()))
            for p0 in range(0, num_pages, step):  # chunks: bounded temporaries, 32-bit indexing
                t[p0:p0 + step].normal_(generator=gen)
            pools.append(t)
        return cls(key=like.pool_key, k=pools[0], v=pools[1])


class PoolKeeper:
    """At most one pool alive: the one of the family being measured, sized for the family's plan."""

    def __init__(self, device: str, seed: int = 0) -> None:
        self.device = device
        self.seed = seed
        self.planned: dict[tuple, int] = {}
        self.pool: KVPool | None = None

    def plan(self, shape: Shape, pages: int) -> None:
        self.planned[shape.pool_key] = max(self.planned.get(shape.pool_key, 0), pages)

    def get(self, shape: Shape, pages: int) -> KVPool:
        if self.pool is not None and self.pool.key == shape.pool_key and self.pool.num_pages >= pages:
            return self.pool
        self.release()
        self.pool = KVPool.allocate(shape, max(pages, self.planned.get(shape.pool_key, 0)), self.device, self.seed)
        return self.pool

    def release(self) -> None:
        self.pool = None
        if self.device == "cuda":
            torch.cuda.empty_cache()


def _gather_block(pool: torch.Tensor, table: torch.Tensor, shape: Shape) -> torch.Tensor:
    """The values at positions `L .. L+K-1` of every request, `[B, K, Hkv, D]` (the block's own keys)."""
    t = torch.arange(shape.context, shape.context + shape.block, device=table.device)
    pid = table.to(torch.long)[:, t // shape.page_size]  # [B, K]
    slot = t % shape.page_size
    return (pool[pid, slot] if shape.layout == "NHD" else pool[pid, :, slot]).contiguous()


def set_case(shape: Shape, s: int, num_pages: int, *, seed: int = 0) -> Case:
    """The `Case` of input set `s` of `shape` in a pool of `num_pages` pages (see the module docstring)."""
    B, P = shape.batch, shape.pages_per_request
    first = s * B * P
    return Case(context_lens=(shape.context,) * B, block_size=shape.block, num_q_heads=shape.q_heads,
                num_kv_heads=shape.kv_heads, head_dim=shape.head_dim, page_size=shape.page_size,
                pages=tuple(tuple(range(first + b * P, first + (b + 1) * P)) for b in range(B)),
                num_pages=num_pages, layout=shape.layout, window=tuple(shape.window), dtype=shape.dtype,
                kv_dtype=shape.dtype, block_storage=shape.storage, seed=seed + s)


def build_sets(shape: Shape, pool: KVPool, cases: list[Case], *, seed: int = 0) -> list[Inputs]:
    """One input set per case of `cases` (from `set_case`, set `s` = `cases[s]`) over `pool`."""
    B, P = shape.batch, shape.pages_per_request
    if len(cases) * B * P > pool.num_pages:
        raise ValueError(f"{len(cases)} sets of {shape.label()} need {len(cases) * B * P} pages, "
                         f"the pool has {pool.num_pages}")
    dev = pool.k.device
    dt = torch_dtype(shape.dtype)
    gen = torch.Generator(device=dev).manual_seed(seed + 1)
    sets = []
    for s, case in enumerate(cases):
        if case.num_pages != pool.num_pages or case.batch_size != B:
            case = set_case(shape, s, pool.num_pages, seed=seed)
        first = s * B * P
        table = torch.arange(first, first + B * P, dtype=torch.int32, device=dev).view(B, P)
        q = torch.randn((B, shape.block, shape.q_heads, shape.head_dim), generator=gen, device=dev).to(dt)
        sets.append(Inputs(case=case, q=q, k_pool=pool.k, v_pool=pool.v, page_table=table,
                           context_lens=torch.full((B,), shape.context, dtype=torch.int32, device=dev),
                           context_lens_host=case.context_lens, k_block=_gather_block(pool.k, table, shape),
                           v_block=_gather_block(pool.v, table, shape)))
    return sets


def small_case(shape: Shape, *, seed: int = 0) -> Case:
    """A `Case` of `shape` with its own small pool (one spare page), for `oracle.inputs.materialize`."""
    P = shape.pages_per_request
    return Case(context_lens=(shape.context,) * shape.batch, block_size=shape.block, num_q_heads=shape.q_heads,
                num_kv_heads=shape.kv_heads, head_dim=shape.head_dim, page_size=shape.page_size,
                pages=tuple(tuple(range(b * P, (b + 1) * P)) for b in range(shape.batch)),
                num_pages=shape.batch * P + 1, layout=shape.layout, window=tuple(shape.window), dtype=shape.dtype,
                kv_dtype=shape.dtype, block_storage=shape.storage, seed=seed)
