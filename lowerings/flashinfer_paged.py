"""flashinfer lowerings: the production call sequences of SEMANTICS.md section 4 through flashinfer's own
kernels (flashinfer-python 0.7.x; CUDA only).

Adapters (all `lse_base = 2.0`, `devices = ("cuda",)`, deterministic):

- `context[flashinfer-fa2]`, `context[flashinfer-fa3]`: [append the block] + ONE
  `BatchPrefillWithPagedKVCacheWrapper(backend=...)` call, `K` queries per request over `L+K` keys,
  `causal=False`, `window_left=left` (exact iff `K-1 <= right`).
- `decode_rows[flashinfer]` (CUDA-core decode kernel), `decode_rows[flashinfer-tc]` (tensor-core decode,
  i.e. flashinfer's fa2 prefill kernel behind the decode wrapper): seed 002's dispatch, `B*K`
  single-query decode rows over repeated page tables with `seq_len = L+K` when `B <= 32`, else the
  context form (fa2 paged prefill).
- `windowed_merge[flashinfer-eager|flashinfer-compiled|flashinfer-triton|flashinfer-merge_state]`:
  part A = CUDA-core decode rows anchored per query (`seq_len = L+i+1`, `window_left = left`), part B
  + merge by one of `lowerings.merges`' forms, or by `flashinfer.merge_state_in_place`.
- `trtllm_gen[decode]`, `trtllm_gen[context]`: flashinfer's trtllm-gen entry points. SM100/SM103 only;
  `available()` says so everywhere else and `run()` refuses to call them (off SM100 they route to xqa
  or stall on a cubin download). Best effort: never run on this project's H200.

flashinfer is imported lazily inside methods: this module imports on a CPU machine without it.

CUDA graphs: every adapter but trtllm-gen has `graph_safe = True` and `prepare(inputs)`, which does the
host-side steps once (paging, `plan()` of graph-mode wrappers, `use_cuda_graph=True`, built over fixed
`paged_kv_indptr/indices/last_page_len` buffers (decode) or `qo_indptr_buf`/`paged_kv_*_buf` (prefill),
the append's index buffers, the output buffers) and returns a zero-argument function doing the device
work only; `run(inputs)` is the same sequence with the eager wrappers, called at once. Graph-mode and
eager wrappers are cached apart (`_graph` and `_wrappers`). Re-planning: a later `prepare` with the same
shapes plans into the same fixed buffers, which a captured graph reads on replay (see `prepare`).
flashinfer's graph mode forces its split-KV paths (fa2 always, the decode unless the batch fills the
GPU), so a graph-mode call need not give the eager `run`'s bits; it gives its own on every replay.
What a replay reads, hence what `prepare` re-plans: the fixed index buffers, the schedule plan() writes
into the wrapper's int workspace (and fa3's kv-length / token-offset buffers), the append's
`append_indptr`/`seq_lens` buffers. What the capture bakes in, hence part of the arena key: the tensors'
addresses, batch size and query rows, heads, dtypes, `window_left`, the softmax and fp8 scales.

JIT modules: `jit_modules(case)` names the flashinfer modules (and compiled merges) a case loads, one
key per (kernel, dtype, kv dtype, head dim, window on/off); `parity.warmup` loads each once.

Counter names (`lowerings.counters.record`), one per flashinfer call:

- `flashinfer.get_batch_indices_positions`, `flashinfer.append_paged_kv_cache` (dense block storage);
- `flashinfer.BatchDecode.run` (CUDA-core), `flashinfer.BatchDecode[tc].run` (tensor cores);
- `flashinfer.BatchPrefill[fa2].run`, `flashinfer.BatchPrefill[fa3].run`;
- `flashinfer.merge_state_in_place`;
- `flashinfer.trtllm_batch_decode_with_kv_cache[trtllm-gen]`, `flashinfer.trtllm_batch_context_with_kv_cache`.

`kernel_families(case)` names substrings of the CUDA kernels each call must launch (as torch.profiler
lists them) and `forbidden_kernel_families(case)` those that must not appear (fa3 silently replaced by
fa2, CUDA-core decode replaced by the tensor-core path, ...). Sources (flashinfer main, 2025-26):

- `BatchDecodeWithPagedKVCacheKernel`: include/flashinfer/attention/decode.cuh (the `__global__` right
  after `BatchDecodeWithPagedKVCacheDevice`);
- `BatchPrefillWithPagedKVCacheKernel`: include/flashinfer/attention/prefill.cuh (fa2; also what the
  tensor-core decode launches);
- `PrefillWithKVCacheKernel`: include/flashinfer/attention/hopper/prefill_sm90.cuh (fa3; launched by
  `BatchPrefillWithPagedKVCacheKernelTraitsDispatched` with `SparseCollectiveMainloop`). The substring
  does not occur in the fa2 name `BatchPrefillWithPagedKVCacheKernel`;
- `AppendPagedKVCacheKernel`: include/flashinfer/page.cuh;
- `MergeStateInPlaceKernel`: include/flashinfer/attention/cascade.cuh;
- `get_batch_indices_positions_kernel`: flashinfer/triton/page.py (a Triton kernel).
Unqualified names match both demangled and mangled kernel names.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from lowerings import counters
from lowerings.merges import MERGE_FORMS, merge_eager, merges_future_block_keys, part_b
from lowerings.protocol import BASE_2, BASE_E, LoweringResult, Partial
from oracle.case import Case
from oracle.inputs import Inputs

LN2 = math.log(2.0)
DECODE_ROWS_MAX_BATCH = 32  # seed 002's dispatch threshold
# GQA groups the CUDA-core batch-decode kernel is instantiated for (DISPATCH_GQA_GROUP_SIZE; measured on
# flashinfer 0.7.2.post1): any other group raises inside plan().
CUDA_CORE_DECODE_GROUPS = (1, 2, 3, 4, 6, 8, 16)
HEAD_DIMS = (64, 128, 256)  # DISPATCH_HEAD_DIM of the decode / fa2 / fa3 kernels (64 and 128 measured)
WORKSPACE_BYTES = 128 * 1024 * 1024  # the float workspace flashinfer's examples allocate
FP8 = "float8_e4m3fn"
MERGE_STATE_FORM = "merge_state"
WINDOWED_MERGE_FORMS = ("eager", "compiled", "triton", MERGE_STATE_FORM)
TRTLLM_NEED = "trtllm-gen kernels need SM100/SM103 (Blackwell)"

# ---- counter names --------------------------------------------------------------------------------
C_BATCH_POS = "flashinfer.get_batch_indices_positions"
C_APPEND = "flashinfer.append_paged_kv_cache"
C_DECODE = "flashinfer.BatchDecode.run"
C_DECODE_TC = "flashinfer.BatchDecode[tc].run"
C_MERGE_STATE = "flashinfer.merge_state_in_place"
C_TRTLLM_DECODE = "flashinfer.trtllm_batch_decode_with_kv_cache[trtllm-gen]"
C_TRTLLM_CONTEXT = "flashinfer.trtllm_batch_context_with_kv_cache"


def c_prefill(backend: str) -> str:
    return f"flashinfer.BatchPrefill[{backend}].run"


# ---- kernel-name substrings (see the module docstring for where each is defined) ------------------
K_DECODE = "BatchDecodeWithPagedKVCacheKernel"
K_PREFILL_FA2 = "BatchPrefillWithPagedKVCacheKernel"
K_PREFILL_FA3 = "PrefillWithKVCacheKernel"
K_APPEND = "AppendPagedKVCacheKernel"
K_BATCH_POS = "get_batch_indices_positions_kernel"
K_MERGE_STATE = "MergeStateInPlaceKernel"
K_MERGE_TRITON = "_merge_future_block_keys_kernel"  # lowerings/_merge_kernel.py
K_TRTLLM = "fmhaSm10"  # trtllm-gen cubins are named fmhaSm100*/fmhaSm103*: unverified here (no SM100)

# The kernel family each call launches: a `[kernel."<family>".<dtype>]` tolerance entry applies to every
# case that made the call, whichever lowering made it (`counters.kernel_keys`).
for _call, _kernel in ((c_prefill("fa2"), K_PREFILL_FA2), (C_DECODE_TC, K_PREFILL_FA2), (C_DECODE, K_DECODE),
                       (c_prefill("fa3"), K_PREFILL_FA3), (C_MERGE_STATE, K_MERGE_STATE), (C_APPEND, K_APPEND),
                       (C_BATCH_POS, K_BATCH_POS), (C_TRTLLM_DECODE, K_TRTLLM), (C_TRTLLM_CONTEXT, K_TRTLLM)):
    counters.declare_kernel(_call, _kernel)


# ---- availability ---------------------------------------------------------------------------------
def flashinfer_status() -> tuple[bool, str]:
    """`(True, "flashinfer <version>")` when `import flashinfer` works, else `(False, why)`."""
    try:
        import flashinfer  # noqa: F401
    except Exception as exc:  # ImportError, or a broken install (missing CUDA libs) raising anything
        return False, f"flashinfer is not importable: {type(exc).__name__}: {exc}"
    return True, f"flashinfer {getattr(flashinfer, '__version__', '?')}"


def _device_desc() -> tuple[int, int, str]:
    major, minor = torch.cuda.get_device_capability()
    return major, minor, torch.cuda.get_device_name()


def _fi():
    import flashinfer

    return flashinfer


# ---- paging helpers (pure torch, testable on a CPU) -----------------------------------------------
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


def _kv_scale_kwargs(case: Case) -> dict[str, float]:
    """`k_scale`/`v_scale` for run(): flashinfer folds `k_scale` into `sm_scale` and multiplies the output
    by `v_scale` after the kernel. Passed only for fp8 pools (None otherwise: no extra work)."""
    if case.kv_dtype == FP8:
        return {"k_scale": float(case.k_scale), "v_scale": float(case.v_scale)}
    return {}


def _append_calls(case: Case) -> dict[str, int]:
    return {C_BATCH_POS: 1, C_APPEND: 1} if case.block_storage == "dense" else {}


def _append_kernels(case: Case) -> dict[str, str]:
    return {C_BATCH_POS: K_BATCH_POS, C_APPEND: K_APPEND} if case.block_storage == "dense" else {}


def _head_dim_reason(case: Case) -> str | None:
    if case.head_dim not in HEAD_DIMS:
        return f"flashinfer's kernels are instantiated for head_dim in {HEAD_DIMS}, got {case.head_dim}"
    return None


def _cuda_core_group_reason(case: Case) -> str | None:
    if case.group_size not in CUDA_CORE_DECODE_GROUPS:
        return (f"the CUDA-core batch-decode kernel dispatches GQA groups {CUDA_CORE_DECODE_GROUPS} only, got "
                f"G={case.group_size} ({case.num_q_heads}/{case.num_kv_heads} heads)")
    return None


# ---- CUDA-graph mode: fixed buffers -------------------------------------------------------------------
# flashinfer's wrappers are graph-safe only with `use_cuda_graph=True` and fixed index buffers given at
# construction: plan() then copies each new page table into those buffers (and writes its schedule into
# the wrapper's own int workspace at offsets that depend on the batch size only), and run() reads them.
# A captured graph therefore replays the latest plan() as long as the batch size, the number of query
# rows, the dtypes, the window and the pages' capacity stay those it was built for: they are the key of
# a graph arena below.
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


def _graph_wrapper(cls: Any, workspace: torch.Tensor, layout: str, buffers: dict[str, torch.Tensor],
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


def _short_dtype(name: str) -> str:
    return {"bfloat16": "bf16", "float16": "fp16", FP8: "fp8"}.get(name, name)


def jit_module_name(kernel: str, case: Case, window_left: int) -> str:
    """The flashinfer JIT module a call loads, as one readable key: flashinfer builds one module per
    (kernel, q dtype, kv dtype, head dim, sliding window on/off); batch, lengths and pages never matter."""
    dt = _short_dtype(case.dtype) + ("" if case.kv_dtype == case.dtype else f"/{_short_dtype(case.kv_dtype)}")
    return f"flashinfer {kernel} {dt} D={case.head_dim} {'window' if window_left >= 0 else 'no-window'}"


M_PAGE = "flashinfer page (append_paged_kv_cache, get_batch_indices_positions)"
M_CASCADE = "flashinfer cascade (merge_state_in_place)"


def _page_modules(case: Case) -> tuple[str, ...]:
    return (M_PAGE,) if case.block_storage == "dense" else ()


# ---- the shared base ------------------------------------------------------------------------------
class FlashinferBase:
    """Workspace, wrapper caches and the flashinfer call sequences every adapter is made of.

    Each call sequence is built in two halves: the host-side steps (paging, `plan()`, buffers), then a
    zero-argument function doing the device work only. `run(inputs)` builds it with the eager wrappers
    and calls it at once; `prepare(inputs)` builds it with graph-mode wrappers over fixed buffers and
    returns it, to be captured in a `torch.cuda.CUDAGraph` and replayed.
    """

    devices: tuple[str, ...] = ("cuda",)
    lse_base: float = BASE_2
    deterministic: bool = True
    max_compiles: int | None = None
    graph_safe: bool = False  # True: prepare() returns a function a CUDA graph may capture and replay
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
        15-165 s each: `--warm-up` / `python -m parity.warmup` load them first (40 for all adapters);
        narrow a short session with `--limit dtypes=bfloat16 --limit kv_dtypes=same --limit head_dims=128`."""
        if device == "cuda":
            from strategies import Limits
            return Limits(max_context=2048, head_dims=(64, 128))
        return None

    def kernel_families(self, case: Case) -> dict[str, str]:  # overridden
        return {}

    def forbidden_kernel_families(self, case: Case) -> dict[str, str]:  # overridden
        return {}

    def jit_modules(self, case: Case) -> tuple[str, ...]:  # overridden
        """The JIT-compiled modules `run` loads for `case` (`parity.warmup` warms each once)."""
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
            fi = _fi()
            w = fi.BatchDecodeWithPagedKVCacheWrapper(self.workspace(inputs.device), c.layout,
                                                      use_tensor_cores=bool(tensor_cores))
            self._wrappers[key] = w
        return w

    def prefill_wrapper(self, inputs: Inputs, backend: str):
        c = inputs.case
        key = ("prefill", c.layout, c.dtype, c.kv_dtype, c.head_dim, c.page_size, backend)
        w = self._wrappers.get(key)
        if w is None:
            fi = _fi()
            w = fi.BatchPrefillWithPagedKVCacheWrapper(self.workspace(inputs.device), c.layout, backend=backend)
            self._wrappers[key] = w
        return w

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
            w = _graph_wrapper(_fi().BatchDecodeWithPagedKVCacheWrapper, self.workspace(dev), c.layout,
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
            w = _graph_wrapper(_fi().BatchPrefillWithPagedKVCacheWrapper, self.workspace(dev), c.layout,
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
        scales = _kv_scale_kwargs(c)
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
        scales = _kv_scale_kwargs(c)
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


def _nothing() -> None:
    return None


# ---- context FMHA -----------------------------------------------------------------------------------
class FlashinferContext(FlashinferBase):
    """Context FMHA (SEMANTICS.md 4.1): one paged prefill, `K` queries per request over `L+K` keys,
    `causal=False`, `window_left=left`: an end-aligned left window only, exact iff `K-1 <= right`."""

    graph_safe = True

    def __init__(self, backend: str) -> None:
        super().__init__()
        if backend not in ("fa2", "fa3"):
            raise ValueError(f"backend: 'fa2' or 'fa3', got {backend!r}")
        self.backend = backend
        self.name = f"context[flashinfer-{backend}]"

    def available(self, device: str) -> tuple[bool, str]:
        ok, why = super().available(device)
        if not ok or self.backend != "fa3":
            return ok, why
        major, minor, gpu = _device_desc()
        if major != 9:
            return False, f"flashinfer's fa3 kernels need SM90 (Hopper); this GPU is sm_{major}{minor} ({gpu})"
        return ok, why

    def supports(self, case: Case) -> str | None:
        left, right = case.window
        if right != -1 and case.block_size - 1 > right:
            return (f"context FMHA expresses only an end-aligned left window; exact iff K-1 <= right, "
                    f"got K={case.block_size}, window={case.window}")
        why = _head_dim_reason(case)
        if why:
            return why
        if self.backend == "fa3" and case.kv_dtype == FP8:
            return (f"flashinfer's fa3 (SM90) prefill has no {case.dtype}-query x fp8-KV kernel (fa3 fp8 needs an "
                    f"fp8 query too; determine_attention_backend never picks fa3 for fp8 KV)")
        return None

    def expected_calls(self, case: Case) -> dict[str, int]:
        return {**_append_calls(case), c_prefill(self.backend): 1}

    def kernel_families(self, case: Case) -> dict[str, str]:
        k = K_PREFILL_FA3 if self.backend == "fa3" else K_PREFILL_FA2
        return {**_append_kernels(case), c_prefill(self.backend): k}

    def forbidden_kernel_families(self, case: Case) -> dict[str, str]:
        if self.backend == "fa3":
            return {"fa2 paged prefill (fa3 silently replaced by fa2)": K_PREFILL_FA2, "CUDA-core decode": K_DECODE}
        return {"fa3 prefill (not asked for)": K_PREFILL_FA3, "CUDA-core decode": K_DECODE}

    def jit_modules(self, case: Case) -> tuple[str, ...]:
        return (*_page_modules(case), jit_module_name(self.backend, case, case.window[0]))

    def _build(self, inputs: Inputs, graph: bool) -> Callable[[], LoweringResult]:
        append = self._append_step(inputs, graph)
        attend = self._prefill_step(inputs, self.backend, window_left=inputs.case.window[0], graph=graph)

        def call() -> LoweringResult:
            append()
            out, lse = attend()
            return LoweringResult(out=out, lse=lse)

        return call


# ---- decode rows ------------------------------------------------------------------------------------
class FlashinferDecodeRows(FlashinferBase):
    """Decode rows (seed 002): `B*K` single-query rows, row `(b, i)` repeats request `b`'s pages with
    `seq_len = L_b + K`, when `B <= 32`; else the context form (fa2 paged prefill). Non-causal
    unwindowed layers only."""

    threshold = DECODE_ROWS_MAX_BATCH
    graph_safe = True

    def __init__(self, tensor_cores: bool = False) -> None:
        super().__init__()
        self.tensor_cores = bool(tensor_cores)
        self.name = "decode_rows[flashinfer-tc]" if self.tensor_cores else "decode_rows[flashinfer]"

    def uses_rows(self, case: Case) -> bool:
        return case.batch_size <= self.threshold

    def supports(self, case: Case) -> str | None:
        if case.window != (-1, -1):
            return (f"decode rows all end at L+K: exact for non-causal unwindowed layers only, "
                    f"got window={case.window}")
        why = _head_dim_reason(case)
        if why:
            return why
        if not self.tensor_cores and self.uses_rows(case):
            why = _cuda_core_group_reason(case)
            if why:
                return f"{why}; B={case.batch_size} <= {self.threshold} takes the decode rows"
        return None

    def expected_calls(self, case: Case) -> dict[str, int]:
        if not self.uses_rows(case):
            return {**_append_calls(case), c_prefill("fa2"): 1}
        return {**_append_calls(case), (C_DECODE_TC if self.tensor_cores else C_DECODE): 1}

    def kernel_families(self, case: Case) -> dict[str, str]:
        if not self.uses_rows(case):
            return {**_append_kernels(case), c_prefill("fa2"): K_PREFILL_FA2}
        if self.tensor_cores:
            return {**_append_kernels(case), C_DECODE_TC: K_PREFILL_FA2}
        return {**_append_kernels(case), C_DECODE: K_DECODE}

    def forbidden_kernel_families(self, case: Case) -> dict[str, str]:
        if not self.uses_rows(case):
            return {"decode kernel (rows above the threshold)": K_DECODE, "fa3 prefill": K_PREFILL_FA3}
        if self.tensor_cores:
            return {"CUDA-core decode (tensor cores asked for)": K_DECODE, "fa3 prefill": K_PREFILL_FA3}
        return {"tensor-core decode / fa2 prefill (CUDA cores asked for)": K_PREFILL_FA2,
                "fa3 prefill": K_PREFILL_FA3}

    def jit_modules(self, case: Case) -> tuple[str, ...]:
        # The tensor-core decode runs flashinfer's fa2 prefill module (the same one context[fa2] loads).
        kernel = "fa2" if self.tensor_cores or not self.uses_rows(case) else "decode"
        return (*_page_modules(case), jit_module_name(kernel, case, -1))

    def _build(self, inputs: Inputs, graph: bool) -> Callable[[], LoweringResult]:
        c = inputs.case
        B, K, Hq, D = inputs.q.shape
        append = self._append_step(inputs, graph)
        if not self.uses_rows(c):
            attend = self._prefill_step(inputs, "fa2", window_left=-1, graph=graph)

            def call_prefill() -> LoweringResult:
                append()
                out, lse = attend()
                return LoweringResult(out=out, lse=lse)

            return call_prefill
        rows = [b for b in range(B) for _ in range(K)]
        lens = [L + K for L in inputs.context_lens_host for _ in range(K)]
        decode = self._decode_step(inputs, rows, lens, window_left=-1, tensor_cores=self.tensor_cores, graph=graph)

        def call() -> LoweringResult:
            append()
            out, lse = decode()
            return LoweringResult(out=out.view(B, K, Hq, D), lse=lse.view(B, K, Hq))

        return call


# ---- non-causal windowed = causal windowed decode + merge -----------------------------------------
class FlashinferWindowedMerge(FlashinferBase):
    """SEMANTICS.md 4.3 (seed 000): part A from CUDA-core decode rows anchored at each query
    (`seq_len = L+i+1`, `window_left = left`: keys `max(0, p_i - left) .. p_i`), part B over the later
    block keys, merged by one form. No merge where no block key follows a query (`K == 1` or
    `right == 0`): the output is part A exactly.

    `merge_state`: part B by `lowerings.merges.part_b` (fp32, natural LSE, -inf where empty), its LSE
    converted to base 2 and its output rounded to the working dtype, then
    `flashinfer.merge_state_in_place` on copies this adapter owns, with `mask` clearing the rows whose
    part B is empty (`i = K-1`): those rows are part A bit for bit (the kernel's -inf handling is not
    relied on; their `s_other` is -inf and `v_other` zero all the same).

    CUDA-graph safe in every form: the merges are device work only (no host sync, no host data); the
    compiled and Triton forms must have run once (compiled) before a capture.
    """

    graph_safe = True

    def __init__(self, form: str) -> None:
        super().__init__()
        if form not in WINDOWED_MERGE_FORMS:
            raise ValueError(f"form: one of {WINDOWED_MERGE_FORMS}, got {form!r}")
        self.form = form
        self.name = f"windowed_merge[flashinfer-{form}]"
        # compiled: one static graph, then one with a symbolic batch (as the torch WindowedMerge).
        self.max_compiles = {"compiled": 2, "triton": 1}.get(form)

    def available(self, device: str) -> tuple[bool, str]:
        ok, why = super().available(device)
        if ok and self.form == "triton":
            from lowerings._triton_env import triton_available
            return triton_available(device)
        return ok, why

    def supports(self, case: Case) -> str | None:
        return _head_dim_reason(case) or _cuda_core_group_reason(case)

    def merge_calls(self, case: Case) -> dict[str, int]:
        return {"eager": {"torch.merge_eager": 1}, "compiled": {"torch.compile[merge_unrolled]": 1},
                "triton": {"triton.merge_future_block_keys": 1},
                MERGE_STATE_FORM: {C_MERGE_STATE: 1}}[self.form]

    def expected_calls(self, case: Case) -> dict[str, int]:
        calls = {**_append_calls(case), C_DECODE: 1}
        if merges_future_block_keys(case.block_size, case.window[1]):
            calls.update(self.merge_calls(case))
        return calls

    def kernel_families(self, case: Case) -> dict[str, str]:
        fams = {**_append_kernels(case), C_DECODE: K_DECODE}
        if merges_future_block_keys(case.block_size, case.window[1]):
            if self.form == MERGE_STATE_FORM:
                fams[C_MERGE_STATE] = K_MERGE_STATE
            elif self.form == "triton":
                fams["triton.merge_future_block_keys"] = K_MERGE_TRITON
        return fams

    def forbidden_kernel_families(self, case: Case) -> dict[str, str]:
        return {"tensor-core decode / fa2 prefill (CUDA cores asked for)": K_PREFILL_FA2,
                "fa3 prefill": K_PREFILL_FA3}

    def jit_modules(self, case: Case) -> tuple[str, ...]:
        mods = [*_page_modules(case), jit_module_name("decode", case, case.window[0])]
        if merges_future_block_keys(case.block_size, case.window[1]):
            mods.append({"eager": "", "compiled": "torch.compile merge_unrolled (inductor)",
                         "triton": f"triton merge_future_block_keys D={case.head_dim}",
                         MERGE_STATE_FORM: M_CASCADE}[self.form])
        return tuple(m for m in mods if m)

    def _build(self, inputs: Inputs, graph: bool) -> Callable[[], LoweringResult]:
        c = inputs.case
        left, right = c.window
        B, K, Hq, D = inputs.q.shape
        q, k_block, v_block = inputs.q, inputs.k_block, inputs.v_block
        append = self._append_step(inputs, graph)
        rows = [b for b in range(B) for _ in range(K)]
        lens = [L + i + 1 for L in inputs.context_lens_host for i in range(K)]
        part_a = self._decode_step(inputs, rows, lens, window_left=left, tensor_cores=False, graph=graph)
        merges = merges_future_block_keys(K, right)
        form = self.form
        mask = None
        if merges and form == MERGE_STATE_FORM:
            mask = (torch.arange(K, device=inputs.device) < K - 1).repeat(B).to(torch.uint8)  # row (b, i): i < K-1
        # Graph mode: the merged result lands in fixed buffers, so each call returns the same tensors
        # (merge_state merges in place there; the other forms allocate, their result is copied there).
        fixed = self.graph_outputs(inputs, f"merge[{form}]") if graph and merges else None

        def call() -> LoweringResult:
            append()
            o, l2 = part_a()
            o_a, lse_a = o.view(B, K, Hq, D), l2.view(B, K, Hq)
            partials = {"A": Partial(out=o_a, lse=lse_a, lse_base=BASE_2, window=(left, 0))}
            if not merges:
                return LoweringResult(out=o_a, lse=lse_a, partials=partials)
            if form != MERGE_STATE_FORM:
                if form == "eager":
                    out, lse, o_b, lse_b = merge_eager(q, k_block, v_block, o_a, lse_a, scale=c.softmax_scale,
                                                       right=right, lse_a_base=BASE_2, return_part_b=True)
                    partials["B"] = Partial(out=o_b, lse=lse_b, lse_base=BASE_E, window=(-1, -1),
                                            future_block_keys_right=right)
                else:
                    out, lse = MERGE_FORMS[form](q, k_block, v_block, o_a, lse_a, scale=c.softmax_scale,
                                                 right=right, lse_a_base=BASE_2)
                if fixed is not None:
                    out, lse = fixed[0].copy_(out), fixed[1].copy_(lse)
                return LoweringResult(out=out, lse=lse, partials=partials)
            fi = _fi()
            o_b, lse_b = part_b(q, k_block, v_block, scale=c.softmax_scale, right=right)
            partials["B"] = Partial(out=o_b, lse=lse_b, lse_base=BASE_E, window=(-1, -1),
                                    future_block_keys_right=right)
            if fixed is not None:
                v = fixed[0].view(B * K, Hq, D).copy_(o_a.reshape(B * K, Hq, D))
                s = fixed[1].view(B * K, Hq).copy_(lse_a.reshape(B * K, Hq))
            else:
                v = o_a.reshape(B * K, Hq, D).clone(memory_format=torch.contiguous_format)
                s = lse_a.reshape(B * K, Hq).to(torch.float32).clone(memory_format=torch.contiguous_format)
            v_other = o_b.to(o_a.dtype).reshape(B * K, Hq, D).contiguous()
            s_other = (lse_b.float() / LN2).reshape(B * K, Hq).contiguous()  # -inf stays -inf
            counters.record(C_MERGE_STATE, rows=B * K)
            fi.merge_state_in_place(v, s, v_other, s_other, mask=mask)
            return LoweringResult(out=v.view(B, K, Hq, D), lse=s.view(B, K, Hq), partials=partials)

        return call


# ---- trtllm-gen (SM100/SM103 only) --------------------------------------------------------------------
class TrtllmGen(FlashinferBase):
    """flashinfer's trtllm-gen entry points, as TensorRT-LLM's DFlash drafter calls them (seed 002):
    `decode`: `B*K` single-query decode rows over repeated page tables, `seq_len = L+K`
    (`flashinfer.decode.trtllm_batch_decode_with_kv_cache(backend="trtllm-gen")`); `context`: one
    non-causal `flashinfer.prefill.trtllm_batch_context_with_kv_cache` call. Non-causal unwindowed only.

    Never called off SM100/SM103: there `trtllm_batch_decode_with_kv_cache` routes to xqa (which has no
    LSE) and the trtllm-gen cubins stall ~50 s on a download before failing. UNTESTED in this project
    (no Blackwell GPU): the LSE base (2, as SEMANTICS.md states for trtllm-gen) and the argument names
    are taken from flashinfer's source and checked with `inspect.signature` before the call.
    """

    def __init__(self, kind: str) -> None:
        super().__init__()
        if kind not in ("decode", "context"):
            raise ValueError(f"kind: 'decode' or 'context', got {kind!r}")
        self.kind = kind
        self.name = f"trtllm_gen[{kind}]"

    def available(self, device: str) -> tuple[bool, str]:
        if device != "cuda":
            return False, f"{self.name} runs on cuda only, not {device} ({TRTLLM_NEED})"
        if not torch.cuda.is_available():
            return False, f"no CUDA device visible to torch ({TRTLLM_NEED})"
        major, minor, gpu = _device_desc()
        if (major, minor) not in ((10, 0), (10, 3)):
            return False, f"{TRTLLM_NEED}; this GPU is sm_{major}{minor} ({gpu})"
        return flashinfer_status()

    def supports(self, case: Case) -> str | None:
        if case.window != (-1, -1):
            return f"{self.name}: non-causal unwindowed layers only (as TensorRT-LLM uses it), got window={case.window}"
        return _head_dim_reason(case)

    def expected_calls(self, case: Case) -> dict[str, int]:
        return {**_append_calls(case), (C_TRTLLM_DECODE if self.kind == "decode" else C_TRTLLM_CONTEXT): 1}

    def kernel_families(self, case: Case) -> dict[str, str]:
        return {**_append_kernels(case), (C_TRTLLM_DECODE if self.kind == "decode" else C_TRTLLM_CONTEXT): K_TRTLLM}

    def forbidden_kernel_families(self, case: Case) -> dict[str, str]:
        return {"flashinfer CUDA-core decode": K_DECODE, "flashinfer fa2 prefill": K_PREFILL_FA2}

    def jit_modules(self, case: Case) -> tuple[str, ...]:
        return (*_page_modules(case), f"flashinfer trtllm-gen fmha ({self.kind})")

    def prepare(self, inputs: Inputs) -> Callable[[], LoweringResult]:
        raise NotImplementedError(f"{self.name}: prepare() for CUDA graphs is not supported (trtllm-gen's seq_lens, "
                                  f"block tables and max lengths are built per call here, and it is untested)")

    def _guard(self) -> None:
        ok, why = self.available("cuda")
        major = torch.cuda.get_device_capability()[0] if torch.cuda.is_available() else None
        if not ok or major != 10:
            raise RuntimeError(f"{self.name} refuses to call trtllm-gen here: {why}")

    def run(self, inputs: Inputs) -> LoweringResult:
        self._guard()
        import importlib

        c = inputs.case
        B, K, Hq, D = inputs.q.shape
        dev = inputs.device
        self.append_block(inputs)
        bmm1 = c.softmax_scale * (c.k_scale if c.kv_dtype == FP8 else 1.0)
        bmm2 = c.v_scale if c.kv_dtype == FP8 else 1.0
        table = inputs.page_table.to(torch.int32).contiguous()
        kv = (inputs.k_pool, inputs.v_pool)
        ws = self.workspace(dev)
        if self.kind == "decode":
            fn = importlib.import_module("flashinfer.decode").trtllm_batch_decode_with_kv_cache
            params = inspect.signature(fn).parameters
            if "return_lse" not in params:
                raise NotImplementedError("this flashinfer's trtllm_batch_decode_with_kv_cache has no return_lse")
            seq = [L + K for L in inputs.context_lens_host for _ in range(K)]
            counters.record(C_TRTLLM_DECODE, rows=B * K)
            res = fn(query=inputs.q.reshape(B * K, Hq, D), kv_cache=kv, workspace_buffer=ws,
                     block_tables=table.repeat_interleave(K, dim=0).contiguous(),
                     seq_lens=torch.tensor(seq, dtype=torch.int32, device=dev), max_seq_len=max(seq),
                     bmm1_scale=bmm1, bmm2_scale=bmm2, window_left=-1, kv_layout=c.layout,
                     backend="trtllm-gen", return_lse=True)
        else:
            fn = importlib.import_module("flashinfer.prefill").trtllm_batch_context_with_kv_cache
            params = inspect.signature(fn).parameters
            if "is_causal" not in params:
                raise NotImplementedError("this flashinfer's trtllm_batch_context_with_kv_cache has no is_causal "
                                          "argument: it would apply a causal mask")
            lens = [L + K for L in inputs.context_lens_host]
            cum_kv = torch.zeros(B + 1, dtype=torch.int32)
            cum_kv[1:] = torch.cumsum(torch.tensor(lens, dtype=torch.int64), 0).to(torch.int32)
            extra: dict[str, Any] = {"is_causal": False, "window_left": -1, "kv_layout": c.layout}
            if "return_lse" in params:
                extra["return_lse"] = True
            counters.record(C_TRTLLM_CONTEXT, rows=B * K)
            res = fn(inputs.q.reshape(B * K, Hq, D), kv, ws, table,
                     torch.tensor(lens, dtype=torch.int32, device=dev), K, max(lens), bmm1, bmm2, B,
                     torch.arange(B + 1, dtype=torch.int32, device=dev) * K, cum_kv.to(dev), **extra)
        out, lse = (res if isinstance(res, tuple) else (res, None))
        out = out.view(B, K, Hq, D)
        return LoweringResult(out=out, lse=None if lse is None else lse.reshape(B, K, Hq))


# ---- registration -----------------------------------------------------------------------------------
def adapters() -> list[FlashinferBase]:
    """Fresh instances of every flashinfer adapter, in registration order."""
    return ([FlashinferContext("fa2"), FlashinferContext("fa3"), FlashinferDecodeRows(False),
             FlashinferDecodeRows(True)]
            + [FlashinferWindowedMerge(f) for f in WINDOWED_MERGE_FORMS]
            + [TrtllmGen("decode"), TrtllmGen("context")])


ADAPTER_NAMES = tuple(a.name for a in adapters())


def register_all(*, replace: bool = False) -> list[str]:
    """Register every flashinfer adapter (idempotent: names already registered are kept unless
    `replace`). Returns the names registered by this call. Imports no flashinfer."""
    from lowerings.registry import _REGISTRY, register

    added = []
    for a in adapters():
        if a.name in _REGISTRY and not replace:
            continue
        register(a, replace=replace)
        added.append(a.name)
    return added
