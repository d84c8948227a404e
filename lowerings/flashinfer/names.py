"""Names the flashinfer adapters declare: counter names, CUDA kernel families, JIT modules.

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

JIT modules: `jit_module_name(kernel, case, window_left)`, one key per (kernel, dtype, kv dtype, head dim,
window on/off); `parity.exec.warmup` loads each once.
"""

from __future__ import annotations

from lowerings import counters
from oracle.case import Case

FP8 = "float8_e4m3fn"

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


def append_calls(case: Case) -> dict[str, int]:
    """The append's counted calls when the block is not in the pool yet (dense storage), else none."""
    return {C_BATCH_POS: 1, C_APPEND: 1} if case.block_storage == "dense" else {}


def append_kernels(case: Case) -> dict[str, str]:
    """The append's kernel families, as `append_calls`."""
    return {C_BATCH_POS: K_BATCH_POS, C_APPEND: K_APPEND} if case.block_storage == "dense" else {}


# ---- JIT modules -------------------------------------------------------------------------------------
M_PAGE = "flashinfer page (append_paged_kv_cache, get_batch_indices_positions)"
M_CASCADE = "flashinfer cascade (merge_state_in_place)"


def short_dtype(name: str) -> str:
    return {"bfloat16": "bf16", "float16": "fp16", FP8: "fp8"}.get(name, name)


def jit_module_name(kernel: str, case: Case, window_left: int) -> str:
    """The flashinfer JIT module a call loads, as one readable key: flashinfer builds one module per
    (kernel, q dtype, kv dtype, head dim, sliding window on/off); batch, lengths and pages never matter."""
    dt = short_dtype(case.dtype) + ("" if case.kv_dtype == case.dtype else f"/{short_dtype(case.kv_dtype)}")
    return f"flashinfer {kernel} {dt} D={case.head_dim} {'window' if window_left >= 0 else 'no-window'}"


def page_modules(case: Case) -> tuple[str, ...]:
    """The append's JIT module when the case appends the block (dense storage)."""
    return (M_PAGE,) if case.block_storage == "dense" else ()
