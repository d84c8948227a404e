"""`hybrid_paged`: one Triton kernel family reading the context from the paged pool and folding the
block's dense K/V suffix into the same softmax (seed 003, docs/semantics.md 4.4).

Non-causal, unwindowed, NHD pool, power-of-two head dim and page size, bf16/fp16 or fp8 (e4m3) KV.
Small batches split the context across programs (partials + a merge kernel; the split count is a
runtime argument); large batches run a single pass. Natural-log LSE. The kernels themselves live in
`lowerings/_hybrid_kernel.py`.
"""

from __future__ import annotations

from typing import Callable

import torch

from lowerings import counters
from lowerings.limits import Limits
from lowerings.protocol import BASE_E, LoweringResult
from oracle.case import Case
from oracle.inputs import Inputs

_POW2_D = (16, 32, 64, 128, 256)


def _is_pow2(n: int) -> bool:
    return n > 0 and (n & (n - 1)) == 0


class HybridPaged:
    devices = ("cpu", "cuda")
    lse_base = BASE_E
    deterministic = True
    # Compilations per shape family (compile_family): the single-pass kernel, plus the split kernel and
    # its merge when the split plan takes the split-KV path for longer contexts: 3 with the production
    # plan, 2 with a fixed split count. Never one per batch size, length or split count. (A 500-case GPU
    # sweep saw 3 in a family under an old bound of 2 for both.)
    max_compiles = 3
    writes_given_output = True  # the launcher writes into out=/lse_out= (the runner poisons and guards them)
    supports_by_shape = True  # supports() reads shape fields only (lowerings.protocol.OptionalHooks)

    def __init__(self, num_splits: int | None = None) -> None:
        """`num_splits=None`: the production split plan. A fixed count (`hybrid_paged[splits=4]`) forces
        the split-KV path on any shape, so the CPU suite reaches empty splits (more splits than tiles)."""
        if num_splits is not None and (not isinstance(num_splits, int) or num_splits < 2):
            raise ValueError(f"num_splits: None or an integer >= 2, got {num_splits!r}")
        self.num_splits = num_splits
        if num_splits is not None:
            self.max_compiles = 2  # the split-KV path only
        self.name = "hybrid_paged" if num_splits is None else f"hybrid_paged[splits={num_splits}]"

    def case_limits(self, device: str):
        """Under the CPU interpreter a program costs 10-20 ms per loop iteration: small shapes there."""
        if device == "cuda":
            return Limits(max_batch=64, max_context=4096, max_kv_heads=4, max_group=8, max_block=16)
        return Limits(max_batch=3, max_context=140, max_kv_heads=2, max_group=5, max_block=8, head_dims=(64,),
                      max_production_context=0)

    def compile_family(self, case: Case) -> tuple:
        """What a deployed drafter fixes: dtypes, head dim, page size, K and the head counts (Triton
        specializes on `Hkv == 1` and `G == 1`, so two models with the same K*G are two families, as
        measured on a GPU). Batch, lengths, page table and split count must never
        compile anything new (the kernels' DO_NOT_SPECIALIZE). The page table's dtype is part of the
        family: an int64 table is another kernel signature (`pt_ptr`'s element type), which a serving stack
        fixes once; without it a GPU's default check counted 3 compiles in one family
        of `hybrid_paged[splits=4]` (split kernel for int32 and int64 tables, plus the merge)."""
        return (case.dtype, case.kv_dtype, case.head_dim, case.page_size, case.block_size, case.num_q_heads,
                case.num_kv_heads, case.page_table_dtype)

    def available(self, device: str) -> tuple[bool, str]:
        if device == "cuda" and not torch.cuda.is_available():
            return False, "no CUDA device visible to torch"
        from lowerings._triton_env import triton_available
        return triton_available(device)

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
        from lowerings._hybrid_kernel import planned_launches
        device = torch.device("cuda") if torch.cuda.is_available() else None
        names = planned_launches(case.batch_size, case.block_size, case.num_q_heads, case.num_kv_heads, case.head_dim,
                                 max(1, case.max_pages_per_request) * case.page_size, device=device,
                                 num_splits=self.num_splits)
        return {f"triton.{n}": 1 for n in names}

    def split_boundaries(self, case: Case) -> tuple[tuple[int, ...], ...]:
        """Per request: the first key of each context split after the first (the split-KV path:
        `lowerings._hybrid_kernel.split_starts`, the split count planned as `run` plans it), and the first
        block key `L_b` (the dense block: folded in by the merge kernel, or after the context tiles)."""
        from lowerings import _hybrid_kernel as hk
        device = torch.device("cuda") if torch.cuda.is_available() else None
        splits = self.num_splits or hk.plan_num_splits(
            case.batch_size, case.block_size, case.num_q_heads, case.num_kv_heads, case.head_dim,
            max(1, case.max_pages_per_request) * case.page_size, device=device)
        starts = (lambda L: hk.split_starts(L, splits, case.block_size, case.group_size, case.head_dim)
                  if splits > 1 else [])
        return tuple((*starts(L), L) if L else () for L in case.context_lens)

    def kernel_families(self, case: Case) -> dict[str, str]:
        """CUDA kernel names (torch.profiler) the planned path must launch; the other path's are forbidden."""
        names = {"triton.hybrid_paged_single": "_hybrid_single_kernel", "triton.hybrid_paged_split": "_hybrid_split_kernel",
                 "triton.hybrid_paged_merge_splits": "_hybrid_merge_splits_kernel"}
        return {k: names[k] for k in self.expected_calls(case)}

    def forbidden_kernel_families(self, case: Case) -> dict[str, str]:
        expected = self.kernel_families(case)
        if "triton.hybrid_paged_single" in expected:
            return {"the split path (single pass planned)": "_hybrid_split_kernel"}
        return {"the single pass (split path planned)": "_hybrid_single_kernel"}

    def poisoned_workspace(self, inputs: Inputs):
        """The split-KV partials buffer, NaN-filled before every call: a split that leaves its slot
        unwritten (an empty split skipping its store) then shows as NaN instead of passing on whatever
        stale bytes a reused buffer happened to hold."""
        from lowerings import _hybrid_kernel as hk
        c = inputs.case
        max_ctx = max(1, inputs.page_table.shape[1]) * c.page_size
        splits = self.num_splits or hk.plan_num_splits(c.batch_size, c.block_size, c.num_q_heads, c.num_kv_heads,
                                                       c.head_dim, max_ctx, device=inputs.device)
        if splits <= 1:
            return None
        ws = hk.HybridWorkspace.allocate(c.batch_size, c.num_kv_heads, splits,
                                         hk.padded_rows(c.block_size, c.group_size), c.head_dim, inputs.device)
        for t in (ws.acc, ws.m, ws.l):
            t.fill_(float("nan"))
        return ws

    def prepare(self, inputs: Inputs) -> Callable[[], LoweringResult]:
        """Host work once (the split plan, the split-KV workspace, the output buffers: `inputs.out` and
        `inputs.lse_out` when given); the returned function only launches the kernels, on the same
        buffers every call (CUDA-graph capturable: the context lengths are read on the device). Each call
        of `prepare` allocates its own workspace and outputs. No counters: `run` is what `check` counts."""
        from lowerings import _hybrid_kernel as hk
        c = inputs.case
        B, K, Hq, D = (int(x) for x in inputs.q.shape)
        dev = inputs.device
        max_ctx = max(1, inputs.page_table.shape[1]) * c.page_size
        splits = self.num_splits or hk.plan_num_splits(B, K, Hq, c.num_kv_heads, D, max_ctx, device=dev)
        ws = (hk.HybridWorkspace.allocate(B, c.num_kv_heads, splits, hk.padded_rows(K, c.group_size), D, dev)
              if splits > 1 else None)
        out = inputs.out if inputs.out is not None else torch.empty((B, K, Hq, D), dtype=inputs.q.dtype, device=dev)
        lse = inputs.lse_out if inputs.lse_out is not None else torch.empty((B, K, Hq), dtype=torch.float32, device=dev)
        args = (inputs.q, inputs.k_pool, inputs.v_pool, inputs.page_table, inputs.context_lens, inputs.k_block,
                inputs.v_block)
        kwargs = dict(scale=c.softmax_scale, k_scale=c.k_scale, v_scale=c.v_scale, out=out, lse_out=lse,
                      workspace=ws, num_splits=splits)

        def launch() -> LoweringResult:
            hk.hybrid_paged_attention(*args, **kwargs)
            return LoweringResult(out=out, lse=lse)

        return launch

    def run(self, inputs: Inputs) -> LoweringResult:
        from lowerings import _hybrid_kernel as hk
        c = inputs.case
        launches: list[str] = []
        with counters.count_triton_compiles("triton.hybrid_paged", *hk.KERNELS):
            out, lse = hk.hybrid_paged_attention(
                inputs.q, inputs.k_pool, inputs.v_pool, inputs.page_table, inputs.context_lens,
                inputs.k_block, inputs.v_block, scale=c.softmax_scale, k_scale=c.k_scale, v_scale=c.v_scale,
                out=inputs.out, lse_out=inputs.lse_out, workspace=self.poisoned_workspace(inputs),
                num_splits=self.num_splits, launches=launches)
        for name in launches:
            counters.record(f"triton.{name}")
        return LoweringResult(out=out, lse=lse)
