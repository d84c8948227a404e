"""The runner at production scale: memory estimates, hardening steps skipped (and said so) when the device's
memory does not hold them, what was drawn in the report, the boundary phase's verdicts, the yardstick's
head-group path and the vectorized isolation perturbation."""

from __future__ import annotations

import json

import pytest
import torch

import lowerings
from lowerings import torch_emulation as te
from lowerings.protocol import LoweringResult
from oracle.case import Case
from oracle.inputs import materialize
from parity.engine import device_memory as memory, drawn, ports
from oracle import footprint
from parity.exec import memory as shared_memory
from parity.report.drawn_md import summary_lines as drawn_summary_lines
from parity.engine import policy as parity_policy
from parity.report.files import summary_md, to_json, write_reports
from parity.engine.hardening import negate_context
from parity.engine.runner import RunOptions, check_lowering, run_case
from parity.front.shards import merge_entries
from strategies import build_case, check_cases, profile_settings
from tests import mutants as M

BASE = dict(context_lens=[300, 77], block_size=4, num_kv_heads=3, group=4, head_dim=64, page_size=16,
            window=("noncausal", None), dtype="bfloat16", kv_dtype="same", k_scale=1.0, v_scale=1.0, scale=None,
            layout="NHD", block_storage="dense", page_table_dtype="int32", page_table_pad=0, spare_pages=1,
            extra_pages=0, perm_seed=3, seed=6)


@pytest.fixture(scope="module")
def policy():
    return parity_policy.load()


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()])


@pytest.mark.parametrize("kv", ["same", "float8_e4m3fn"])
def test_input_bytes_count_the_tensors_a_case_holds(kv):
    case = build_case(dict(BASE, kv_dtype=kv, k_scale=0.5 if kv != "same" else 1.0))
    inputs = materialize(case)
    held = sum(t.numel() * t.element_size() for t in inputs.tensors().values() if t is not inputs.page_table)
    est = footprint.input_bytes(case)
    assert held <= est <= held * 1.5 and footprint.pool_elements(case) == inputs.k_pool.numel()
    longer = build_case(dict(BASE, context_lens=[3000, 77]))
    assert footprint.run_bytes(longer) > footprint.run_bytes(case) > footprint.run_bytes(case, hardening=False)


def test_hardening_steps_that_do_not_fit_are_skipped_and_said_so(policy):
    """A 2-request case (isolation is checked for seed % 3 == 0) with memory for its inputs and little more:
    the verdict still comes from the oracle, and every step left out says why, in the outcome, the report
    entry and summary.md."""
    case = build_case(BASE)
    tight = RunOptions(memory_bytes=footprint.input_bytes(case) + 1024)
    out = run_case(lowerings.get("context"), case, policy, tight, lowerings.get("sdpa"))
    assert out.status == "pass"
    assert set(out.skipped) == {memory.YARDSTICK, memory.UNTOUCHED, memory.RERUN}
    assert "untouched-input check skipped: a snapshot of the inputs to compare against needs" in out.skipped[memory.UNTOUCHED]
    assert out.main.figures.get("yardstick_max_abs") is None  # no yardstick comparison was made
    roomy = run_case(lowerings.get("context"), case, policy, RunOptions(memory_bytes=64 << 30), lowerings.get("sdpa"))
    assert roomy.skipped == {} and roomy.main.figures.get("yardstick_max_abs") is not None
    # Between the two: the re-run fits, the isolation run after it does not.
    need = footprint.input_bytes(case) * (1 + footprint.LOWERING_COPIES)
    mid = RunOptions(memory_bytes=footprint.input_bytes(case) + int(need / memory.HEADROOM) + 1)
    assert memory.ISOLATION not in run_case(lowerings.get("context"), case, policy, mid).skipped  # seed 6: isolation runs
    # The report counts them per check.
    rep = check_lowering(lowerings.get("context"), policy, strategy=check_cases(lowerings.get("context"), "cpu").strategy,
                         settings=profile_settings("ci", max_examples=5), opts=RunOptions(memory_bytes=1),
                         yardstick=lowerings.get("sdpa"))
    data = to_json([rep], device="cpu", profile="ci", tolerances="t")
    entry = data["lowerings"]["context"]
    assert entry["status"] == "pass" and entry["skipped"][memory.UNTOUCHED]["cases"] == rep.cases
    assert f"untouched-input check skipped on {rep.cases} case(s) for lack of device memory" in summary_md(data)


def test_isolation_is_skipped_alone_when_only_it_does_not_fit(policy):
    case = build_case(dict(BASE, seed=3))  # seed % 3 == 0: this case runs the isolation check
    asked = []

    class IsolationDoesNotFit(memory.InProcessMemory):
        def fits(self, outcome, check, case_, opts, need, what):
            asked.append(check)
            if check == memory.ISOLATION:
                outcome.skipped[check] = memory.skip_message(check, what, need, 0, "cpu")
                return False
            return True

    with ports.installed(memory=IsolationDoesNotFit()):  # the memory port, as a device with no room would answer
        out = run_case(lowerings.get("context"), case, policy, RunOptions(), lowerings.get("sdpa"))
    assert out.status == "pass" and list(out.skipped) == [memory.ISOLATION] and memory.ISOLATION in asked


def test_drawn_histograms_count_merge_and_show():
    d = drawn.new()
    for L in (0, 5, 300, 4096, 4097, 70000):
        drawn.add(d, build_case(dict(BASE, context_lens=[L], head_dim=128, kv_dtype="float8_e4m3fn", k_scale=2.0)))
    assert d["context"] == {"0": 1, "1-127": 1, "128-2047": 1, "2048-4096": 1, "4097-32768": 1, "32769-131072": 1}
    assert d["kv_dtype"] == {"fp8": 6} and d["head_dim"] == {"128": 6} and drawn.long_share(d) == (2, 6)
    merged = drawn.merge([d, d, None])
    assert merged["context"]["0"] == 2 and merged["kv_dtype"]["fp8"] == 12
    lines = "\n".join(drawn_summary_lines({"x": {"drawn": d}}))
    assert "| `x` | 1 | 1 | 1 | 1 | 1 | 1 | 33% | bf16 100% | fp8 100% | 128 100% | 0 |" in lines


def test_report_and_shards_carry_the_drawn_histogram(policy, tmp_path):
    lw = lowerings.get("sdpa")
    plan = check_cases(lw, "cpu", profile="ci")
    rep = check_lowering(lw, policy, strategy=plan.strategy, boundaries=plan.boundaries,
                         settings=profile_settings("ci", max_examples=3), opts=RunOptions(), yardstick=lw)
    data = write_reports(tmp_path, [rep], device="cpu", profile="ci", tolerances="t")
    entry = json.loads((tmp_path / "parity.json").read_text())["lowerings"]["sdpa"]
    assert sum(entry["drawn"]["context"].values()) == entry["cases"] == rep.cases
    assert entry["drawn"]["context"]["4097-32768"] >= 2  # the 2^12 boundary cases
    assert "## Drawn cases" in (tmp_path / "summary.md").read_text()
    merged = merge_entries([data["lowerings"]["sdpa"], data["lowerings"]["sdpa"]])
    assert merged["drawn"]["context"] == {k: 2 * v for k, v in entry["drawn"]["context"].items()}


def test_a_boundary_failure_the_random_draw_misses_is_still_reported(policy, single_threaded_torch):
    """A bug on one page-boundary case only (L + K = 32 with K = 4): the boundary phase catches it, the
    random cases never reach it, and the report keeps the boundary case, marked not shrunk, and says so."""

    class OnePageBoundary(te.Context):
        name = "only_on_a_page_boundary"

        def run(self, inputs):
            res = super().run(inputs)
            c = inputs.case
            if c.block_size == 4 and c.context_lens == (28,):
                return LoweringResult(out=res.out * 2, lse=res.lse)
            return res

    lw = OnePageBoundary()
    plan = check_cases(lw, "cpu", profile="ci")
    rep = check_lowering(lw, policy, strategy=plan.strategy, boundaries=plan.boundaries,
                         settings=profile_settings("ci", max_examples=15), opts=RunOptions(),
                         yardstick=lowerings.get("sdpa"))
    assert rep.status == "fail" and len(rep.failures) == 1 and not rep.failures[0].shrunk
    assert rep.failures[0].outcome.case.context_lens == (28,)
    assert rep.failures[0].classification.runs_line == "failed 4 of 4 runs"  # re-run like any failure
    assert any("caught by the boundary case (L + K = 32 keys, page boundary exactly (page 16)) run before the random "
               "draw, which did not reach it" in x for x in rep.extra), rep.extra


def test_a_generic_bug_caught_by_a_boundary_case_is_still_shrunk(policy, single_threaded_torch):
    """Boundary cases run first, but a bug that any case shows is shrunk by the random phase as before."""
    lw = M.catalogue()["mutant:scale_hardcoded"]
    plan = check_cases(lw, "cpu", profile="ci")
    rep = check_lowering(lw, policy, strategy=plan.strategy, boundaries=plan.boundaries,
                         settings=profile_settings("ci"), opts=RunOptions(), yardstick=lowerings.get("sdpa"))
    case = rep.failures[0].outcome.case
    assert rep.failures[0].shrunk and case.context_lens == (0,) and case.block_size == 1, case.short()


@pytest.mark.parametrize("window", [("noncausal", None), ("noncausal_swa", 9), ("causal", None)])
@pytest.mark.parametrize("dtype,kv", [("bfloat16", "same"), ("float16", "float8_e4m3fn")])
def test_sdpa_head_group_path_gives_the_same_bits(window, dtype, kv, monkeypatch):
    """Past SDPA_GROUPED_ELEMENTS the yardstick runs one KV head's query group at a time (memory bounded by
    a group): bit for bit what it computes with every head at once."""
    case = build_case(dict(BASE, window=window, dtype=dtype, kv_dtype=kv, k_scale=0.5 if kv != "same" else 1.0))
    whole = te.Sdpa().run(materialize(case))
    monkeypatch.setattr(te, "SDPA_GROUPED_ELEMENTS", 0)
    grouped = te.Sdpa().run(materialize(case))
    assert torch.equal(_bits(whole.out), _bits(grouped.out)) and torch.equal(whole.lse, grouped.lse)


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_isolation_perturbation_negates_one_request_context_only(layout):
    case = build_case(dict(BASE, layout=layout, kv_dtype="float8_e4m3fn", k_scale=2.0, v_scale=0.5))
    got, want = materialize(case), materialize(case)
    negate_context(got, 1)
    for t in range(case.context_lens[1]):  # the reference: one token at a time
        page, slot = case.pages[1][t // case.page_size], t % case.page_size
        for pool in (want.k_pool, want.v_pool):
            view = pool[page, slot] if layout == "NHD" else pool[page, :, slot]
            view.copy_((-view.float()).to(pool.dtype))
    for a, b in ((got.k_pool, want.k_pool), (got.v_pool, want.v_pool)):
        assert torch.equal(_bits(a), _bits(b))
    assert not torch.equal(_bits(got.k_pool), _bits(materialize(case).k_pool))


def _drawn_cases(policy, lowering) -> list[str]:
    seen: list[str] = []

    class Record:
        def run(self, name, case):
            seen.append(case.to_json(indent=None))
            from parity.engine.runner import CaseOutcome
            return CaseOutcome(name, case, "pass")

    plan = check_cases(lowering, "cpu", profile="ci")
    check_lowering(lowering, policy, strategy=plan.strategy, settings=profile_settings("ci", max_examples=40),
                   opts=RunOptions(), executor=Record())
    return seen


def test_draws_do_not_depend_on_the_modules_a_process_imported(policy, tmp_path, monkeypatch):
    """hypothesis mixes constants from every loaded local module into its draws; a check does not let it
    (strategies._determinism), so a `--jobs` child draws what a serial run or a pytest worker draws."""
    import importlib
    import sys

    lw = lowerings.get("decode_rows")
    before = _drawn_cases(policy, lw)
    mod = tmp_path / "dflash_many_constants.py"
    mod.write_text("VALUES = [" + ", ".join(str(v) for v in range(1, 300)) + ", "
                   + ", ".join(str(v) for v in range(4097, 131072, 997)) + "]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.import_module("dflash_many_constants")
    try:
        assert _drawn_cases(policy, lw) == before
        from parity.engine import search  # the negative control: with the pool on, the same draws differ

        monkeypatch.setattr(search, "seed_only_draws", lambda: __import__("contextlib").nullcontext())
        try:
            from hypothesis.internal.conjecture import providers
            providers.CONSTANTS_CACHE.cache.clear()
        except (ImportError, AttributeError):
            pytest.skip("this hypothesis draws no constants from local modules")
        assert _drawn_cases(policy, lw) != before
    finally:
        sys.modules.pop("dflash_many_constants", None)


def test_large_cases_on_one_gpu_lease_their_bytes(tmp_path):
    """The ledger `check --jobs N` processes share on a GPU: a large case runs when the leases held fit with
    it (or none is held), waits otherwise, and a dead process's lease does not block anyone."""
    import os
    import subprocess
    import sys

    path = tmp_path / "ledger.json"
    me, other = os.getpid(), os.getppid()  # two live processes
    assert shared_memory.lease(path, 70, 100, pid=other)
    assert not shared_memory.lease(path, 40, 100, pid=me)  # 70 + 40 > 100: wait
    assert shared_memory.lease(path, 30, 100, pid=me)  # fits beside it
    shared_memory.release(path, pid=me)
    shared_memory.release(path, pid=other)
    assert shared_memory.lease(path, 500, 100, pid=me), "alone, a case larger than the cap still runs"
    shared_memory.release(path, pid=me)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    assert shared_memory.lease(path, 90, 100, pid=dead.pid)
    assert shared_memory.lease(path, 90, 100, pid=me), "a dead process's lease is dropped"
    assert json.loads(path.read_text()) == {str(me): 90}


def test_a_small_case_or_a_cpu_run_takes_no_lease():
    case = build_case(BASE)
    with shared_memory.device_lease(case, RunOptions(device="cpu")) as held:
        assert held.path is None and held.waited == 0.0
