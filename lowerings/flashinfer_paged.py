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
from typing import Any, Sequence

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


# ---- the shared base ------------------------------------------------------------------------------
class FlashinferBase:
    """Workspace, wrapper cache and the flashinfer call sequences every adapter is made of."""

    devices: tuple[str, ...] = ("cuda",)
    lse_base: float = BASE_2
    deterministic: bool = True
    max_compiles: int | None = None
    name = "flashinfer-base"

    def __init__(self) -> None:
        self._workspace: torch.Tensor | None = None
        self._wrappers: dict[tuple, Any] = {}

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
        """Longer contexts on a GPU (flashinfer's split-KV paths start past a few hundred keys)."""
        if device == "cuda":
            from strategies import Limits
            # flashinfer JIT-compiles one module per (dtype, kv dtype, head dim, window on/off): 15-95 s
            # each. The lent H200's 30-minute budget covers bf16 at head dim 128; widen on a real runner.
            return Limits(max_context=2048, dtypes=("bfloat16",), kv_dtypes=("same",), head_dims=(128,))
        return None

    def kernel_families(self, case: Case) -> dict[str, str]:  # overridden
        return {}

    def forbidden_kernel_families(self, case: Case) -> dict[str, str]:  # overridden
        return {}

    # -- resources ----------------------------------------------------------------------------------
    def workspace(self, device: torch.device) -> torch.Tensor:
        """One zero-initialized 128 MiB float workspace per adapter instance, shared by its wrappers
        (their runs are sequential on one stream; each wrapper keeps its own int workspace)."""
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

    # -- call sequences -----------------------------------------------------------------------------
    def append_block(self, inputs: Inputs) -> None:
        """The production append: the block's K/V into the pool at positions `L_b .. L_b+K-1`
        (`get_batch_indices_positions` + `append_paged_kv_cache`); only when the pool lacks it."""
        c = inputs.case
        if c.block_storage != "dense":
            return
        from flashinfer.page import append_paged_kv_cache, get_batch_indices_positions

        B, K, Hkv, D = inputs.k_block.shape
        dev = inputs.device
        lens = [L + K for L in inputs.context_lens_host]
        pg = build_paging(inputs.page_table, range(B), lens, c.page_size, dev)
        append_indptr = torch.arange(B + 1, dtype=torch.int32, device=dev) * K
        seq_lens = torch.tensor(lens, dtype=torch.int32, device=dev)
        counters.record(C_BATCH_POS, tokens=B * K)
        batch_indices, positions = get_batch_indices_positions(append_indptr, seq_lens, B * K)
        k_app = to_pool_dtype(inputs.k_block.reshape(B * K, Hkv, D), inputs.k_pool.dtype, c.k_scale)
        v_app = to_pool_dtype(inputs.v_block.reshape(B * K, Hkv, D), inputs.v_pool.dtype, c.v_scale)
        counters.record(C_APPEND, tokens=B * K)
        append_paged_kv_cache(k_app, v_app, batch_indices, positions, (inputs.k_pool, inputs.v_pool),
                              pg.indices, pg.indptr, pg.last_page_len, kv_layout=c.layout)

    def decode(self, inputs: Inputs, rows: Sequence[int], lens: Sequence[int], *, window_left: int,
               tensor_cores: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """One batch-decode call: row `n` is the query `q.reshape(N, Hq, D)[n]` of request `rows[n]` over
        that request's first `lens[n]` keys. Returns `out [N, Hq, D]` and base-2 `lse [N, Hq]`."""
        c = inputs.case
        q = inputs.q
        Hq, D = q.shape[2], q.shape[3]
        N = len(rows)
        if q.shape[0] * q.shape[1] != N:
            raise ValueError(f"decode rows: {N} rows for a q of shape {tuple(q.shape)}")
        pg = build_paging(inputs.page_table, rows, lens, c.page_size, inputs.device)
        w = self.decode_wrapper(inputs, tensor_cores)
        w.plan(pg.indptr, pg.indices, pg.last_page_len, c.num_q_heads, c.num_kv_heads, c.head_dim, c.page_size,
               pos_encoding_mode="NONE", window_left=window_left, q_data_type=q.dtype,
               kv_data_type=inputs.k_pool.dtype, sm_scale=c.softmax_scale)
        counters.record(C_DECODE_TC if tensor_cores else C_DECODE, rows=N)
        out, lse = w.run(q.reshape(N, Hq, D), (inputs.k_pool, inputs.v_pool), return_lse=True,
                         **_kv_scale_kwargs(c))
        return out, lse

    def prefill(self, inputs: Inputs, backend: str, *, window_left: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One paged-prefill call: `K` queries per request (bottom-right aligned: query `i` at position
        `L+i`) over `L+K` keys, `causal=False`. Returns `out [B, K, Hq, D]`, base-2 `lse [B, K, Hq]`."""
        c = inputs.case
        q = inputs.q
        B, K, Hq, D = q.shape
        dev = inputs.device
        lens = [L + K for L in inputs.context_lens_host]
        pg = build_paging(inputs.page_table, range(B), lens, c.page_size, dev)
        qo_indptr = torch.arange(B + 1, dtype=torch.int32, device=dev) * K
        w = self.prefill_wrapper(inputs, backend)
        w.plan(qo_indptr, pg.indptr, pg.indices, pg.last_page_len, c.num_q_heads, c.num_kv_heads, c.head_dim,
               c.page_size, causal=False, pos_encoding_mode="NONE", window_left=window_left,
               sm_scale=c.softmax_scale, q_data_type=q.dtype, kv_data_type=inputs.k_pool.dtype)
        counters.record(c_prefill(backend), rows=B * K)
        out, lse = w.run(q.reshape(B * K, Hq, D), (inputs.k_pool, inputs.v_pool), return_lse=True,
                         **_kv_scale_kwargs(c))
        return out.view(B, K, Hq, D), lse.view(B, K, Hq)


# ---- context FMHA -----------------------------------------------------------------------------------
class FlashinferContext(FlashinferBase):
    """Context FMHA (SEMANTICS.md 4.1): one paged prefill, `K` queries per request over `L+K` keys,
    `causal=False`, `window_left=left`: an end-aligned left window only, exact iff `K-1 <= right`."""

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

    def run(self, inputs: Inputs) -> LoweringResult:
        self.append_block(inputs)
        out, lse = self.prefill(inputs, self.backend, window_left=inputs.case.window[0])
        return LoweringResult(out=out, lse=lse)


# ---- decode rows ------------------------------------------------------------------------------------
class FlashinferDecodeRows(FlashinferBase):
    """Decode rows (seed 002): `B*K` single-query rows, row `(b, i)` repeats request `b`'s pages with
    `seq_len = L_b + K`, when `B <= 32`; else the context form (fa2 paged prefill). Non-causal
    unwindowed layers only."""

    threshold = DECODE_ROWS_MAX_BATCH

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

    def run(self, inputs: Inputs) -> LoweringResult:
        c = inputs.case
        B, K, Hq, D = inputs.q.shape
        self.append_block(inputs)
        if not self.uses_rows(c):
            out, lse = self.prefill(inputs, "fa2", window_left=-1)
            return LoweringResult(out=out, lse=lse)
        rows = [b for b in range(B) for _ in range(K)]
        lens = [L + K for L in inputs.context_lens_host for _ in range(K)]
        out, lse = self.decode(inputs, rows, lens, window_left=-1, tensor_cores=self.tensor_cores)
        return LoweringResult(out=out.view(B, K, Hq, D), lse=lse.view(B, K, Hq))


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
    """

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
            return triton_available()
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

    def run(self, inputs: Inputs) -> LoweringResult:
        c = inputs.case
        left, right = c.window
        B, K, Hq, D = inputs.q.shape
        self.append_block(inputs)
        rows = [b for b in range(B) for _ in range(K)]
        lens = [L + i + 1 for L in inputs.context_lens_host for i in range(K)]
        o, l2 = self.decode(inputs, rows, lens, window_left=left, tensor_cores=False)
        o_a, lse_a = o.view(B, K, Hq, D), l2.view(B, K, Hq)
        partials = {"A": Partial(out=o_a, lse=lse_a, lse_base=BASE_2, window=(left, 0))}
        if not merges_future_block_keys(K, right):
            return LoweringResult(out=o_a, lse=lse_a, partials=partials)
        if self.form == "eager":
            out, lse, o_b, lse_b = merge_eager(inputs.q, inputs.k_block, inputs.v_block, o_a, lse_a,
                                               scale=c.softmax_scale, right=right, lse_a_base=BASE_2,
                                               return_part_b=True)
            partials["B"] = Partial(out=o_b, lse=lse_b, lse_base=BASE_E, window=(-1, -1),
                                    future_block_keys_right=right)
            return LoweringResult(out=out, lse=lse, partials=partials)
        if self.form != MERGE_STATE_FORM:
            out, lse = MERGE_FORMS[self.form](inputs.q, inputs.k_block, inputs.v_block, o_a, lse_a,
                                              scale=c.softmax_scale, right=right, lse_a_base=BASE_2)
            return LoweringResult(out=out, lse=lse, partials=partials)
        fi = _fi()
        o_b, lse_b = part_b(inputs.q, inputs.k_block, inputs.v_block, scale=c.softmax_scale, right=right)
        partials["B"] = Partial(out=o_b, lse=lse_b, lse_base=BASE_E, window=(-1, -1), future_block_keys_right=right)
        v = o_a.reshape(B * K, Hq, D).clone(memory_format=torch.contiguous_format)
        s = lse_a.reshape(B * K, Hq).to(torch.float32).clone(memory_format=torch.contiguous_format)
        v_other = o_b.to(o_a.dtype).reshape(B * K, Hq, D).contiguous()
        s_other = (lse_b.float() / LN2).reshape(B * K, Hq).contiguous()  # -inf stays -inf
        mask = (torch.arange(K, device=inputs.device) < K - 1).repeat(B).to(torch.uint8)  # row (b, i): i < K-1
        counters.record(C_MERGE_STATE, rows=B * K)
        fi.merge_state_in_place(v, s, v_other, s_other, mask=mask)
        return LoweringResult(out=v.view(B, K, Hq, D), lse=s.view(B, K, Hq), partials=partials)


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
