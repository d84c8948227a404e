"""GPU mutants: each one realistic bug (docs/bugs.md), run on a CUDA GPU only. The flashinfer adapters' mutants,
and a lowering that returns before the work it launched on a side stream is done (`tests/gpu_mutants_plugin.py`
registers them all for a `check --plugin` run and the stream sanitizer's replay)."""

from __future__ import annotations

import importlib.util
import math
import sys
import tempfile
from pathlib import Path

import torch

from lowerings import flashinfer as fp
from lowerings.flashinfer import base as fp_base, windowed_merge as fp_merge
from lowerings.triton_hybrid import HybridPaged
from lowerings.protocol import BASE_2, LoweringResult, Partial
from lowerings.merges import merges_future_block_keys
from lowerings.torch_emulation import Context


class MergeStateNaturalLse(fp.FlashinferWindowedMerge):
    """BUGS 2: part B's natural-log LSE handed to merge_state_in_place, which takes base 2."""

    def __init__(self) -> None:
        super().__init__("merge_state")
        self.name = "gpu-mutant:merge_state_natural_lse"

    def run(self, inputs):
        orig = fp_merge.LN2
        fp_merge.LN2 = 1.0  # the bug: no conversion of part B's LSE to base 2
        try:
            return super().run(inputs)
        finally:
            fp_merge.LN2 = orig


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
        fi = fp.flashinfer_module()
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
    races the side stream: on one call in three a 25 ms spin (`torch.cuda._sleep`) between the work and
    the copy makes the read land first (zeros, an LSE of -inf); otherwise the copy usually wins. The spin
    is queued after the work, so a host synchronization inside the work cannot absorb it
    (`torch.tensor(kv_lens, device=...)` in `lowerings.paged` copies from host memory and waits for the side
    stream): only the two copies are queued after it, microseconds of host time. With the spin ahead of
    the work, 12 busy xdist workers let it shrink only to B = 2 (docs/gpu/2026-12-01-h200-session7.md,
    run 24). The memory its side stream uses is kept alive (`record_stream`): the missing sync is the only
    bug. Identical runs differ; the stream sanitizer flags the caller's read of a tensor the side stream
    wrote without a sync."""

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
            res = super().run(inputs)
            if self.calls % 3 == 0:
                torch.cuda._sleep(self.SPIN_CYCLES)
            out.copy_(res.out)
            lse.copy_(res.lse)
        # The memory is kept right: what the side stream reads or writes is not handed to another tensor
        # before the side stream is done with it. Without this (H200 run 27), an index kernel's device-side
        # assert ("index out of bounds") was reported at the harness's next page-table copy, and the dead
        # CUDA context failed every later test of that xdist worker. The likely path: the copy 25 ms after
        # `run` returned wrote into memory the caching allocator had already handed on
        # (docs/gpu/2026-12-02-h200-session8.md).
        for t in (out, lse, inputs.q, inputs.k_pool, inputs.v_pool, inputs.page_table, inputs.context_lens,
                  inputs.k_block, inputs.v_block):
            t.record_stream(self.side)
        # BUG: no `main.wait_stream(self.side)` before returning: the caller reads `out` and `lse` too early
        return LoweringResult(out=out, lse=lse)


# ---- production scale (issue 13) ------------------------------------------------------------------------

class Fp8ScalesSwappedFlashinfer(fp.FlashinferDecodeRows):
    """BUGS 14: the fp8 pool's `k_scale` and `v_scale` handed to flashinfer's run() swapped: right when they
    are equal, wrong otherwise (the default gpu profile draws fp8 pools with `k_scale != v_scale`)."""

    def __init__(self) -> None:
        super().__init__(tensor_cores=False)
        self.name = "gpu-mutant:fp8_scales_swapped"

    def run(self, inputs):
        orig = fp_base.kv_scale_kwargs

        def swapped(case):
            got = orig(case)
            return {"k_scale": got["v_scale"], "v_scale": got["k_scale"]} if got else got

        fp_base.kv_scale_kwargs = swapped  # the bug (the name the call sequences read)
        try:
            return super().run(inputs)
        finally:
            fp_base.kv_scale_kwargs = orig


class _DispatchAt(fp.FlashinferDecodeRows):
    """BUGS 17: the dispatch compares B against `taken` while the declared threshold is 32 (the counters and
    kernel names expect the declared one)."""

    taken = 32

    def __init__(self) -> None:
        super().__init__(tensor_cores=False)
        self.name = f"gpu-mutant:dispatch_rows_to_{self.taken}"

    def _build(self, inputs, graph):
        self.threshold = self.taken  # the bug: only where the call sequence is built
        try:
            return super()._build(inputs, graph)
        finally:
            self.threshold = fp.DECODE_ROWS_MAX_BATCH


class DispatchRowsTo33(_DispatchAt):
    """BUGS 3/17: decode rows taken at B = 33 (`B <= 33`), where the context form is declared."""

    taken = 33


class DispatchRowsTo31(_DispatchAt):
    """BUGS 17: the context form taken at B = 32 (`B < 32`), where decode rows are declared."""

    taken = 31


ROOT = Path(__file__).resolve().parents[1]
HYBRID_SRC = ROOT / "lowerings" / "_hybrid_kernel.py"
# The bug: page and slot offsets in 32 bits. `page * stride_kp` passes 2**31 once a pool does (`scale` profile).
INT32_OFFSET_EDITS = (
    ("page = tl.load(pt_row + (idx // PAGE_SIZE) * stride_ptp, mask=valid, other=0).to(tl.int64)",
     "page = tl.load(pt_row + (idx // PAGE_SIZE) * stride_ptp, mask=valid, other=0).to(tl.int32)"),
    ("slot = (idx % PAGE_SIZE).to(tl.int64)", "slot = (idx % PAGE_SIZE).to(tl.int32)"),
)
_INT32_MODULE = None


def hybrid_int32_module():
    """`lowerings/_hybrid_kernel.py` with 32-bit pool offsets, imported from a temporary file (Triton
    needs a kernel's source in a file); once per process."""
    global _INT32_MODULE
    if _INT32_MODULE is None:
        text = HYBRID_SRC.read_text().replace("from ._triton_env import", "from lowerings._triton_env import")
        for old, new in INT32_OFFSET_EDITS:
            assert old in text, f"mutation site not found in {HYBRID_SRC.name}: {old!r}"
            text = text.replace(old, new)
        path = Path(tempfile.mkdtemp(prefix="dflash-int32-")) / "hybrid_mutant_int32_offsets.py"
        path.write_text(text)
        spec = importlib.util.spec_from_file_location(path.stem, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[path.stem] = mod
        spec.loader.exec_module(mod)
        _INT32_MODULE = mod
    return _INT32_MODULE


class HybridInt32Offsets(HybridPaged):
    """BUGS (Triton offsets): `hybrid_paged` with its page and slot offsets in int32: exact while a pool
    holds fewer than 2**31 elements; past that, `page * page_stride` wraps and the kernel reads another
    allocation or faults (run it isolated). Only the `scale` profile draws such pools."""

    def __init__(self) -> None:
        super().__init__()
        self.name = "gpu-mutant:hybrid_int32_offsets"

    def run(self, inputs):
        import lowerings
        import lowerings._hybrid_kernel as real

        mod = hybrid_int32_module()
        sys.modules["lowerings._hybrid_kernel"] = lowerings._hybrid_kernel = mod
        try:
            return super().run(inputs)
        finally:
            sys.modules["lowerings._hybrid_kernel"] = lowerings._hybrid_kernel = real


def register_all() -> None:
    """Register every GPU mutant under its name, replacing an earlier registration (tests/gpu_mutants_plugin.py:
    the worker of an isolated run and the stream sanitizer's replay load it to find them by name)."""
    from lowerings.registry import register

    for cls, _ in GPU_MUTANTS.values():
        register(cls(), replace=True)
    register(ReturnsBeforeSideStream(), replace=True)


GPU_MUTANTS = {
    "merge_state_natural_lse": (MergeStateNaturalLse, "LSE"),
    "part_a_block_end": (PartAAnchoredAtBlockEnd, "partial A"),
    "workspace_b_rows": (WorkspaceForBRows, "raised"),
    "fa3_silently_fa2": (Fa3SilentlyFa2, "silent fallback, fa2 paged prefill (fa3 silently replaced by fa2) ran"),
    "fp8_scales_swapped": (Fp8ScalesSwappedFlashinfer, "output: max |O - O_ref|"),
    "dispatch_rows_to_33": (DispatchRowsTo33, "kernel calls"),
    "dispatch_rows_to_31": (DispatchRowsTo31, "kernel calls"),
    "hybrid_int32_offsets": (HybridInt32Offsets, ""),
}
