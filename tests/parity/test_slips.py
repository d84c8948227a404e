"""A failure that slips while shrinking (issue 47, point 7; `parity.engine.slips`): a lowering with two bugs whose
shrink starts from a failure of one and ends on a case of the other reports both, each with its own
replayable case file and messages, and says so in the notes (console, `summary.md`, pytest's message).

The two-bug lowering: the output of a context of 32 keys or more is off (bug A: `output`); a shorter,
non-empty context whose value seed is 0 takes a fallback kernel (bug B: `kernel calls`). The derandomized
search meets bug A first (a long context); its shrink takes the seed to 0 (bug A does not need another)
and tries shorter contexts, which then fail for bug B, and follows them: before `parity.engine.slips`, the
check reported bug B alone and bug A was lost.
"""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, settings, strategies as st
from hypothesis.database import InMemoryExampleDatabase

import lowerings
from lowerings import counters, registry
from oracle.case import Case, pages_needed
from parity.front import cli, cmd_check
from parity.engine import slips
from parity.engine import policy as parity_policy
from parity.engine.hardening import output_buffer_failures  # noqa: F401  (the producer of the "output buffers" lines)
from parity.engine.judge import Comparison
from parity.front.pytest_parts import failure_text
from parity.report.files import plugin_records, replay_args, write_reports
from parity.engine.result_bits import nondeterminism_message
from parity.engine.runner import CaseOutcome, RunOptions, check_lowering

pytestmark = pytest.mark.usefixtures("restore_registry", "single_threaded_torch")  # tests/conftest.py

PLUGIN = '''
from lowerings import LoweringResult, counters, register
from lowerings.torch_emulation import Sdpa


class TwoBugs(Sdpa):
    """Bug A: the output of a context of 32 keys or more is off. Bug B: a shorter, non-empty context with
    value seed 0 takes a fallback kernel."""

    name = "two_bugs"
    A_ONLY = False

    def run(self, inputs):
        res = super().run(inputs)
        L = max(inputs.case.context_lens)
        if L >= 32:
            return LoweringResult(out=res.out + 1.0, lse=res.lse)
        if L >= 1 and inputs.case.seed == 0 and not self.A_ONLY:
            counters.record("torch.sdpa_fallback")
        return res


class OneBug(TwoBugs):
    name = "one_bug"
    A_ONLY = True


register(TwoBugs())
register(OneBug())
'''


def _one(L: int, seed: int) -> Case:
    n = pages_needed(L, 1, 16)
    return Case(context_lens=(L,), block_size=1, num_q_heads=1, num_kv_heads=1, head_dim=16, page_size=16,
                pages=(tuple(range(n)),), num_pages=n + 1, seed=seed)


def _two(L0: int, L1: int, seed: int) -> Case:
    n0, n1 = pages_needed(L0, 1, 16), pages_needed(L1, 1, 16)
    return Case(context_lens=(L0, L1), block_size=1, num_q_heads=1, num_kv_heads=1, head_dim=16, page_size=16,
                pages=(tuple(range(n0)), tuple(range(n0, n0 + n1))), num_pages=n0 + n1 + 1, seed=seed)


ONE_REQUEST = st.builds(_one, st.integers(0, 63), st.integers(0, 1000))
SHRINK = [Phase.explicit, Phase.generate, Phase.shrink]


def _settings(phases=SHRINK, **over):
    kw = dict(max_examples=30, derandomize=True, database=None, deadline=None, report_multiple_bugs=False,
              suppress_health_check=list(HealthCheck), print_blob=False, phases=phases)
    return settings(**{**kw, **over})


@pytest.fixture
def plugin(tmp_path) -> Path:
    p = tmp_path / "two_bugs.py"
    p.write_text(PLUGIN)
    lowerings.load_plugin(str(p))
    return p


def _check(name: str, strategy=ONE_REQUEST, **kw):
    kw.setdefault("settings", _settings())
    return check_lowering(lowerings.get(name), parity_policy.load(), strategy=strategy, opts=RunOptions(device="cpu"),
                          **kw)


def test_a_shrink_that_slips_reports_both_failures_each_replayable(plugin, tmp_path, capsys):
    rep = _check("two_bugs")
    assert [slips.reasons(f.outcome) for f in rep.failures] == [{"output"}, {"kernel calls"}], rep.extra
    a, b = (f.outcome for f in rep.failures)
    assert a.case.context_lens == (32,) and b.case.context_lens == (1,) and b.case.seed == 0  # each shrunk on its own
    assert all(f.shrunk for f in rep.failures) and rep.failures[0].slip.startswith("the first failure (output), shrunk")
    assert rep.failures[1].slip.startswith("where the shrink of the first failure (output) ended")
    note = next(e for e in rep.extra if e.startswith("the shrink slipped from one failure to another"))
    assert "fails for another reason (kernel calls)" in note and a.case.short() in note and b.case.short() in note
    assert rep.failures[0].classification.runs_line == "failed 4 of 4 runs"  # each classified as any failure

    report = tmp_path / "report"
    data = write_reports(report, [rep], device="cpu", profile="ci", tolerances="tolerances.toml",
                         replay=replay_args("cpu", None), plugins={"two_bugs": plugin_records([plugin])})
    files = sorted((report / "failures").glob("*.json"))
    assert [f.name for f in files] == ["two_bugs-1.json", "two_bugs-2.json"]
    saved = [json.loads(f.read_text()) for f in files]
    assert saved[0]["failures"][0].startswith("output: max |O - O_ref|") and saved[0]["slip"]
    assert saved[1]["failures"] == ["kernel calls: expected torch.sdpa x1, got torch.sdpa x1, torch.sdpa_fallback x1 "
                                    "(unexpected: torch.sdpa_fallback)"] and saved[1]["slip"]
    entry = data["lowerings"]["two_bugs"]
    assert [f["slip"] for f in entry["failures"]] == [f.slip for f in rep.failures]
    summary = (report / "summary.md").read_text()
    assert f"- {note}" in summary and "failures/two_bugs-1.json" in summary and "failures/two_bugs-2.json" in summary
    assert note in failure_text(rep, "cpu")  # the pytest plugin's message of a failed test
    cmd_check.finish(types.SimpleNamespace(quiet=True, allow_nothing_judged=False), data, report, 0.0)  # the console
    assert f"two_bugs: {note}" in capsys.readouterr().out

    with registry.restored():  # replayed as a user would, the plugin loaded from the file's record
        registry.unregister("two_bugs")
        registry.unregister("one_bug")
        for f, phrase in zip(files, ("output: max |O - O_ref|", "kernel calls: expected torch.sdpa x1")):
            code = cli.main(["repro", str(f), "--no-isolate"])
            out = capsys.readouterr().out
            assert code == 1 and phrase in out, out
            registry.unregister("two_bugs")
            registry.unregister("one_bug")


def test_no_slip_no_second_shrink(plugin):
    """One bug: one failure, shrunk to its smallest case, no note, no search again."""
    rep = _check("one_bug")
    assert len(rep.failures) == 1 and rep.failures[0].outcome.case.context_lens == (32,), rep.extra
    assert rep.failures[0].slip == "" and not any("slipped" in e for e in rep.extra)


def test_draws_that_cannot_be_replayed_report_the_first_failure_as_found(plugin, monkeypatch):
    """A search that cannot be drawn again (random, targeted, or with an example database): the first failure
    is reported as found (not shrunk, saying why), the one the shrink ended on after it."""
    assert slips.replayable(_settings(), None, False) and slips.replayable(_settings(derandomize=False), 5, False)
    assert not slips.replayable(_settings(derandomize=False), None, False)
    assert not slips.replayable(_settings(), None, True)
    assert not slips.replayable(_settings(derandomize=False, database=InMemoryExampleDatabase()), 5, False)
    monkeypatch.setattr(slips, "replayable", lambda *a: False)
    rep = _check("two_bugs", flaky_runs=0)
    first, last = rep.failures
    assert not first.shrunk and "its draws cannot be replayed" in first.slip and last.shrunk
    assert slips.reasons(first.outcome) == {"output"} and slips.reasons(last.outcome) == {"kernel calls"}
    assert first.outcome.case.context_lens[0] > 32  # as drawn, not shrunk


def test_the_case_reducer_slips_and_reduces_the_first_failure_again(plugin):
    """hypothesis's shrink phase off (the `scale` profile): the case reducer cuts a two-request case (both
    requests long: bug A) to one request, then bisects its length into bug B's range; reduced again where
    only bug A's reason counts, the first failure ends at 32 keys."""
    strategy = st.builds(_two, st.integers(32, 63), st.integers(32, 63), st.just(0))
    rep = _check("two_bugs", strategy=strategy, settings=_settings(phases=[Phase.explicit, Phase.generate]),
                 flaky_runs=0)
    assert [slips.reasons(f.outcome) for f in rep.failures] == [{"output"}, {"kernel calls"}], rep.extra
    assert rep.failures[0].outcome.case.context_lens == (32,) and rep.failures[1].outcome.case.batch_size == 1
    assert sum("shrunk by the case reducer" in e for e in rep.extra) == 2, rep.extra
    assert any(e.startswith("the shrink slipped") for e in rep.extra)


def _outcome(failures, comparisons=()) -> CaseOutcome:
    return CaseOutcome("lw", _one(3, 1), "fail", failures=list(failures), comparisons=list(comparisons))


def test_each_kind_of_message_has_its_reason():
    """The reason of every kind of failure message (`slips.reasons`), and a planted unknown one is `other`."""
    out_msg = "output: max |O - O_ref| = 1 = 9 ulp of max|O_ref| = 1 (bound 8 ulp) at request 0"
    lse_msg = "output: max |LSE - LSE_ref| = 0.1 (natural log; bound 0.001) at request 0"
    nonfinite_lse = "output LSE: 3 non-finite value(s) where the oracle is finite; first nan at request 0"
    part_out = "partial B: relative L2 error 0.5 >= 0.01"
    part_lse = "partial B LSE: a row with no visible key must give -inf"
    comps = [Comparison("output", failures=[out_msg, lse_msg, nonfinite_lse]),
             Comparison("partial B", failures=[part_out, part_lse])]
    assert slips.reasons(_outcome([out_msg, lse_msg, nonfinite_lse, part_out, part_lse], comps)) == {
        "output", "LSE", "partial B output", "partial B LSE"}
    table = {
        counters.call_mismatch({"a": 1}, {"b": 1}): "kernel calls",
        "GPU kernels: expected prefill ('Prefill') never ran": "kernel names",
        "input mutated: k_pool was changed by the lowering (inputs must stay as given)": "inputs written",
        "read outside the request's keys: the output of request(s) [0] changed when ...": "canary read",
        "output with large canaries: max |O - O_ref| = 3": "canary read",
        nondeterminism_message("a run changed the output", False): "nondeterministic",
        "request isolation: negating request 1's context changed the output of request(s) [0]": "request isolation",
        "crashed: worker killed by SIGSEGV (signal 11) while running this case": "crash",
        "hung: no result after 5 s; worker killed": "hang",
        "out of device memory, twice: ...": "out of memory",
        "second run (canary large): lw raised RuntimeError: boom": "raised",
        "lw raised RuntimeError: boom (x.py:3)": "raised",
        "lw: declared lse_base 2 but returned no LSE (lse=None)": "raised",
        "lw.run returned tuple, expected LoweringResult": "raised",
        "output: returned a new tensor instead of writing the given output (out)": "output buffers",
        "LSE never written at request 0: 3 element(s) of the given lse_out still hold the poison": "output buffers",
        "output: wrote 2 element(s) past the end of the output (out, 16 guard elements checked)": "output buffers",
        "something nobody wrote yet": "other",
    }
    got = {m: slips.reasons(_outcome([m])) for m in table}
    assert got == {m: frozenset({r}) for m, r in table.items()}


def test_only_disjoint_reasons_are_a_slip():
    """A failure of output and LSE that shrinks to the LSE alone (one key: the output is that key's value)
    is the same failure; output to kernel calls on another case is a slip; on the same case, or to or from
    a nondeterministic failure (an uninitialized accumulator fails on its output or its re-run), it is not."""
    a = _outcome(["output: max |O - O_ref| = 1", "output: max |LSE - LSE_ref| = 1"],
                 [Comparison("output", failures=["output: max |O - O_ref| = 1", "output: max |LSE - LSE_ref| = 1"])])
    lse_msg = "output: max |LSE - LSE_ref| = 1"
    lse_only = _outcome([lse_msg], [Comparison("output", failures=[lse_msg])])
    calls = _outcome([counters.call_mismatch({"a": 1}, {"b": 1})])
    calls.case = _one(2, 1)
    assert not slips.slipped(a, lse_only) and not slips.slipped(lse_only, a)
    assert slips.slipped(a, calls) and slips.slipped(calls, lse_only)
    assert not slips.slipped(a, _outcome(calls.failures))  # the same case: its reasons changed, not the bug
    racy = _outcome([nondeterminism_message("a run changed the output", False)])
    racy.case = _one(2, 1)
    assert not slips.slipped(racy, lse_only) and not slips.slipped(lse_only, racy)  # a race fails either way
