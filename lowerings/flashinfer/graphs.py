"""CUDA-graph mode: the fixed buffers flashinfer's graph-mode wrappers are built over, per arena key.

flashinfer's wrappers are graph-safe only with `use_cuda_graph=True` and fixed index buffers given at
construction: plan() then copies each new page table into those buffers (and writes its schedule into
the wrapper's own int workspace at offsets that depend on the batch size only), and run() reads them.
A captured graph therefore replays the latest plan() as long as the batch size, the number of query
rows, the dtypes, the window and the pages' capacity stay those it was built for: they are the key of
a graph arena (`GraphArenas._graph_key`).

flashinfer's graph mode forces its split-KV paths (fa2 always, the decode unless the batch fills the
GPU), so a graph-mode call need not give the eager `run`'s bits; it gives its own on every replay.
What a replay reads, hence what `prepare` re-plans: the fixed index buffers, the schedule plan() writes
into the wrapper's int workspace (and fa3's kv-length / token-offset buffers), the append's
`append_indptr`/`seq_lens` buffers. What the capture bakes in, hence part of the arena key: the tensors'
addresses, batch size and query rows, heads, dtypes, `window_left`, the softmax and fp8 scales.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import torch

from lowerings.flashinfer.library import flashinfer_module
from oracle.inputs import Inputs

FA3_VECTOR_SPARSE_ENTRIES = 16 * 1024 * 1024  # fa3's fixed `_vector_sparse_indices_buffer` (int32 entries)
FA3_MAX_BATCH = 32768  # fa3's fixed `_vector_sparse_indptr_buffer` / `_kv_lens_buffer` (entries)


@dataclass
class GraphPaged:
    """One graph-mode wrapper, the fixed buffers it was built with, and the output buffers its run()
    writes (`out [N, Hq, D]`, `lse [N, Hq]` float32)."""

    wrapper: Any
    indptr: torch.Tensor
    indices: torch.Tensor
    last_page_len: torch.Tensor
    qo_indptr: torch.Tensor | None
    out: torch.Tensor
    lse: torch.Tensor


@dataclass
class GraphAppend:
    """Fixed buffers of the append (`get_batch_indices_positions` + `append_paged_kv_cache`)."""

    append_indptr: torch.Tensor
    seq_lens: torch.Tensor
    indptr: torch.Tensor
    indices: torch.Tensor
    last_page_len: torch.Tensor


def graph_wrapper(cls: Any, workspace: torch.Tensor, layout: str, buffers: dict[str, torch.Tensor],
                  **kwargs: Any) -> Any:
    """`cls(workspace, layout, use_cuda_graph=True, **buffers, **kwargs)`, after checking that this
    flashinfer's constructor takes those buffer arguments (their names changed across releases)."""
    try:
        params = inspect.signature(cls).parameters
    except (TypeError, ValueError):
        params = {}
    if params and not any(p.kind == inspect.Parameter.VAR_KEYWORD for p in params.values()):
        missing = [n for n in ("use_cuda_graph", *buffers, *kwargs) if n not in params]
        if missing:
            raise NotImplementedError(f"{getattr(cls, '__name__', cls)} of this flashinfer takes no "
                                      f"{', '.join(missing)}: cannot build a CUDA-graph wrapper")
    return cls(workspace, layout, use_cuda_graph=True, **buffers, **kwargs)


class GraphArenas:
    """The graph-mode wrappers and fixed buffers of one adapter, one per arena key (a mixin of
    `FlashinferBase`: needs `self._graph`, a dict, and `self.workspace(device)`)."""

    _graph: dict[tuple, Any]

    def _graph_key(self, kind: str, inputs: Inputs, rows: int, *extra: Any) -> tuple:
        c = inputs.case
        return (kind, str(inputs.device), c.layout, c.dtype, c.kv_dtype, c.head_dim, c.page_size, c.num_q_heads,
                c.num_kv_heads, c.block_size, rows, int(inputs.page_table.shape[1]), c.softmax_scale,
                float(c.k_scale), float(c.v_scale), *extra)

    def graph_decode(self, inputs: Inputs, rows: int, tensor_cores: bool, window_left: int) -> GraphPaged:
        """The graph-mode decode wrapper for `rows` decode rows, its fixed buffers (room for every row to
        hold as many pages as the page table has columns) and its output buffers."""
        key = self._graph_key("decode", inputs, rows, bool(tensor_cores), window_left)
        g = self._graph.get(key)
        if g is None:
            c, dev = inputs.case, inputs.device
            cap = rows * max(1, int(inputs.page_table.shape[1]))
            indptr = torch.zeros(rows + 1, dtype=torch.int32, device=dev)
            indices = torch.zeros(cap, dtype=torch.int32, device=dev)
            last = torch.ones(rows, dtype=torch.int32, device=dev)
            w = graph_wrapper(flashinfer_module().BatchDecodeWithPagedKVCacheWrapper, self.workspace(dev), c.layout,
                              {"paged_kv_indptr_buffer": indptr, "paged_kv_indices_buffer": indices,
                               "paged_kv_last_page_len_buffer": last}, use_tensor_cores=bool(tensor_cores))
            out = torch.zeros((rows, c.num_q_heads, c.head_dim), dtype=inputs.q.dtype, device=dev)
            lse = torch.zeros((rows, c.num_q_heads), dtype=torch.float32, device=dev)
            g = self._graph[key] = GraphPaged(w, indptr, indices, last, None, out, lse)
        return g

    def graph_prefill(self, inputs: Inputs, backend: str, window_left: int) -> GraphPaged:
        """The graph-mode paged-prefill wrapper for the case's `B` requests of `K` queries, its fixed
        buffers and its output buffers. fa3 in graph mode: its plan() sizes the schedule for the first
        plan's query rows (fixed here: `B*K`), and its run() expands the fixed page-index buffer into
        per-token offsets in a fixed 16 Mi-entry buffer (capacity x page size must stay below it) with
        a fixed 32768-entry indptr (B below it)."""
        key = self._graph_key("prefill", inputs, inputs.case.batch_size, backend, window_left)
        g = self._graph.get(key)
        if g is None:
            c, dev = inputs.case, inputs.device
            B, K = c.batch_size, c.block_size
            cap = B * max(1, int(inputs.page_table.shape[1]))
            if backend == "fa3" and (cap * c.page_size >= FA3_VECTOR_SPARSE_ENTRIES or B + 1 >= FA3_MAX_BATCH):
                raise ValueError(f"fa3 in CUDA-graph mode: {B} requests x {inputs.page_table.shape[1]} pages of "
                                 f"{c.page_size} exceed its fixed buffers ({FA3_VECTOR_SPARSE_ENTRIES} token "
                                 f"offsets, {FA3_MAX_BATCH} requests)")
            qo = torch.zeros(B + 1, dtype=torch.int32, device=dev)
            indptr = torch.zeros(B + 1, dtype=torch.int32, device=dev)
            indices = torch.zeros(cap, dtype=torch.int32, device=dev)
            last = torch.ones(B, dtype=torch.int32, device=dev)
            w = graph_wrapper(flashinfer_module().BatchPrefillWithPagedKVCacheWrapper, self.workspace(dev), c.layout,
                              {"qo_indptr_buf": qo, "paged_kv_indptr_buf": indptr, "paged_kv_indices_buf": indices,
                               "paged_kv_last_page_len_buf": last}, backend=backend)
            out = torch.zeros((B * K, c.num_q_heads, c.head_dim), dtype=inputs.q.dtype, device=dev)
            lse = torch.zeros((B * K, c.num_q_heads), dtype=torch.float32, device=dev)
            g = self._graph[key] = GraphPaged(w, indptr, indices, last, qo, out, lse)
        return g

    def graph_outputs(self, inputs: Inputs, kind: str) -> tuple[torch.Tensor, torch.Tensor]:
        """Fixed `out [B, K, Hq, D]` and `lse [B, K, Hq]` float32 buffers for a result computed by ops that
        allocate (the merges): graph mode copies it there, so each call returns the same tensors."""
        key = self._graph_key(kind, inputs, inputs.case.batch_size)
        g = self._graph.get(key)
        if g is None:
            q = inputs.q
            g = self._graph[key] = (torch.zeros_like(q, memory_format=torch.contiguous_format),
                                    torch.zeros(q.shape[:3], dtype=torch.float32, device=q.device))
        return g

    def graph_append(self, inputs: Inputs) -> GraphAppend:
        key = self._graph_key("append", inputs, inputs.case.batch_size)
        g = self._graph.get(key)
        if g is None:
            B, dev = inputs.case.batch_size, inputs.device
            cap = B * max(1, int(inputs.page_table.shape[1]))
            g = self._graph[key] = GraphAppend(
                append_indptr=torch.zeros(B + 1, dtype=torch.int32, device=dev),
                seq_lens=torch.zeros(B, dtype=torch.int32, device=dev),
                indptr=torch.zeros(B + 1, dtype=torch.int32, device=dev),
                indices=torch.zeros(cap, dtype=torch.int32, device=dev),
                last_page_len=torch.ones(B, dtype=torch.int32, device=dev))
        return g
