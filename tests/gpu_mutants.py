"""GPU mutants: each one realistic bug (BUGS.md), run on a CUDA GPU only. The flashinfer adapters' mutants,
and a lowering that returns before the work it launched on a side stream is done (`tests/gpu_mutants_plugin.py`
registers them all for a `check --plugin` run and the stream sanitizer's replay)."""

from __future__ import annotations

import math

import torch

from lowerings import flashinfer_paged as fp
from lowerings.protocol import BASE_2, LoweringResult, Partial
from lowerings.merges import merges_future_block_keys
from lowerings.torch_emulation import Context


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


class ReturnsBeforeSideStream(Context):
    """BUGS 19 (a race): the context FMHA launched on a side stream (clear the outputs, then compute and
    copy), and `run` returns without making the caller's stream wait for it. The caller's first read
    races the side stream: on every other call a 25 ms spin (`torch.cuda._sleep`) before the work makes
    the read land first (zeros, an LSE of -inf); otherwise the work usually wins. Identical runs differ;
    the stream sanitizer flags the caller's read of a tensor the side stream wrote without a sync."""

    name = "gpu-mutant:returns_before_side_stream"
    devices = ("cuda",)
    SPIN_CYCLES = 50_000_000

    def __init__(self) -> None:
        super().__init__()
        self.side: torch.cuda.Stream | None = None
        self.calls = 0

    def run(self, inputs):
        main = torch.cuda.current_stream(inputs.device)
        if self.side is None:
            self.side = torch.cuda.Stream(device=inputs.device)
        out = torch.empty_like(inputs.q)
        lse = torch.empty(inputs.q.shape[:3], dtype=torch.float32, device=inputs.device)
        self.side.wait_stream(main)  # the inputs are ready
        self.calls += 1
        with torch.cuda.stream(self.side):
            out.zero_()
            lse.fill_(float("-inf"))
            if self.calls % 3 == 0:
                torch.cuda._sleep(self.SPIN_CYCLES)
            res = super().run(inputs)
            out.copy_(res.out)
            lse.copy_(res.lse)
        # BUG: no `main.wait_stream(self.side)` (nor `out.record_stream(self.side)`) before returning
        return LoweringResult(out=out, lse=lse)


GPU_MUTANTS = {
    "merge_state_natural_lse": (MergeStateNaturalLse, "LSE"),
    "part_a_block_end": (PartAAnchoredAtBlockEnd, "partial A"),
    "workspace_b_rows": (WorkspaceForBRows, "raised"),
    "fa3_silently_fa2": (Fa3SilentlyFa2, "silent fallback, fa2 paged prefill (fa3 silently replaced by fa2) ran"),
}
