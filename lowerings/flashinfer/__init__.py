"""flashinfer lowerings: the production call sequences of docs/semantics.md section 4 through flashinfer's
own kernels (flashinfer-python 0.7.x; CUDA only). flashinfer is imported lazily inside methods: this
package imports on a CPU machine without it.

Adapters (all `lse_base = 2.0`, `devices = ("cuda",)`, deterministic), one module per family:

- `context`: `context[flashinfer-fa2]`, `context[flashinfer-fa3]`: [append the block] + ONE
  `BatchPrefillWithPagedKVCacheWrapper(backend=...)` call, `K` queries per request over `L+K` keys,
  `causal=False`, `window_left=left` (exact iff `K-1 <= right`).
- `decode_rows`: `decode_rows[flashinfer]` (CUDA-core decode kernel), `decode_rows[flashinfer-tc]`
  (tensor-core decode, i.e. flashinfer's fa2 prefill kernel behind the decode wrapper): seed 002's
  dispatch, `B*K` single-query decode rows over repeated page tables with `seq_len = L+K` when `B <= 32`,
  else the context form (fa2 paged prefill).
- `windowed_merge`: `windowed_merge[flashinfer-eager|flashinfer-compiled|flashinfer-triton|flashinfer-merge_state]`:
  part A = CUDA-core decode rows anchored per query (`seq_len = L+i+1`, `window_left = left`), part B
  + merge by one of `lowerings.merges`' forms, or by `flashinfer.merge_state_in_place`.
- `trtllm`: `trtllm_gen[decode]`, `trtllm_gen[context]`: flashinfer's trtllm-gen entry points. SM100/SM103
  only; `available()` says so everywhere else and `run()` refuses to call them.

What they share: `base` (workspace, wrapper caches, the append / decode / prefill call sequences),
`graphs` (CUDA-graph mode: fixed buffers per arena key), `paging` (CSR page tables, fp8 quantization of
the appended block, `k_scale`/`v_scale`), `names` (counter names, kernel families, JIT-module keys),
`library` (the lazy import, availability, what flashinfer instantiates).

CUDA graphs: every adapter but trtllm-gen has `graph_safe = True` and `prepare(inputs)`, which does the
host-side steps once and returns a zero-argument function doing the device work only; `run(inputs)` is
the same sequence with the eager wrappers, called at once (`FlashinferBase.prepare`, `graphs`).

JIT modules: `jit_modules(case)` names the flashinfer modules (and compiled merges) a case loads, one
key per (kernel, dtype, kv dtype, head dim, window on/off); `parity.exec.warmup` loads each once.

Registration: `lowerings.builtins` lists `adapters()` with the other built-ins; nothing here registers.
"""

from __future__ import annotations

from lowerings.flashinfer.base import WORKSPACE_BYTES, FlashinferBase
from lowerings.flashinfer.context import FlashinferContext
from lowerings.flashinfer.decode_rows import FlashinferDecodeRows
from lowerings.flashinfer.graphs import GraphAppend, GraphPaged, graph_wrapper
from lowerings.flashinfer.library import CUDA_CORE_DECODE_GROUPS, HEAD_DIMS, flashinfer_module, flashinfer_status
from lowerings.flashinfer.names import (C_APPEND, C_BATCH_POS, C_DECODE, C_DECODE_TC, C_MERGE_STATE, C_TRTLLM_CONTEXT,
                                        C_TRTLLM_DECODE, FP8, K_APPEND, K_BATCH_POS, K_DECODE, K_MERGE_STATE,
                                        K_MERGE_TRITON, K_PREFILL_FA2, K_PREFILL_FA3, K_TRTLLM, M_CASCADE, M_PAGE,
                                        c_prefill, jit_module_name)
from lowerings.flashinfer.paging import Paging, build_paging, kv_scale_kwargs, to_pool_dtype
from lowerings.flashinfer.trtllm import TRTLLM_NEED, TrtllmGen
from lowerings.flashinfer.windowed_merge import MERGE_STATE_FORM, WINDOWED_MERGE_FORMS, FlashinferWindowedMerge
from oracle.rules import DECODE_ROWS_MAX_BATCH


def adapters() -> list[FlashinferBase]:
    """Fresh instances of every flashinfer adapter, in registration order."""
    return ([FlashinferContext("fa2"), FlashinferContext("fa3"), FlashinferDecodeRows(False),
             FlashinferDecodeRows(True)]
            + [FlashinferWindowedMerge(f) for f in WINDOWED_MERGE_FORMS]
            + [TrtllmGen("decode"), TrtllmGen("context")])


ADAPTER_NAMES = tuple(a.name for a in adapters())

__all__ = [
    "ADAPTER_NAMES", "CUDA_CORE_DECODE_GROUPS", "C_APPEND", "C_BATCH_POS", "C_DECODE", "C_DECODE_TC", "C_MERGE_STATE",
    "C_TRTLLM_CONTEXT", "C_TRTLLM_DECODE", "DECODE_ROWS_MAX_BATCH", "FP8", "FlashinferBase", "FlashinferContext",
    "FlashinferDecodeRows", "FlashinferWindowedMerge", "GraphAppend", "GraphPaged", "HEAD_DIMS", "K_APPEND",
    "K_BATCH_POS", "K_DECODE", "K_MERGE_STATE", "K_MERGE_TRITON", "K_PREFILL_FA2", "K_PREFILL_FA3", "K_TRTLLM",
    "MERGE_STATE_FORM", "M_CASCADE", "M_PAGE", "Paging", "TRTLLM_NEED", "TrtllmGen", "WINDOWED_MERGE_FORMS",
    "WORKSPACE_BYTES", "adapters", "build_paging", "c_prefill", "flashinfer_module", "flashinfer_status",
    "graph_wrapper", "jit_module_name", "kv_scale_kwargs", "to_pool_dtype",
]
