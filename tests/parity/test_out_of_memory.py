"""A case that runs out of device memory is judged again alone (`parity.engine.case_run.run_case`), never failed for it:
on a GPU shared by `check --jobs N` processes, one process's allocation can fail because of what the others hold.
Out of memory again, alone: a failure that says so. Any other exception stays the lowering's failure."""

from __future__ import annotations

import json
import os
import threading
import time
import types

import pytest
import torch

from lowerings.torch_emulation import DecodeRows
from oracle import reference
from parity.engine import case_run
from parity.exec import memory
from parity.engine import policy as parity_policy
from parity.engine.outcome import LoweringReport
from parity.report.files import summary_md, to_json
from parity.engine.runner import RunOptions
from tests.oracle.oracle_cases import build_case

OOM = getattr(torch.cuda, "OutOfMemoryError", RuntimeError)


class RunsOutOfMemory(DecodeRows):
    """Decode rows that raise CUDA's out-of-memory error on their first `fail_times` calls."""

    name = "decode_rows_oom"

    def __init__(self, fail_times: int, error=None) -> None:
        self.left, self.error = fail_times, error

    def run(self, inputs):
        if self.left:
            self.left -= 1
            raise self.error or OOM("CUDA out of memory. Tried to allocate 20.00 GiB (GPU 0; 139.81 GiB total)")
        return super().run(inputs)


@pytest.fixture(scope="module")
def policy():
    return parity_policy.load(None)


CASE = build_case((5, 40), 4, 2, 2, 64, 16)


def test_out_of_memory_once_is_judged_again_alone_and_passes(policy):
    out = case_run.run_case(RunsOutOfMemory(1), CASE, policy, RunOptions())
    assert out.status == "pass", out.failures
    assert "judged again alone" in out.retried[memory.RETRIED_OOM]
    assert "decode_rows_oom ran out of device memory" in out.retried[memory.RETRIED_OOM]
    rep = LoweringReport.of_case(out)
    rep.add(LoweringReport.of_case(case_run.run_case(RunsOutOfMemory(1), CASE, policy, RunOptions())))
    assert rep.retried[memory.RETRIED_OOM]["cases"] == 2
    entry = rep.to_json()
    assert LoweringReport.from_json("decode_rows_oom", json.loads(json.dumps(entry))).retried == rep.retried
    md = summary_md(to_json([rep], device="cuda", profile="gpu", tolerances="t"))
    assert "`decode_rows_oom`: judged again alone on 2 case(s) that ran out of device memory" in md


def test_out_of_memory_twice_fails_and_says_both(policy):
    out = case_run.run_case(RunsOutOfMemory(2), CASE, policy, RunOptions())
    assert out.status == "fail"
    assert any("out of device memory, twice" in f and "to itself" in f for f in out.failures), out.failures
    assert memory.RETRIED_OOM in out.retried


def test_another_exception_is_the_lowerings_failure_and_not_retried(policy):
    out = case_run.run_case(RunsOutOfMemory(1, RuntimeError("index 7 is out of bounds")), CASE, policy, RunOptions())
    assert out.status == "fail" and out.retried == {}
    assert any("raised RuntimeError" in f for f in out.failures), out.failures
    assert not memory.is_out_of_memory(MemoryError("host")), "a host MemoryError has nothing to wait for"


def test_out_of_memory_in_the_oracle_is_judged_again_too(policy, monkeypatch):
    real, calls = reference.attention, []

    def oracle_once_out(inputs, *a, **k):
        if not k.get("round_p"):  # the oracle's own passes, not the yardstick's
            calls.append(1)
            if len(calls) == 1:
                raise RuntimeError("CUDA error: out of memory")
        return real(inputs, *a, **k)

    monkeypatch.setattr(reference, "attention", oracle_once_out)
    out = case_run.run_case(DecodeRows(), CASE, policy, RunOptions())
    # Judged again: the oracle's pass that ran out, then the retry's (and its fp64 pass where `confirm` needs one).
    assert out.status == "pass" and memory.RETRIED_OOM in out.retried and len(calls) == 2 + (out.oracle["precision"]
                                                                                           == "float64")


def test_the_lease_alone_waits_for_every_other_lease(tmp_path, monkeypatch):
    """`device_lease(alone=True)` leases all of LEASE_SHARE: it waits until no other live process holds a lease."""
    total = 100 << 30
    path = tmp_path / "ledger.json"
    fake = types.SimpleNamespace(total_memory=total, uuid="fake", name="fake")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: fake)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(memory, "ledger_path", lambda index: path)
    monkeypatch.setattr(memory, "POLL_SECONDS", 0.01)
    other = os.getppid()  # a live process
    assert memory.lease(path, 1 << 30, int(memory.LEASE_SHARE * total), pid=other)
    threading.Timer(0.2, lambda: memory.release(path, pid=other)).start()
    t0 = time.perf_counter()
    with memory.device_lease(CASE, RunOptions(device="cuda"), alone=True) as held:
        assert time.perf_counter() - t0 >= 0.15 and held.waited >= 0.15
        assert json.loads(path.read_text()) == {str(os.getpid()): int(memory.LEASE_SHARE * total)}
    assert json.loads(path.read_text()) == {}
    with memory.device_lease(CASE, RunOptions(device="cuda")) as held:  # a small case, not alone: no lease
        assert held.path is None


def test_a_large_case_leases_the_input_sets_it_holds_at_once(tmp_path, monkeypatch):
    """`footprint.lease_bytes`: with hardening, the inputs, the snapshot and one re-run's inputs (plus the lowering's
    copy, the oracle and the yardstick), not the five sets `run_bytes` budgets a draw for; `device_lease` leases it."""
    from oracle import footprint

    big = build_case((40000, 40000), 16, 8, 4, 128, 16)
    plain = footprint.lease_bytes(big, hardening=False)
    assert plain == footprint.run_bytes(big, hardening=False)
    hardened = footprint.lease_bytes(big)
    inputs = footprint.input_bytes(big)
    assert hardened == footprint.run_bytes(big) - (footprint.HARDENED_INPUT_SETS - footprint.HELD_INPUT_SETS) * inputs
    assert hardened < footprint.run_bytes(big)
    total = 4 * hardened  # the case passes LARGE_SHARE of this device
    fake = types.SimpleNamespace(total_memory=total, uuid="fake", name="fake")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: fake)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    path = tmp_path / "ledger.json"
    monkeypatch.setattr(memory, "ledger_path", lambda index: path)
    with memory.device_lease(big, RunOptions(device="cuda", profile_every=0)):
        assert json.loads(path.read_text()) == {str(os.getpid()): hardened}


def test_the_held_sets_are_what_the_hardening_holds(policy, monkeypatch):
    """Negative control for the lease above, on the CPU: count the live input sets while a lowering whose runs
    differ goes through its second, third and fourth runs (`rerun_failures`): never more than HELD_INPUT_SETS."""
    import gc

    from lowerings.protocol import LoweringResult
    from oracle.inputs import Inputs
    from oracle import footprint

    most = [0]

    class Differs(DecodeRows):
        name = "decode_rows_differs"

        def run(self, inputs):
            gc.collect()
            most[0] = max(most[0], sum(type(o) is Inputs for o in gc.get_objects()))
            res = super().run(inputs)
            return LoweringResult(out=res.out, lse=res.lse + torch.rand_like(res.lse) * 1e-3)  # differs run to run

    out = case_run.run_case(Differs(), CASE, policy, RunOptions())
    assert any("nondetermin" in f or "outside" in f for f in out.failures), out.failures
    assert 2 <= most[0] <= footprint.HELD_INPUT_SETS, most[0]


def test_the_first_attempts_tensors_are_gone_before_the_retry(policy):
    """When the case is judged again, the first attempt's inputs and snapshot are no longer alive (the error's
    frames would hold them: only its message is kept)."""
    import gc

    from oracle.inputs import Inputs

    seen = []

    class Counts(RunsOutOfMemory):
        def run(self, inputs):
            gc.collect()
            seen.append(sum(type(o) is Inputs for o in gc.get_objects()))
            return super().run(inputs)

    out = case_run.run_case(Counts(1), CASE, policy, RunOptions())
    assert out.status == "pass" and len(seen) >= 2
    assert seen[1] <= seen[0] == 2, seen  # the inputs and the untouched-input snapshot, of this attempt only
