"""A case whose kernel names are read profiles its judged call itself (`parity.engine.case_run`, `parity.engine.hardening.KernelNames`):
the names checked are those of the kernels whose output was judged, with no second run and no copy of the inputs.

On the CPU there are no CUDA kernels, so these tests stand a recording profiler in for `KernelNames` and let a
lowering "launch" names into whichever profiler is running. On the H200, `tests/lowerings/test_gpu_mutants.py`
(`fa3_silently_fa2`) runs the real profiler through the same path."""

from __future__ import annotations

import pytest

from lowerings.torch_emulation import DecodeRows
from parity.engine import case_run
from parity.engine import policy as parity_policy
from parity.engine.runner import RunOptions
from tests.oracle.oracle_cases import build_case

CASE = build_case((5, 40), 4, 2, 2, 64, 16)


class RecordingProfiler:
    """`KernelNames`' interface; `launched(name)` records a name only while it runs."""

    running: "RecordingProfiler | None" = None
    made: list["RecordingProfiler"] = []

    def __init__(self) -> None:
        self.seen = None
        self.names: list[str] = []
        self.starts = self.stops = 0
        RecordingProfiler.made.append(self)

    def start(self) -> None:
        self.starts += 1
        RecordingProfiler.running = self

    def stop(self) -> None:
        self.stops += 1
        RecordingProfiler.running = None
        self.seen = list(self.names)

    def failures(self, lowering, case):
        from parity.engine.hardening import kernel_name_failures

        return kernel_name_failures(lowering, case, self.seen or [])


def launched(name: str) -> None:
    if RecordingProfiler.running is not None:
        RecordingProfiler.running.names.append(name)


class Declares(DecodeRows):
    """Decode rows that declare the kernel `decode_kernel` and launch `launches` on each of its calls
    (`raises`: an exception after launching)."""

    name = "decode_rows_named"

    def __init__(self, launches=("decode_kernel",), raises: Exception | None = None) -> None:
        self.launches, self.raises, self.calls = launches, raises, 0

    def kernel_families(self, case):
        return {"the decode kernel": "decode_kernel"}

    def forbidden_kernel_families(self, case):
        return {"the prefill fallback": "prefill_kernel"}

    def run(self, inputs):
        self.calls += 1
        for n in self.launches:
            launched(n)
        if self.raises is not None:
            raise self.raises
        return super().run(inputs)


@pytest.fixture
def profiled(monkeypatch):
    RecordingProfiler.made, RecordingProfiler.running = [], None
    monkeypatch.setattr(case_run, "KernelNames", RecordingProfiler)
    monkeypatch.setattr(case_run, "kernel_names_read", lambda lowering, case, opts: True)
    return RecordingProfiler.made


@pytest.fixture(scope="module")
def policy():
    return parity_policy.load(None)


def test_the_judged_call_is_profiled_once_and_its_names_pass(profiled, policy):
    lw = Declares()
    out = case_run.run_case(lw, CASE, policy, RunOptions(check_determinism=False))
    assert out.status == "pass", out.failures
    assert lw.calls == 1  # no second run for the names
    assert len(profiled) == 1 and profiled[0].starts == profiled[0].stops == 1
    assert profiled[0].seen == ["decode_kernel"]
    assert "kernel_names" in out.phases


def test_a_silent_fallback_in_the_judged_call_fails(profiled, policy):
    out = case_run.run_case(Declares(launches=("prefill_kernel",)), CASE, policy, RunOptions(check_determinism=False))
    assert out.status == "fail"
    assert any("expected the decode kernel ('decode_kernel') never ran" in f for f in out.failures), out.failures
    assert any("silent fallback, the prefill fallback ran: prefill_kernel" in f for f in out.failures), out.failures


def test_only_the_judged_call_is_profiled(profiled, policy):
    """With hardening, the re-runs launch again: their names are not the judged call's, and are not read."""
    lw = Declares()
    out = case_run.run_case(lw, CASE, policy, RunOptions())
    assert out.status == "pass", out.failures
    assert lw.calls > 1
    assert profiled[0].seen == ["decode_kernel"]


def test_the_profiler_stops_when_the_lowering_raises(profiled, policy):
    out = case_run.run_case(Declares(raises=ValueError("bad plan")), CASE, policy, RunOptions(check_determinism=False))
    assert out.status == "fail"
    assert any("raised ValueError" in f and "bad plan" in f for f in out.failures), out.failures
    assert profiled[0].stops == 1 and RecordingProfiler.running is None
    assert not any("GPU kernels" in f for f in out.failures)  # a failure first: the names are not judged


def test_a_case_that_is_not_sampled_is_not_profiled(monkeypatch, policy):
    RecordingProfiler.made = []
    monkeypatch.setattr(case_run, "KernelNames", RecordingProfiler)
    out = case_run.run_case(Declares(launches=("prefill_kernel",)), CASE, policy, RunOptions(check_determinism=False))
    assert out.status == "pass", out.failures  # on the CPU no case is sampled (`kernel_names_read`)
    assert RecordingProfiler.made == []
    assert not case_run.kernel_names_read(Declares(), CASE, RunOptions(device="cpu", profile_every=1))
    assert case_run.kernel_names_read(Declares(), CASE, RunOptions(device="cuda", profile_every=1))
    assert not case_run.kernel_names_read(DecodeRows(), CASE, RunOptions(device="cuda", profile_every=1))
