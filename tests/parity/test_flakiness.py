"""Flakiness classified before it is named, flaky failures shrunk, the stream sanitizer's plumbing (issue 14).

Mutants (`tests/hardening_mutants.py`): `stale_running_max` seeds its running max from a workspace the previous
call left (within tolerance; LSEs ~1e-7 apart after another case), `reads_before_written` hands out its output
before the work that fills it ran on one call in three (a missing stream sync, modelled on a CPU). Each is
named nondeterministic (never a canary read), shrunk to B=1, with "failed k of R runs" in its failure file;
the canary-read mutant stays a canary read. CPU only; the GPU mutants are in tests/lowerings/test_gpu_mutants.py.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

import lowerings
from lowerings.protocol import LoweringResult
from lowerings.torch_emulation import Sdpa, WindowedMerge
from oracle.case import Case
from parity.front import cli, cmd_repro
from parity.engine import flakiness as fl
from parity.exec import sanitizer
from parity.engine import policy as parity_policy
from parity.exec.isolation import IsolatedExecutor
from parity.report.files import write_reports
from parity.engine.runner import CaseOutcome, RunOptions, check_lowering, run_case
from strategies import Limits, Profile, build_case, cases, profile_settings
from tests import hardening_mutants as H

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = ROOT / "tests" / "hardening_plugin.py"
SMALL = Limits(max_batch=4, max_context=40)

pytestmark = pytest.mark.usefixtures("restore_registry", "single_threaded_torch")  # tests/conftest.py


@pytest.fixture(scope="module")
def policy():
    return parity_policy.load()


def _case(**over) -> Case:
    base = dict(context_lens=[5, 17], block_size=3, num_kv_heads=2, group=2, head_dim=64, page_size=16,
                window=("noncausal", None), dtype="bfloat16", kv_dtype="same", k_scale=1.0, v_scale=1.0, scale=None,
                layout="NHD", block_storage="dense", page_table_dtype="int32", page_table_pad=0, spare_pages=1,
                extra_pages=0, perm_seed=7, seed=3)
    return build_case(dict(base, **over))


def _check(lowering, policy, tmp_path, *, executor=None, sanitizer_fn=None):
    t0 = time.perf_counter()
    rep = check_lowering(lowering, policy, strategy=cases(lowering, limits=SMALL),
                         settings=profile_settings("ci", max_examples=30), opts=RunOptions(device="cpu"),
                         yardstick=lowerings.get("sdpa"), executor=executor, sanitizer=sanitizer_fn)
    write_reports(tmp_path, [rep], device="cpu", profile="ci", tolerances="t")
    files = sorted((tmp_path / "failures").glob("*.json"))
    saved = json.loads(files[0].read_text()) if files else {}
    print(f"{lowering.name}: {rep.status} in {time.perf_counter() - t0:.1f}s, {rep.cases} cases; "
          f"{saved.get('runs')}; {saved.get('failures')}; {rep.extra}")
    return rep, saved


# ---- the mutants: named, shrunk, counted ------------------------------------------------------------------

def test_stale_workspace_is_nondeterministic_state_dependent_and_shrunk(policy, tmp_path, capsys):
    """The issue's CPU case: reported as "read outside the request's keys" (B=32, unshrunk) before."""
    rep, saved = _check(H.StaleRunningMax(), policy, tmp_path)
    assert rep.status == "fail" and len(rep.failures) == 1
    f = rep.failures[0]
    first = f.outcome.failures[0]
    assert first.startswith(fl.NONDETERMINISTIC) and fl.STATE in first, first
    assert "read outside" not in " ".join(f.outcome.failures)
    assert f.shrunk and f.outcome.case.batch_size == 1, f.outcome.case.short()
    c = f.classification
    assert c.kind == "nondeterministic" and c.depends_on_history and c.probe.state and not c.probe.race
    assert saved["runs"] == c.runs_line and saved["runs"].startswith("failed ") and " of 4 runs" in saved["runs"]
    assert saved["classification"]["history"] and saved["classification"]["depends_on_history"]
    # replayed with its history, the saved failure fails again
    saved_file = next((tmp_path / "failures").glob("hardening_stale_running_max*-1.json"))  # (a hashed name: ':')
    code = cli.main(["repro", str(saved_file), "--plugin",
                     str(PLUGIN), "--device", "cpu"])
    out = capsys.readouterr().out
    assert code == 1 and "case(s) that ran before it (the failure depends on the state a previous call leaves)" in out
    assert fl.NONDETERMINISTIC in out


def test_a_missing_sync_is_a_race_shrunk_with_its_run_count(policy, tmp_path):
    rep, saved = _check(H.ReadsBeforeWritten(), policy, tmp_path)
    f = rep.failures[0]
    first = f.outcome.failures[0]
    assert first.startswith(fl.NONDETERMINISTIC) and "back-to-back runs on the same inputs" in first, first
    assert fl.STATE not in first and f.classification.probe.race
    assert f.outcome.case.batch_size == 1 and f.outcome.case.block_size == 1, f.outcome.case.short()
    k = f.classification.failed
    assert 0 < k <= 4 and saved["runs"] == f"failed {k} of 4 runs" and first.endswith(f"failed {k} of 4 runs")


def test_a_canary_read_stays_a_canary_read(policy, tmp_path):
    rep, saved = _check(H.ReadsPageTail(), policy, tmp_path)
    f = rep.failures[0]
    assert f.outcome.failures[0].startswith("read outside the request's keys"), f.outcome.failures
    assert not any(fl.NONDETERMINISTIC in m for m in f.outcome.failures)
    assert f.classification.kind == "reproducible" and saved["runs"] == "failed 4 of 4 runs"
    assert not f.classification.probe.varies


def test_classified_in_the_worker_when_isolated(policy, tmp_path):
    with IsolatedExecutor(plugins=[PLUGIN], opts=RunOptions(device="cpu"), case_timeout=60,
                          inflight_dir=tmp_path / "inflight", num_threads=1) as ex:
        probe = ex.probe(H.ReadsBeforeWritten.name, _case(), 4)
        assert probe.race and probe.runs == 4
        rep, saved = _check(H.ReadsBeforeWritten(), policy, tmp_path / "r", executor=ex)
    assert rep.failures[0].outcome.failures[0].startswith(fl.NONDETERMINISTIC)
    assert rep.failures[0].outcome.case.batch_size == 1 and saved["runs"].endswith("of 4 runs")


# ---- everything a lowering returns is compared ----------------------------------------------------------------

class LseDrifts(Sdpa):
    """Correct output bits; its LSE moves by 1e-6 from call to call (the output alone agrees)."""

    name = "test:lse_drifts"

    def __init__(self) -> None:
        self.calls = 0

    def run(self, inputs):
        res = super().run(inputs)
        self.calls += 1
        return LoweringResult(out=res.out, lse=res.lse + self.calls * 1e-6)


class PartialDrifts(WindowedMerge):
    """Correct output and LSE; its part B's LSE moves from call to call."""

    def __init__(self) -> None:
        super().__init__(form="eager")
        self.name, self.calls = "test:partial_drifts", 0

    def run(self, inputs):
        res = super().run(inputs)
        self.calls += 1
        b = res.partials["B"]
        res.partials["B"] = type(b)(out=b.out, lse=b.lse + self.calls * 1e-6, lse_base=b.lse_base, window=b.window,
                                    future_block_keys_right=b.future_block_keys_right)
        return res


@pytest.mark.parametrize("lw,case,what", [
    (LseDrifts(), _case(), "the LSE"),
    (PartialDrifts(), _case(window=("noncausal_swa", 2), context_lens=[9, 3]), "partial B LSE"),
])
def test_what_varies_is_compared_whatever_part_it_is(lw, case, what, policy):
    out = run_case(lw, case, policy, RunOptions(), lowerings.get("sdpa"))
    assert out.status == "fail" and not any("read outside" in m for m in out.failures), out.failures
    assert any(m.startswith(fl.NONDETERMINISTIC) and f"changed {what} (" in m for m in out.failures), out.failures


# ---- the pieces -------------------------------------------------------------------------------------------

def _stub(status: str) -> CaseOutcome:
    return CaseOutcome("x", _case(), status)


@pytest.mark.parametrize("first,alone,after,probe,kind", [
    ("hung: no result after 3 s; worker killed", "fail", "fail", None, "hang"),
    ("crashed: worker killed by SIGSEGV (signal 11) while running this case", "pass", "pass", None, "not reproduced"),
    ("crashed: worker killed by SIGSEGV (signal 11) while running this case", "fail", "fail", None, "crash"),
    ("output: max |O - O_ref| = 1", "pass", "fail", fl.Probe(4, ("", "", "")), "state"),
    ("output: max |O - O_ref| = 1", "pass", "pass", fl.Probe(4, ("", "", "")), "not reproduced"),
    ("output: max |O - O_ref| = 1", "fail", "fail", fl.Probe(4, ("", "", "")), "reproducible"),
    ("output: max |O - O_ref| = 1", "fail", "fail", fl.Probe(4, ("", "the output (1 element(s))", "")),
     "nondeterministic"),
])
def test_classify_names_each_kind(first, alone, after, probe, kind):
    history = (_case(context_lens=[1]),)
    state = {"after": False}

    def judge(c):
        out = _stub(after if state["after"] else alone)
        return out

    def leave(c):
        state["after"] = True

    failing = CaseOutcome("x", _case(), "fail", failures=[first])
    c = fl.classify(Sdpa(), failing, history, runs=4, judge=judge, leave=leave,
                    prober=(lambda *a: probe) if probe is not None else None)
    assert c.kind == kind, c
    if kind == "state":
        assert c.message.startswith(fl.STATE) and c.runs_line == "failed 0 of 4 runs alone, 4 of 4 after a previous case"
    if kind == "nondeterministic":
        assert c.probe.race and c.message.startswith(fl.NONDETERMINISTIC)


def test_shrinking_run_case_skips_to_the_target_and_keeps_its_verdicts():
    target, other = _case(context_lens=[4]), _case(context_lens=[2])
    runs, left = [], []

    def run_case(lw, case, *a):
        runs.append(case)
        return CaseOutcome("x", case, "fail" if case == target and runs.count(target) == 3 else "pass")

    s = fl.ShrinkingRunCase(run_case, target, 4, history=(other,), leave=left.append)
    lw = Sdpa()
    assert s(lw, other, None, None, None).status == fl.SKIPPED and not runs  # before the target: not run
    assert s(lw, target, None, None, None).status == "fail" and len(runs) == 3 and left == [other] * 3
    assert s(lw, target, None, None, None).status == "fail" and len(runs) == 3  # the kept verdict
    assert s(lw, other, None, None, None).status == "pass" and len(runs) == 7  # failing: every case runs, R times


def test_profile_flaky_runs_is_validated():
    with pytest.raises(ValueError, match="flaky_runs must be an integer >= 2"):
        Profile("x", 10, True, False, "d", flaky_runs=1)
    with pytest.raises(ValueError, match="flaky_runs"):
        check_lowering(Sdpa(), parity_policy.load(), strategy=cases(Sdpa()), settings=profile_settings("ci"),
                       flaky_runs=1)


# ---- the stream sanitizer: the CPU side of its plumbing -----------------------------------------------------

FAKE_CSAN_PLUGIN = '''
import os
from lowerings import register
from lowerings.torch_emulation import Sdpa

class CUDASanitizerErrors(Exception):  # the name torch.cuda._sanitizer raises, with its `errors`
    def __init__(self, errors):
        self.errors = errors

class FakeRace(Sdpa):
    name = "fake_csan_race"
    def run(self, inputs):
        res = super().run(inputs)
        if os.environ.get("DFLASH_PARITY_SANITIZER") == "1":
            raise CUDASanitizerErrors(["============================\\nCSAN detected a possible data race on tensor "
                                       "with data pointer 1234\\nAccess by stream 0 during kernel:\\naten::sum(Tensor "
                                       "self) -> Tensor\\nreading from argument(s) self\\nWith stack trace:\\n  File "
                                       "judge.py, line 1\\n\\nPrevious access by stream 77 during kernel:\\n"
                                       "aten::copy_(Tensor(a!) self, Tensor src) -> Tensor(a!)\\nwriting to argument(s) "
                                       "self, and to the output\\nWith stack trace:\\n  File lowering.py, line 9\\n"])
        return res

register(FakeRace())
'''


def test_sanitizer_replay_reports_a_finding_and_says_plainly_when_there_is_none(tmp_path):
    plugin = tmp_path / "fake_csan.py"
    plugin.write_text(FAKE_CSAN_PLUGIN)
    found = sanitizer.replay("fake_csan_race", _case(), _case(context_lens=[1]), plugins=[plugin], device="cpu")
    assert found.startswith(sanitizer.FOUND + ":\n"), found
    assert "Previous access by stream 77 during kernel" in found and "lowering.py, line 9" in found
    line = sanitizer.summary_line(found)
    assert line.startswith(sanitizer.FOUND) and "Access by stream 0 during kernel" in line and "stacks" in line
    clean = sanitizer.replay("sdpa", _case(), None, device="cpu")
    assert clean.startswith(sanitizer.NOTHING) and "sees accesses through PyTorch only" in clean
    broken = sanitizer.parse_output(1, "", "Traceback (most recent call last):\noracle.errors.InvalidInput: --lowering: "
                                              "unknown lowering 'nope'")
    assert broken.startswith(sanitizer.COULD_NOT) and "exited with code 1" in broken and "'nope'" in broken
    assert sanitizer.replay_env("cuda")["TORCH_CUDA_SANITIZER"] == "1"  # CSAN on as torch is imported
    assert "TORCH_CUDA_SANITIZER" not in sanitizer.replay_env("cpu")  # a CPU build cannot enable it


def test_the_sanitizer_report_is_attached_to_a_nondeterministic_failure(policy, tmp_path):
    asked = []

    def fake_sanitizer(name, case, history):
        asked.append((name, case, history))
        return f"{sanitizer.FOUND}:\n============================\nCSAN detected a possible data race on tensor x"

    rep, saved = _check(H.ReadsBeforeWritten(), policy, tmp_path, sanitizer_fn=fake_sanitizer)
    f = rep.failures[0]
    assert asked == [(H.ReadsBeforeWritten.name, f.outcome.case, None)]
    assert saved["sanitizer"].startswith(sanitizer.FOUND)
    assert f.outcome.failures[-1].startswith(sanitizer.FOUND) and "CSAN detected" in f.outcome.failures[-1]
    rep2, _ = _check(H.ReadsPageTail(), policy, tmp_path / "canary", sanitizer_fn=fake_sanitizer)
    assert len(asked) == 1  # a canary read is not replayed under the sanitizer


def test_repro_replays_last_the_history_case_after_which_the_result_changed(tmp_path):
    """The probe saw the result change after history case 1 (of 3, latest first): the replay runs the other
    two oldest first, then case 1, then the case (on a CPU whose rounding hides the difference after the
    latest case, replaying in plain order left the failure unreproduced)."""
    hist = [_case(context_lens=[n]) for n in (1, 2, 3)]  # latest first, as a failure file stores them
    wrapper = {"classification": {"depends_on_history": True, "history": [h.to_json_dict() for h in hist],
                                  "probe": {"after_history": ["", "the LSE (1 element(s))", ""]}}}
    assert cmd_repro.history_of(wrapper, tmp_path / "f.json") == [hist[2], hist[0], hist[1]]
    wrapper["classification"]["probe"]["after_history"] = ["", "", ""]
    assert cmd_repro.history_of(wrapper, tmp_path / "f.json") == [hist[2], hist[1], hist[0]]
