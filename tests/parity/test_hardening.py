"""The hardening checks catch what they are for: reads outside the request's keys, outputs never written or
written past their end, mutated inputs, dependence on uninitialized memory; and a lowering that kills or
hangs its process fails (shrunk) without ending the run.

Mutants: `tests/hardening_mutants.py`. The crashing ones run only in isolated workers, which load them from
`tests/hardening_plugin.py`. CPU only; each test prints its seconds.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch

import lowerings
from parity.engine import yardstick
from oracle.case import Case
from oracle.inputs import GUARD, attach_output_buffers, materialize, poison_bits
from parity.front import cli
from parity.engine import policy as parity_policy
from parity.exec.inflight import inflight_path, read_inflight
from parity.exec.isolation import IsolatedExecutor
from parity.engine.runner import RunOptions, check_lowering, run_case
from strategies import Limits, build_case, cases, profile_settings
from tests import hardening_mutants as H
from tests.devices import TRITON_DEVICE, interpreter_only
from tests.plugin_runs import assert_outcomes, runpytest

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = ROOT / "tests" / "hardening_plugin.py"
SMALL = Limits(max_batch=4, max_context=40)
# Contexts up to two pages of 16 or more: the crashers fire once a context crosses a page.
CRASH = Limits(max_batch=2, max_context=40)


@pytest.fixture(scope="module", autouse=True)
def _single_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def policy():
    return parity_policy.load()


pytestmark = pytest.mark.usefixtures("restore_registry")  # tests/conftest.py


def _case(**over) -> Case:
    base = dict(context_lens=[5, 17], block_size=4, num_kv_heads=2, group=2, head_dim=64, page_size=4,
                window=("noncausal", None), dtype="bfloat16", kv_dtype="same", k_scale=1.0, v_scale=1.0, scale=None,
                layout="NHD", block_storage="dense", page_table_dtype="int32", page_table_pad=0, spare_pages=1,
                extra_pages=0, perm_seed=7, seed=3)
    return build_case(dict(base, **over))


def _sweep(lowering, policy, *, limits=SMALL, max_examples=30, executor=None):
    t0 = time.perf_counter()
    rep = check_lowering(lowering, policy, strategy=cases(lowering, limits=limits),
                         settings=profile_settings("ci", max_examples=max_examples), opts=RunOptions(device="cpu"),
                         yardstick=lowerings.get("sdpa"), executor=executor)
    secs = time.perf_counter() - t0
    msgs = [m for f in rep.failures for m in f.outcome.failures] + rep.extra
    print(f"{lowering.name}: {rep.status} in {secs:.1f}s, {rep.cases} cases; "
          + (rep.failures[0].outcome.case.short() + ": " + "; ".join(msgs) if rep.failures else ""))
    return rep, msgs


# ---- the poison and guard buffers --------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_poison_is_a_nan_torch_never_makes(dtype):
    poison, guard = poison_bits(dtype)
    int_dt = {2: torch.int16, 4: torch.int32}[torch.empty((), dtype=dtype).element_size()]
    canonical = int(torch.tensor(float("nan"), dtype=dtype).view(int_dt))
    as_float = torch.tensor([poison, guard], dtype=int_dt).view(dtype)
    assert torch.isnan(as_float).all()
    assert len({poison, guard, canonical}) == 3
    # arithmetic on NaNs gives torch's canonical NaN, not the poison: "wrote NaN" is not "never written"
    computed = (torch.zeros(4, dtype=dtype) / 0.0).view(int_dt)
    assert not (computed == poison).any()


def test_output_buffers_are_poisoned_guarded_views():
    inputs = materialize(_case())
    out, lse = attach_output_buffers(inputs)
    assert inputs.out.shape == (2, 4, 4, 64) and inputs.lse_out.shape == (2, 4, 4)
    assert inputs.out.dtype == torch.bfloat16 and inputs.lse_out.dtype == torch.float32
    n = inputs.out.numel()
    assert out.guard == max(GUARD, n, 128 * 4 * 64) and lse.guard == max(GUARD, inputs.lse_out.numel(), 128 * 4)
    # (both already whole 512-byte blocks: 32,768 bf16 and 512 fp32 elements)
    assert inputs.out.data_ptr() == out.flat.data_ptr() + out.guard * 2
    assert out.flat.numel() == n + 2 * out.guard
    assert torch.isnan(out.flat).all() and torch.isnan(lse.flat).all()
    assert "out" not in inputs.tensors()  # outputs are not inputs: not hashed as untouched


# ---- mutants caught in process --------------------------------------------------------------------------

IN_PROCESS = [
    ("hardening:reads_page_tail", ["read outside the request's keys"]),
    ("hardening:last_query_unwritten", ["output never written at request 0, query 0, head 0"]),
    ("hardening:writes_past_end", ["wrote 1 element(s) past the end of the output"]),
    ("hardening:returns_new_tensor", ["returned a new tensor instead of writing the given output"]),
    ("hardening:mutates_q", ["input mutated: q was changed"]),
    ("hardening:append_spills", ["input mutated: k_pool changed at"]),
    # poisoned buffers: `out += o` on a buffer the caller did not zero
    ("hardening:accumulates_into_given", ["non-finite", "never written"]),
    # torch.empty's garbage: whatever it holds, the oracle, the reruns or the canaries see it
    ("hardening:uninitialized_accumulator", ["max |O - O_ref|", "non-finite", "nondeterministic",
                                             "read outside the request's keys"]),
    # state a previous call left, a missing sync: named before anything else (tests/parity/test_flakiness.py)
    ("hardening:stale_running_max", ["nondeterministic across identical runs"]),
    ("hardening:reads_before_written", ["nondeterministic across identical runs"]),
]


@pytest.mark.parametrize("name,phrases", IN_PROCESS, ids=[n.split(":")[1] for n, _ in IN_PROCESS])
def test_mutant_is_caught(name, phrases, policy):
    rep, msgs = _sweep(H.catalogue()[name], policy)
    assert rep.status == "fail" and rep.failures and rep.failures[0].shrunk, msgs
    text = "\n".join(msgs)
    assert any(p in text for p in phrases), f"{name}: expected one of {phrases} in:\n{text}"
    c = rep.failures[0].outcome.case
    assert c.batch_size == 1 and c.block_size == 1, c.short()


def test_last_query_unwritten_names_query_k_minus_1(policy):
    """On a fixed case with K=4 the first never-written element is query 3 of request 0."""
    out = run_case(H.LastQueryUnwritten(), _case(), policy, RunOptions(), lowerings.get("sdpa"))
    assert out.status == "fail"
    assert any(m.startswith("output never written at request 0, query 3, head 0: 512 element(s)")
               for m in out.failures), out.failures


def test_correct_given_output_lowering_passes(policy):
    rep, msgs = _sweep(H.SdpaIntoGiven(), policy, max_examples=30)
    assert rep.status == "pass", msgs


@pytest.mark.parametrize("over", [{}, dict(dtype="float16", context_lens=[0, 3], block_size=1),
                                  dict(kv_dtype="float8_e4m3fn", k_scale=0.5, v_scale=2.0, group=3)],
                         ids=["bf16", "fp16-empty", "fp8"])
def test_hybrid_paged_writes_every_given_element(over, policy):
    hp = lowerings.get("hybrid_paged")
    ok, why = hp.available(TRITON_DEVICE)  # the interpreter's CPU on CI, the GPU on a GPU runner
    if not ok:
        pytest.skip(why)
    assert hp.writes_given_output
    out = run_case(hp, _case(**over), policy, RunOptions(device=TRITON_DEVICE), lowerings.get("sdpa"))
    assert out.status == "pass", out.failures


# ---- isolation: crashes and hangs fail the case, the run goes on ----------------------------------------

@pytest.fixture
def executor(tmp_path):
    ex = IsolatedExecutor(plugins=[PLUGIN], opts=RunOptions(device="cpu"), case_timeout=60,
                          inflight_dir=tmp_path / "inflight", num_threads=1)
    yield ex
    ex.close()


def test_isolated_outcome_matches_in_process(executor, policy):
    case = _case()
    for lw in (lowerings.get("decode_rows"), H.MutatesQ()):
        here = run_case(lw, case, policy, RunOptions(device="cpu"), yardstick.get(yardstick.DEFAULT))
        there = executor.run(lw.name, case)
        assert (there.status, there.failures, there.calls, there.expected_calls) == \
               (here.status, here.failures, here.calls, here.expected_calls)
        assert [c.label for c in there.comparisons] == [c.label for c in here.comparisons]
        for a, b in zip(there.comparisons, here.comparisons):
            assert a.figures.keys() == b.figures.keys() and a.margins == pytest.approx(b.margins)
            assert a.figures["out_ulp"] == pytest.approx(b.figures["out_ulp"])
        assert there.margin == pytest.approx(here.margin)
    assert not inflight_path(executor.inflight_dir, "decode_rows").exists()  # removed after the answer


def test_segfault_is_isolated_shrunk_and_the_run_goes_on(executor, policy):
    t0 = time.perf_counter()
    rep, msgs = _sweep(H.Segfault(), policy, limits=CRASH, max_examples=20, executor=executor)
    assert rep.status == "fail" and rep.failures[0].shrunk
    assert msgs[0] == "crashed: worker killed by SIGSEGV (signal 11) while running this case", msgs
    c = rep.failures[0].outcome.case
    # shrunk: one request whose context just crosses its first page
    assert c.batch_size == 1 and c.block_size == 1 and c.context_lens == (c.page_size + 1,), c.short()
    assert executor.crashes >= 2 and executor.workers_started >= 2
    # the case it died on is on disk: hypothesis's last replay is the shrunk case
    assert read_inflight(executor.inflight_dir, H.Segfault.name) == c
    # the same executor goes on with the next lowering in a fresh worker
    rep2, msgs2 = _sweep(lowerings.get("sdpa"), policy, max_examples=10, executor=executor)
    assert rep2.status == "pass", msgs2
    print(f"segfault sweep + sdpa: {time.perf_counter() - t0:.1f}s, {executor.workers_started} workers")


def test_a_crash_that_does_not_replay_is_reported_as_flaky(executor, policy):
    import shutil
    shutil.rmtree(H.CRASH_ONCE_MARKS, ignore_errors=True)
    rep, msgs = _sweep(H.CrashOnce(), policy, limits=CRASH, max_examples=20, executor=executor)
    assert rep.status == "fail" and rep.failures and not rep.failures[0].shrunk, msgs
    assert rep.failures[0].outcome.failures == ["crashed: worker killed by SIGSEGV (signal 11) while running this case"]
    assert any(m.startswith("flaky: the case below failed, then passed when hypothesis replayed it") for m in rep.extra)


@interpreter_only  # compiled for a GPU, an out-of-bounds read is a CUDA fault, not this process's SIGSEGV
def test_triton_kernel_segfault_under_the_interpreter(executor):
    pytest.importorskip("triton")
    crossing = _case(context_lens=[5], page_size=4)
    out = executor.run(H.TritonOutOfBounds.name, crossing)
    assert out.status == "fail" and out.failures == [
        "crashed: worker killed by SIGSEGV (signal 11) while running this case"], out.failures
    assert inflight_path(executor.inflight_dir, H.TritonOutOfBounds.name).exists()
    fine = executor.run(H.TritonOutOfBounds.name, _case(context_lens=[3], page_size=4))
    assert fine.status == "pass", fine.failures
    assert not inflight_path(executor.inflight_dir, H.TritonOutOfBounds.name).exists()


@pytest.mark.parametrize("name,message", [
    ("hardening:abort", "crashed: worker killed by SIGABRT (signal 6) while running this case"),
    ("hardening:exit3", "crashed: worker exited with code 3 without answering while running this case"),
])
def test_abort_and_exit_are_crashes(executor, name, message):
    out = executor.run(name, _case())
    assert out.failures == [message]
    assert executor.run("sdpa", _case()).status == "pass"


def test_hang_times_out_and_the_worker_is_replaced(tmp_path):
    with IsolatedExecutor(plugins=[PLUGIN], opts=RunOptions(device="cpu"), case_timeout=3,
                          inflight_dir=tmp_path, num_threads=1) as ex:
        ex.run("sdpa", _case())  # the worker is up: the timeout below is the case's alone
        t0 = time.perf_counter()
        out = ex.run(H.Hang.name, _case())
        secs = time.perf_counter() - t0
        assert out.status == "fail" and out.failures == ["hung: no result after 3 s; worker killed"]
        assert 3 <= secs < 20
        assert read_inflight(tmp_path, H.Hang.name) == _case()
        assert ex.run("sdpa", _case()).status == "pass"


# ---- the CLI ------------------------------------------------------------------------------------------------

CRASHER = '''
import os, signal
from lowerings import register
from lowerings.torch_emulation import Sdpa

class Crasher(Sdpa):
    name = "crasher"
    def run(self, inputs):
        if max(inputs.context_lens_host) > inputs.case.page_size:
            os.kill(os.getpid(), signal.SIGSEGV)
        return super().run(inputs)

register(Crasher())
'''


def test_cli_check_survives_a_segfaulting_plugin(tmp_path, capsys):
    plugin = tmp_path / "crasher.py"
    plugin.write_text(CRASHER)
    report = tmp_path / "report"
    t0 = time.perf_counter()
    code = cli.main(["check", "--plugin", str(plugin), "--lowering", "crasher", "--lowering", "sdpa",
                     "--case-timeout", "10", "--max-examples", "5", "--report", str(report), "--quiet",
                     "--device", "cpu"])
    out, err = capsys.readouterr()
    print(f"cli check crasher+sdpa: {time.perf_counter() - t0:.1f}s")
    assert code == 1, out + err
    data = json.loads((report / "parity.json").read_text())
    assert data["lowerings"]["sdpa"]["status"] == "pass"
    assert data["lowerings"]["crasher"]["status"] == "fail"
    saved = json.loads((report / "failures" / "crasher-1.json").read_text())
    assert saved["failures"] == ["crashed: worker killed by SIGSEGV (signal 11) while running this case"]
    case = Case.from_json_dict(saved["case"])
    assert case.batch_size == 1 and case.context_lens == (case.page_size + 1,), case.short()
    assert read_inflight(report / "inflight", "crasher") == case
    assert "crashed: worker killed by SIGSEGV" in out


# A device fault, simulated on the CPU: a case with more than one page of context "faults" the device, and
# from then on every call of the process fails (a CUDA fault is sticky), the framework's input building
# included, until the worker is replaced. The worker's end-of-case check (`parity.exec.worker.context_lost`,
# `torch.cuda.synchronize()` on CUDA) is what says so; here the plugin answers for it.
FAULTER = '''
import parity.exec.worker as worker
import parity.engine.case_run as cr
from lowerings import register
from lowerings.torch_emulation import Sdpa

FAULT = "AcceleratorError: CUDA error: an illegal memory access was encountered"
faulted = []
worker.context_lost = lambda device: FAULT if faulted else None
_prepare = cr.prepare_inputs
def prepare(*args, **kw):
    if faulted:
        raise RuntimeError(FAULT)
    return _prepare(*args, **kw)
cr.prepare_inputs = prepare

class Faulter(Sdpa):
    name = "faulter"
    def run(self, inputs):
        if max(inputs.context_lens_host) > inputs.case.page_size:
            faulted.append(True)
        return super().run(inputs)

register(Faulter())
'''


def test_a_device_fault_is_the_case_that_faulted_and_the_worker_is_replaced(tmp_path, capsys):
    """The H200's `scale` run: after a kernel faulted the device, the next (shrinking) case failed inside the
    framework and the run ended with a WorkerError. Now the fault is the failure of the case that caused it,
    the worker is replaced, and the failure shrinks like any other."""
    plugin = tmp_path / "faulter.py"
    plugin.write_text(FAULTER)
    report = tmp_path / "report"
    code = cli.main(["check", "--plugin", str(plugin), "--lowering", "faulter", "--max-examples", "8",
                     "--report", str(report), "--quiet", "--device", "cpu"])
    out, err = capsys.readouterr()
    assert code == 1, out + err
    assert "WorkerError" not in out + err
    saved = json.loads((report / "failures" / "faulter-1.json").read_text())
    assert saved["failures"][0].startswith("crashed: the device faulted while running this case "
                                           "(AcceleratorError: CUDA error: an illegal memory access"), saved["failures"]
    case = Case.from_json_dict(saved["case"])
    assert case.batch_size == 1 and case.context_lens == (case.page_size + 1,), case.short()


def test_cli_case_timeout_needs_isolation(tmp_path, capsys):
    code = cli.main(["check", "--lowering", "sdpa", "--no-isolate", "--case-timeout", "5", "--report", str(tmp_path)])
    _, err = capsys.readouterr()
    assert code == 2 and "--case-timeout" in err
    code = cli.main(["check", "--lowering", "sdpa", "--case-timeout", "0", "--report", str(tmp_path)])
    _, err = capsys.readouterr()
    assert code == 2 and "--case-timeout must be a positive number of seconds" in err


def test_pytest_parity_check_isolated_survives_a_segfault(pytester, tmp_path):
    plugin = tmp_path / "crasher.py"
    plugin.write_text(CRASHER)
    pytester.makepyfile(test_other_repo='''
def test_parity(parity_lowering, parity_check):
    parity_check(parity_lowering, max_examples=5, isolate=True, case_timeout=30)

def test_after():
    pass
''')
    res = runpytest(pytester, "--plugin", str(plugin), "--lowering", "crasher", "--parity-profile", "ci",
                    "--parity-device", "cpu", "-p", "no:cacheprovider")
    assert_outcomes(res, failed=1, passed=1)
    res.stdout.fnmatch_lines(["*crasher failed parity on cpu*", "*shrunk case: B=1*",
                              "*crashed: worker killed by SIGSEGV (signal 11) while running this case*"])


@pytest.mark.parametrize("shape", [(55, 7, 3), (1, 7, 3), (13, 5, 7, 64), (3, 1, 1, 128), (64, 16, 32)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_an_output_view_is_aligned_as_a_fresh_allocation(shape, dtype):
    """The view starts a whole number of `VIEW_ALIGN_BYTES` into its allocation, whatever the batch size: Triton
    specializes a pointer on its 16-byte alignment, and an LSE view of K=7, Hq=3 that started 84*B bytes in made
    the hybrid kernel compile one more variant in one shape family on the H200 (session 17, runs 58-59)."""
    from oracle.inputs import VIEW_ALIGN_BYTES, guarded_buffer

    buf = guarded_buffer(shape, dtype, "cpu")
    es = buf.view.element_size()
    assert (buf.view.data_ptr() - buf.flat.data_ptr()) % VIEW_ALIGN_BYTES == 0
    n = buf.numel
    row = n // (shape[0] * shape[1])
    assert max(GUARD, n, 128 * row) <= buf.guard < max(GUARD, n, 128 * row) + VIEW_ALIGN_BYTES // es
    assert buf.flat.numel() == n + 2 * buf.guard
