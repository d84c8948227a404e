"""GPU mutants of the flashinfer lowerings: each one realistic bug of BUGS.md, run on a CUDA GPU only."""

from __future__ import annotations

import math

import torch

from lowerings import flashinfer_paged as fp
from lowerings.protocol import BASE_2, LoweringResult, Partial
from lowerings.merges import merges_future_block_keys


class MergeStateNaturalLse(fp.FlashinferWindowedMerge):
    """BUGS 2: part B's natural-log LSE handed to merge_state_in_place, which takes base 2."""

    def __init__(self) -> None:
        super().__init__("merge_state")
        self.name = "gpu-mutant:merge_state_natural_lse"

    def run(self, inputs):
        orig = fp.LN2
        fp.LN2 = 1.0  # the bug: no conversion of part B's LSE to base 2
        try:
            return super().run(inputs)
        finally:
            fp.LN2 = orig


class PartAAnchoredAtBlockEnd(fp.FlashinferWindowedMerge):
    """BUGS 1: every part-A decode row anchored at the block end (seq_len = L+K) for a windowed layer."""

    def __init__(self) -> None:
        super().__init__("eager")
        self.name = "gpu-mutant:part_a_block_end"

    def decode(self, inputs, rows, lens, *, window_left, tensor_cores):
        K = inputs.case.block_size
        lens = [inputs.context_lens_host[b] + K for b in rows]  # the bug
        return super().decode(inputs, rows, lens, window_left=window_left, tensor_cores=tensor_cores)


class WorkspaceForBRows(fp.FlashinferDecodeRows):
    """BUGS 3: the decode workspace sized for B rows instead of B*K (split-KV partials need more)."""

    def __init__(self) -> None:
        super().__init__(tensor_cores=False)
        self.name = "gpu-mutant:workspace_b_rows"

    def decode_wrapper(self, inputs, tensor_cores):
        c = inputs.case
        fi = fp._fi()
        rows = c.batch_size  # the bug: B, not B*K
        size = rows * c.num_q_heads * (c.head_dim * 4 + 4) * 2 + (1 << 16)
        return fi.BatchDecodeWithPagedKVCacheWrapper(torch.zeros(size, dtype=torch.uint8, device=inputs.device),
                                                     c.layout, use_tensor_cores=False)


class Fa3SilentlyFa2(fp.FlashinferContext):
    """BUGS 17: asks for fa3, runs fa2, and its Python-level counter still says fa3."""

    def __init__(self) -> None:
        super().__init__("fa3")
        self.name = "gpu-mutant:fa3_silently_fa2"

    def prefill_wrapper(self, inputs, backend):
        return super().prefill_wrapper(inputs, "fa2")  # the bug: the backend switch nobody sees


GPU_MUTANTS = {
    "merge_state_natural_lse": (MergeStateNaturalLse, "LSE"),
    "part_a_block_end": (PartAAnchoredAtBlockEnd, "partial A"),
    "workspace_b_rows": (WorkspaceForBRows, "raised"),
    "fa3_silently_fa2": (Fa3SilentlyFa2, "silent fallback, fa2 paged prefill (fa3 silently replaced by fa2) ran"),
}
