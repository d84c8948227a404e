"""The shared base of the flashinfer adapters: workspace, wrapper caches and the call sequences.

Each call sequence is built in two halves: the host-side steps (paging, `plan()`, buffers), then a
zero-argument function doing the device work only. `run(inputs)` builds it with the eager wrappers and
calls it at once; `prepare(inputs)` builds it with graph-mode wrappers over fixed buffers
(`lowerings.flashinfer.graphs`) and returns it, to be captured in a `torch.cuda.CUDAGraph` and
replayed. Graph-mode and eager wrappers are cached apart (`_graph` and `_wrappers`).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from lowerings import counters
from lowerings.flashinfer.graphs import GraphArenas
from lowerings.flashinfer.library import flashinfer_module, flashinfer_status
from lowerings.flashinfer.names import C_APPEND, C_BATCH_POS, C_DECODE, C_DECODE_TC, c_prefill
from lowerings.flashinfer.paging import build_paging, kv_scale_kwargs, to_pool_dtype
from lowerings.limits import Limits
from lowerings.protocol import BASE_2, LoweringResult
from oracle.case import Case
from oracle.inputs import Inputs

WORKSPACE_BYTES = 128 * 1024 * 1024  # the float workspace flashinfer's examples allocate


class FlashinferBase(GraphArenas):
    """Workspace, wrapper caches and the flashinfer call sequences every adapter is made of (see the
    module docstring). Subclasses define `supports`, `expected_calls`, the kernel declarations and
    `_build(inputs, graph)`."""

    devices: tuple[str, ...] = ("cuda",)
    lse_base: float = BASE_2
    deterministic: bool = True
    max_compiles: int | None = None
    graph_safe: bool = False  # True: prepare() returns a function a CUDA graph may capture and replay
    supports_by_shape = True  # every adapter's supports() reads shape fields only (lowerings.protocol)
    name = "flashinfer-base"

    def __init__(self) -> None:
        self._workspace: torch.Tensor | None = None
        self._wrappers: dict[tuple, Any] = {}  # eager mode
        self._graph: dict[tuple, Any] = {}     # CUDA-graph mode: GraphPaged / GraphAppend per key

    def __repr__(self) -> str:
        return f"<lowering {self.name}>"

    # -- protocol pieces ----------------------------------------------------------------------------
    def available(self, device: str) -> tuple[bool, str]:
        if device != "cuda":
            return False, f"{self.name} runs on cuda only, not {device}"
        if not torch.cuda.is_available():
            return False, "no CUDA device visible to torch"
        return flashinfer_status()

    def case_limits(self, device: str):
        """On a GPU: the small shapes to 2048 keys, the production dimension at the device's defaults
        (contexts to 128K, the model rows), bf16 and fp16, bf16/fp16 and fp8 (e4m3) KV pools, head dims
        64 and 128: every variant flashinfer 0.7.x instantiates for these kernels (decode, fa2 and fa3
        prefill, merge_state; fa3 has no bf16/fp16-query x fp8-KV kernel: `supports()` says so).
        flashinfer JIT-compiles one module per (kernel, dtype, KV dtype, head dim, window on/off),
        15-165 s each: `--warm-up` / `python -m parity.exec.warmup` load them first (40 for all adapters);
        narrow a short session with `--limit dtypes=bfloat16 --limit kv_dtypes=same --limit head_dims=128`."""
        if device == "cuda":
            return Limits(max_context=2048, head_dims=(64, 128))
        return None

    def kernel_families(self, case: Case) -> dict[str, str]:  # overridden
        return {}

    def forbidden_kernel_families(self, case: Case) -> dict[str, str]:  # overridden
        return {}

    def jit_modules(self, case: Case) -> tuple[str, ...]:  # overridden
        """The JIT-compiled modules `run` loads for `case` (`parity.exec.warmup` warms each once)."""
        return ()

    def run(self, inputs: Inputs) -> LoweringResult:
        return self._build(inputs, graph=False)()

    def prepare(self, inputs: Inputs) -> Callable[[], LoweringResult]:
        """Every host-side step of `run` once (paging, `plan()` of graph-mode wrappers built over fixed
        index buffers, the append's index buffers, output buffers), and a zero-argument function doing
        the device work only (the append, the wrapper's run into the preallocated `out`/`lse`, the merge)
        on the same tensors each call: a `torch.cuda.CUDAGraph` may capture it and replay it.

        - Call the function once before capturing (Triton kernels compile, flashinfer caches buffers).
        - Every call returns the same `out`/`lse` tensors (fixed buffers, shared with a later `prepare`
          of the same key); a replay rewrites them. Partial B of the eager and merge_state forms is
          allocated per call (in a graph: once, at capture).
        - To replay over new lengths or pages: write the new values into the same tensors (`q`, the
          pools, `page_table`, the block) and call `prepare` again with an `Inputs` over those tensors
          and the new case: it re-plans into the same fixed buffers the graph reads. Same key needed:
          batch size, block size, heads, head dim, page size, layout, dtypes, window, scales and the
          page table's width (the capacity of the index buffers).
        - Each kernel call records its counter (`lowerings.counters`) once per call of the function,
          as `run` does; a replay records nothing.
        - Not while a stream is capturing: `plan()` copies host data to the GPU.
        """
        if not self.graph_safe:
            raise NotImplementedError(f"{self.name} is not CUDA-graph safe: prepare() is not supported")
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(f"{self.name}.prepare() plans on the host: call it before capturing, not inside")
        return self._build(inputs, graph=True)

    def _build(self, inputs: Inputs, graph: bool) -> Callable[[], LoweringResult]:  # overridden
        raise NotImplementedError(f"{self.name}: no call sequence")

    # -- resources ----------------------------------------------------------------------------------
    def workspace(self, device: torch.device) -> torch.Tensor:
        """One zero-initialized 128 MiB float workspace per adapter instance, shared by its wrappers of
        both modes (their runs are sequential on one stream; each wrapper keeps its own int workspace,
        where plan() writes its schedule)."""
        ws = self._workspace
        if ws is None or ws.device != torch.device(device):
            ws = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
            self._workspace = ws
        return ws

    def decode_wrapper(self, inputs: Inputs, tensor_cores: bool):
        c = inputs.case
        key = ("decode", c.layout, c.dtype, c.kv_dtype, c.head_dim, c.page_size, bool(tensor_cores))
        w = self._wrappers.get(key)
        if w is None:
            w = flashinfer_module().BatchDecodeWithPagedKVCacheWrapper(self.workspace(inputs.device), c.layout,
                                                                       use_tensor_cores=bool(tensor_cores))
            self._wrappers[key] = w
        return w

    def prefill_wrapper(self, inputs: Inputs, backend: str):
        c = inputs.case
        key = ("prefill", c.layout, c.dtype, c.kv_dtype, c.head_dim, c.page_size, backend)
        w = self._wrappers.get(key)
        if w is None:
            w = flashinfer_module().BatchPrefillWithPagedKVCacheWrapper(self.workspace(inputs.device), c.layout,
                                                                        backend=backend)
            self._wrappers[key] = w
        return w

    # -- call sequences: host steps now, device work in the returned function ------------------------
    def append_call(self, inputs: Inputs, *, graph: bool) -> Callable[[], None]:
        """The production append: the block's K/V into the pool at positions `L_b .. L_b+K-1`
        (`get_batch_indices_positions` + `append_paged_kv_cache`); nothing when the pool has it."""
        c = inputs.case
        if c.block_storage != "dense":
            return _nothing
        from flashinfer.page import append_paged_kv_cache, get_batch_indices_positions

        B, K, Hkv, D = inputs.k_block.shape
        dev = inputs.device
        lens = [L + K for L in inputs.context_lens_host]
        pg = build_paging(inputs.page_table, range(B), lens, c.page_size, dev)
        append_indptr = torch.arange(B + 1, dtype=torch.int32, device=dev) * K
        seq_lens = torch.tensor(lens, dtype=torch.int32, device=dev)
        indptr, indices, last = pg.indptr, pg.indices, pg.last_page_len
        if graph:
            g = self.graph_append(inputs)
            g.append_indptr.copy_(append_indptr)
            g.seq_lens.copy_(seq_lens)
            g.indptr.copy_(indptr)
            g.indices[: indices.numel()].copy_(indices)
            g.last_page_len.copy_(last)
            append_indptr, seq_lens, indptr, indices, last = (g.append_indptr, g.seq_lens, g.indptr, g.indices,
                                                              g.last_page_len)
        k_block, v_block, k_pool, v_pool = inputs.k_block, inputs.v_block, inputs.k_pool, inputs.v_pool

        def call() -> None:
            counters.record(C_BATCH_POS, tokens=B * K)
            batch_indices, positions = get_batch_indices_positions(append_indptr, seq_lens, B * K)
            k_app = to_pool_dtype(k_block.reshape(B * K, Hkv, D), k_pool.dtype, c.k_scale)
            v_app = to_pool_dtype(v_block.reshape(B * K, Hkv, D), v_pool.dtype, c.v_scale)
            counters.record(C_APPEND, tokens=B * K)
            append_paged_kv_cache(k_app, v_app, batch_indices, positions, (k_pool, v_pool), indices, indptr, last,
                                  kv_layout=c.layout)

        return call

    def decode_call(self, inputs: Inputs, rows: Sequence[int], lens: Sequence[int], *, window_left: int,
                    tensor_cores: bool, graph: bool) -> Callable[[], tuple[torch.Tensor, torch.Tensor]]:
        """One batch-decode call: row `n` is the query `q.reshape(N, Hq, D)[n]` of request `rows[n]` over
        that request's first `lens[n]` keys. The function returns `out [N, Hq, D]` and base-2 `lse [N, Hq]`."""
        c = inputs.case
        q = inputs.q
        Hq, D = q.shape[2], q.shape[3]
        N = len(rows)
        if q.shape[0] * q.shape[1] != N:
            raise ValueError(f"decode rows: {N} rows for a q of shape {tuple(q.shape)}")
        pg = build_paging(inputs.page_table, rows, lens, c.page_size, inputs.device)
        g = self.graph_decode(inputs, N, tensor_cores, window_left) if graph else None
        w = g.wrapper if g is not None else self.decode_wrapper(inputs, tensor_cores)
        w.plan(pg.indptr, pg.indices, pg.last_page_len, c.num_q_heads, c.num_kv_heads, c.head_dim, c.page_size,
               pos_encoding_mode="NONE", window_left=window_left, q_data_type=q.dtype,
               kv_data_type=inputs.k_pool.dtype, sm_scale=c.softmax_scale)
        name = C_DECODE_TC if tensor_cores else C_DECODE
        kv = (inputs.k_pool, inputs.v_pool)
        scales = kv_scale_kwargs(c)
        bufs = {} if g is None else {"out": g.out, "lse": g.lse}

        def call() -> tuple[torch.Tensor, torch.Tensor]:
            counters.record(name, rows=N)
            out, lse = w.run(q.reshape(N, Hq, D), kv, return_lse=True, **bufs, **scales)
            return out, lse

        return call

    def prefill_call(self, inputs: Inputs, backend: str, *, window_left: int, graph: bool
                     ) -> Callable[[], tuple[torch.Tensor, torch.Tensor]]:
        """One paged-prefill call: `K` queries per request (bottom-right aligned: query `i` at position
        `L+i`) over `L+K` keys, `causal=False`. The function returns `out [B, K, Hq, D]`, base-2
        `lse [B, K, Hq]`."""
        c = inputs.case
        q = inputs.q
        B, K, Hq, D = q.shape
        dev = inputs.device
        lens = [L + K for L in inputs.context_lens_host]
        pg = build_paging(inputs.page_table, range(B), lens, c.page_size, dev)
        qo_indptr = torch.arange(B + 1, dtype=torch.int32, device=dev) * K
        g = self.graph_prefill(inputs, backend, window_left) if graph else None
        w = g.wrapper if g is not None else self.prefill_wrapper(inputs, backend)
        w.plan(qo_indptr, pg.indptr, pg.indices, pg.last_page_len, c.num_q_heads, c.num_kv_heads, c.head_dim,
               c.page_size, causal=False, pos_encoding_mode="NONE", window_left=window_left,
               sm_scale=c.softmax_scale, q_data_type=q.dtype, kv_data_type=inputs.k_pool.dtype)
        name = c_prefill(backend)
        kv = (inputs.k_pool, inputs.v_pool)
        scales = kv_scale_kwargs(c)
        bufs = {} if g is None else {"out": g.out, "lse": g.lse}

        def call() -> tuple[torch.Tensor, torch.Tensor]:
            counters.record(name, rows=B * K)
            out, lse = w.run(q.reshape(B * K, Hq, D), kv, return_lse=True, **bufs, **scales)
            return out.view(B, K, Hq, D), lse.view(B, K, Hq)

        return call

    # -- eager entry points (one call each; subclasses and mutants override these) ------------------
    def append_block(self, inputs: Inputs) -> None:
        self.append_call(inputs, graph=False)()

    def decode(self, inputs: Inputs, rows: Sequence[int], lens: Sequence[int], *, window_left: int,
               tensor_cores: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """`decode_call(...)()` with the eager wrapper: `out [N, Hq, D]` and base-2 `lse [N, Hq]`."""
        return self.decode_call(inputs, rows, lens, window_left=window_left, tensor_cores=tensor_cores,
                                graph=False)()

    def prefill(self, inputs: Inputs, backend: str, *, window_left: int) -> tuple[torch.Tensor, torch.Tensor]:
        """`prefill_call(...)()` with the eager wrapper."""
        return self.prefill_call(inputs, backend, window_left=window_left, graph=False)()

    # The steps a `_build` strings together. Eager: the entry points above, called when the function
    # runs (exactly the order `run` always had: append, plan, run). Graph: planned now, device work later.
    def _append_step(self, inputs: Inputs, graph: bool) -> Callable[[], None]:
        return self.append_call(inputs, graph=True) if graph else (lambda: self.append_block(inputs))

    def _decode_step(self, inputs: Inputs, rows: Sequence[int], lens: Sequence[int], *, window_left: int,
                     tensor_cores: bool, graph: bool) -> Callable[[], tuple[torch.Tensor, torch.Tensor]]:
        if graph:
            return self.decode_call(inputs, rows, lens, window_left=window_left, tensor_cores=tensor_cores,
                                    graph=True)
        return lambda: self.decode(inputs, rows, lens, window_left=window_left, tensor_cores=tensor_cores)

    def _prefill_step(self, inputs: Inputs, backend: str, *, window_left: int, graph: bool
                      ) -> Callable[[], tuple[torch.Tensor, torch.Tensor]]:
        if graph:
            return self.prefill_call(inputs, backend, window_left=window_left, graph=True)
        return lambda: self.prefill(inputs, backend, window_left=window_left)

    def _prefill_sequence(self, inputs: Inputs, backend: str, *, window_left: int, graph: bool
                          ) -> Callable[[], LoweringResult]:
        """The context form: [append the block] + one paged prefill, as a zero-argument function."""
        append = self._append_step(inputs, graph)
        attend = self._prefill_step(inputs, backend, window_left=window_left, graph=graph)

        def call() -> LoweringResult:
            append()
            out, lse = attend()
            return LoweringResult(out=out, lse=lse)

        return call


def _nothing() -> None:
    return None
