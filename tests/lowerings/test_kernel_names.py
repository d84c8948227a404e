"""`parity.hardening.cuda_kernel_names` on the GPU: the kernel names the kernel-name check reads from the
profiler's raw results are those `prof.events()` gives (skipped on a machine without flashinfer or a GPU)."""

from __future__ import annotations

import pytest
import torch

from lowerings import flashinfer as fp
from parity.runner import RunOptions
from tests.lowerings.test_flashinfer_adapters import GPU_CASES, _need_flashinfer, case


@pytest.mark.parity_gpu
@pytest.mark.parametrize("name,kw", [GPU_CASES[0], GPU_CASES[5]], ids=[GPU_CASES[0][0], GPU_CASES[5][0]])
def test_gpu_kernel_names_from_raw_profiler_results_match_its_events(name, kw):
    """`parity.hardening.cuda_kernel_names` reads the profiler's raw results: the same device activities,
    in the same order, as `prof.events()` (which it skips building), and the adapter's kernels among them."""
    from torch.profiler import ProfilerActivity, profile

    from parity.hardening import cuda_kernel_names
    from parity.invocation import prepare_inputs

    _need_flashinfer()
    adapter = {a.name: a for a in fp.adapters()}[name]
    c = case(**kw)
    inputs, _ = prepare_inputs(adapter, c, RunOptions(device="cuda"))
    adapter.run(inputs)  # compiled and planned outside the profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        adapter.run(inputs)
        torch.cuda.synchronize()
    raw = cuda_kernel_names(prof)
    events = [e.name for e in prof.events() if getattr(e, "device_type", None) is not None
              and str(e.device_type).endswith("CUDA")]
    assert raw == events and raw, (raw, events)
    assert all(any(sub in n for n in raw) for sub in adapter.kernel_families(c).values()), raw
