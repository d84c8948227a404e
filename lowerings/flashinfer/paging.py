"""flashinfer's CSR paging and the pool-side conversions, pure torch (testable on a CPU)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from lowerings.flashinfer.names import FP8
from oracle.case import Case


@dataclass
class Paging:
    """flashinfer's CSR page table for `N` rows: `indptr [N+1]`, `indices [indptr[-1]]`, `last_page_len [N]`,
    all int32 on the target device, and the row lengths (host ints)."""

    indptr: torch.Tensor
    indices: torch.Tensor
    last_page_len: torch.Tensor
    lens: list[int]


def build_paging(page_table: torch.Tensor, rows: Sequence[int], lens: Sequence[int], page_size: int,
                 device: torch.device | str) -> Paging:
    """CSR paging for rows `n` that read request `rows[n]`'s pages and hold `lens[n] >= 1` tokens.

    Only each row's owned prefix `page_table[b, :ceil(len / page_size)]` is read (entries past it are
    arbitrary), from a host copy: works for int32/int64 tables and strided row views alike.
    """
    host = page_table.detach().to("cpu")
    width = host.shape[1]
    counts, chunks = [], []
    for r, n in zip(rows, lens):
        if n < 1:
            raise ValueError(f"a flashinfer paged row needs at least one token, got length {n}")
        c = -(-n // page_size)
        if c > width:
            raise ValueError(f"row of request {r} holds {n} tokens = {c} pages of {page_size}, "
                             f"but the page table has {width} columns")
        counts.append(c)
        chunks.append(host[r, :c])
    indices = torch.cat(chunks).to(torch.int32) if chunks else torch.zeros(0, dtype=torch.int32)
    indptr = torch.zeros(len(counts) + 1, dtype=torch.int32)
    if counts:
        indptr[1:] = torch.cumsum(torch.tensor(counts, dtype=torch.int64), 0).to(torch.int32)
    last = torch.tensor([n - (c - 1) * page_size for n, c in zip(lens, counts)], dtype=torch.int32)
    return Paging(indptr.to(device), indices.to(device), last.to(device), list(lens))


def to_pool_dtype(x: torch.Tensor, pool_dtype: torch.dtype, scale: float) -> torch.Tensor:
    """The block's K/V as the pool stores them (fp8 stores `x / scale`), contiguous.

    flashinfer's append kernel reinterprets `append_key` as the cache dtype without checking it, so a
    bf16 block appended into an fp8 pool must be quantized here first.
    """
    if pool_dtype == getattr(torch, FP8, None):
        return (x.float() / scale).clamp(-448.0, 448.0).to(pool_dtype).contiguous()
    return x.to(pool_dtype).contiguous()


def kv_scale_kwargs(case: Case) -> dict[str, float]:
    """`k_scale`/`v_scale` for run(): flashinfer folds `k_scale` into `sm_scale` and multiplies the output
    by `v_scale` after the kernel. Passed only for fp8 pools (None otherwise: no extra work)."""
    if case.kv_dtype == FP8:
        return {"k_scale": float(case.k_scale), "v_scale": float(case.v_scale)}
    return {}
