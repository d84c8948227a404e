"""`parity.engine.hardening.cuda_kernel_names`: on the GPU, the kernel names the kernel-name check reads from the
profiler's raw results are those `prof.events()` gives (skipped without flashinfer or a GPU); on the CPU,
over fake raw results, the check they feed catches a silent fallback."""

from __future__ import annotations

import pytest
import torch

from lowerings import flashinfer as fp
from parity.engine.runner import RunOptions
from tests.lowerings.test_flashinfer_adapters import GPU_CASES, _need_flashinfer, case


@pytest.mark.parity_gpu
@pytest.mark.parametrize("name,kw", [GPU_CASES[0], GPU_CASES[5]], ids=[GPU_CASES[0][0], GPU_CASES[5][0]])
def test_gpu_kernel_names_from_raw_profiler_results_match_its_events(name, kw):
    """`parity.engine.hardening.cuda_kernel_names` reads the profiler's raw results: the same device activities,
    in the same order, as `prof.events()` (which it skips building), and the adapter's kernels among them."""
    from torch.profiler import ProfilerActivity, profile

    from parity.engine.hardening import cuda_kernel_names
    from parity.engine.invocation import prepare_inputs

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


class _RawEvent:
    """A raw profiler event as `kineto_results.events()` gives it: `name()` and `device_type()`."""

    def __init__(self, name: str, device: str) -> None:
        self._name, self._device = name, device

    def name(self) -> str:
        return self._name

    def device_type(self) -> str:
        return f"DeviceType.{self._device}"


class _Prof:
    """A finished `torch.profiler.profile` with raw results (`events=None`: `prof.events()` must not be read)."""

    def __init__(self, raw, events=None) -> None:
        if raw is not None:
            self.profiler = type("P", (), {"kineto_results": type("K", (), {"events": lambda _self: raw})()})()
        self._events = events

    def events(self):
        assert self._events is not None, "the raw results were there: prof.events() is not built"
        return self._events


def test_raw_kernel_names_feed_a_check_that_fails_on_a_silent_fallback():
    """On the CPU: the names read from raw results are the CUDA events only, in order, and the kernel-name check
    over them catches a forbidden kernel (fa3 silently replaced by fa2) and a missing one; without raw results
    the names come from `prof.events()`."""
    from lowerings import counters
    from parity.engine.hardening import cuda_kernel_names

    raw = [_RawEvent("cudaLaunchKernel", "CPU"), _RawEvent("BatchPrefillWithPagedKVCacheKernel<fa2>", "CUDA"),
           _RawEvent("Memcpy HtoD", "CUDA")]
    names = cuda_kernel_names(_Prof(raw))
    assert names == ["BatchPrefillWithPagedKVCacheKernel<fa2>", "Memcpy HtoD"]
    msgs = counters.kernel_name_failures(names, {"fa3 prefill": "sm90"}, {"fa2 prefill": "fa2"})
    assert any("expected fa3 prefill ('sm90') never ran" in m for m in msgs)
    assert any("silent fallback, fa2 prefill ran" in m for m in msgs)
    assert counters.kernel_name_failures(names, {"fa2 prefill": "fa2"}, {}) == []
    ev = type("E", (), {"name": "k_from_events", "device_type": "DeviceType.CUDA"})()
    assert cuda_kernel_names(_Prof(None, events=[ev])) == ["k_from_events"]
