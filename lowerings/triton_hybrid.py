"""`hybrid_paged`: one Triton kernel family reading the context from the paged pool and folding the
block's dense K/V suffix into the same softmax (seed 003, SEMANTICS.md 4.4).

Non-causal, unwindowed, NHD pool, power-of-two head dim and page size, bf16/fp16 or fp8 (e4m3) KV.
Small batches split the context across programs (partials + a merge kernel; the split count is a
runtime argument); large batches run a single pass. Natural-log LSE. The kernels themselves live in
`lowerings/_hybrid_kernel.py`.
"""

from __future__ import annotations

import torch

from lowerings import counters
from lowerings.protocol import BASE_E, LoweringResult
from oracle.case import Case
from oracle.inputs import Inputs

_POW2_D = (16, 32, 64, 128, 256)


def _is_pow2(n: int) -> bool:
    return n > 0 and (n & (n - 1)) == 0


class HybridPaged:
    name = "hybrid_paged"
    devices = ("cpu", "cuda")
    lse_base = BASE_E
    deterministic = True
    max_compiles = 2  # per family: the split kernel + its merge, or the single pass; never per batch size

    def compile_family(self, case: Case) -> tuple:
        return (case.dtype, case.kv_dtype, case.head_dim, case.page_size, case.block_size * case.group_size)

    def available(self, device: str) -> tuple[bool, str]:
        if device == "cuda" and not torch.cuda.is_available():
            return False, "no CUDA device visible to torch"
        from lowerings._triton_env import triton_available
        return triton_available()

    def supports(self, case: Case) -> str | None:
        if case.window != (-1, -1):
            return f"non-causal unwindowed layers only, got window={case.window}"
        if case.layout != "NHD":
            return f"reads an NHD pool only, got {case.layout}"
        if case.head_dim not in _POW2_D:
            return f"head_dim must be a power of two in {_POW2_D}, got {case.head_dim}"
        if not _is_pow2(case.page_size):
            return f"page_size must be a power of two, got {case.page_size}"
        return None

    def expected_calls(self, case: Case) -> dict[str, int]:
        from lowerings._hybrid_kernel import default_num_splits
        splits = default_num_splits(case.batch_size, case.num_kv_heads, case.max_pages_per_request * case.page_size)
        if splits > 1:
            return {"triton.hybrid_paged_split": 1, "triton.hybrid_paged_merge_splits": 1}
        return {"triton.hybrid_paged_single": 1}

    def run(self, inputs: Inputs) -> LoweringResult:
        from lowerings._hybrid_kernel import hybrid_paged_attention
        c = inputs.case
        launches: list[str] = []
        out, lse = hybrid_paged_attention(
            inputs.q, inputs.k_pool, inputs.v_pool, inputs.page_table, inputs.context_lens,
            inputs.k_block, inputs.v_block, scale=c.softmax_scale, k_scale=c.k_scale, v_scale=c.v_scale,
            launches=launches)
        for name in launches:
            counters.record(f"triton.{name}")
        return LoweringResult(out=out, lse=lse)
