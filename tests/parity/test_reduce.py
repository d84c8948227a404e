"""The case reducer (`parity.engine.reduce`): the shrinker of the `scale` profile, where hypothesis's costs hundreds
of production-scale cases. Its cuts keep a case valid and its values in place; it lands on one request and
the exact failing length; a bug that needs the large pool keeps it; its step budget holds; and run by
`check_lowering` (hypothesis's shrink phase off) it shrinks a real lowering's failure on the CPU."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import HealthCheck, Phase, settings

from oracle.case import Case, pages_needed
from oracle.inputs import materialize
from parity.engine.outcome import CaseOutcome
from parity.engine.reduce import compact_pool, drop_requests, drop_spare_pages, reduce_failure, shorten_request
from strategies import PROFILES, Limits, cases, profile_settings


def _case(lens=(30, 5, 70), K=4, ps=16, spare=40, keys=(11, 12, 13)) -> Case:
    need = [pages_needed(L, K, ps) for L in lens]
    ids = iter(range(spare, spare + sum(need)))  # owned pages at the top of the pool, spares below
    return Case(context_lens=lens, block_size=K, num_q_heads=2, num_kv_heads=1, head_dim=64, page_size=ps,
                pages=tuple(tuple(next(ids) for _ in range(n)) for n in need), num_pages=spare + sum(need),
                value_keys=keys)


def _judge(fails):
    calls = []

    def judge(case: Case) -> CaseOutcome:
        calls.append(case)
        return CaseOutcome("fake", case, "fail" if fails(case) else "pass")
    return judge, calls


def test_cuts_keep_the_case_valid_and_the_values_in_place():
    c = _case()
    one = drop_requests(c, [2])
    assert one.context_lens == (70,) and one.pages == (c.pages[2],) and one.value_keys == (13,)
    assert one.num_pages == c.num_pages  # the pool is kept: a bug may need it
    short = shorten_request(c, 2, 9)
    assert short.context_lens[2] == 9 and short.pages[2] == c.pages[2][:pages_needed(9, 4, 16)]
    small = compact_pool(c)
    assert small.num_pages == sum(len(r) for r in c.pages) + 1 and compact_pool(small) is None
    flat = [p for r in small.pages for p in r]
    assert flat == sorted(flat)  # renumbered in their order
    # the kept request's values are those it had (oracle/values.py: keyed by value_keys, a shorter context a prefix)
    full, cut = materialize(c, "cpu"), materialize(shorten_request(drop_requests(c, [2]), 0, 9), "cpu")
    assert torch.equal(full.q[2], cut.q[0])
    assert torch.equal(full.k_block[2], cut.k_block[0])


def test_lands_on_one_request_and_the_exact_length():
    c = _case(lens=(300, 2049, 70, 4100, 12), keys=(1, 2, 3, 4, 5))
    judge, calls = _judge(lambda x: max(x.context_lens) >= 2049)
    best, log = reduce_failure(CaseOutcome("fake", c, "fail"), judge)
    assert best.case.context_lens == (2049,), best.case.short()
    assert best.case.num_pages < c.num_pages  # the bug needs no large pool: compacted
    assert not log.exhausted and log.steps == len(calls) <= 20, log.line()
    assert "case reducer" in log.line() and "batch 1" in log.line()


def test_a_bug_that_needs_the_large_pool_keeps_it_within_a_factor_of_two():
    """A wrapped offset: fails once a page id the request owns passes 1000; the pool drawn is 17 times that."""
    c = _case(lens=(30, 5, 70), spare=17000)
    judge, calls = _judge(lambda x: any(p > 1000 for r in x.pages for p in r))
    best, log = reduce_failure(CaseOutcome("fake", c, "fail"), judge)
    assert best.case.batch_size == 1 and best.case.context_lens == (0,), best.case.short()
    assert 1000 < best.case.num_pages <= 2 * 1000 + 2 and max(best.case.pages[0]) > 1000
    assert log.kept["pool"] >= 3 and len(calls) <= 16, log.line()


def test_spare_pages_drop_by_arithmetic_in_a_huge_pool():
    """2**31 spare pages (a padded pool): the cut reads the owned pages only."""
    c = _case(lens=(30, 5), spare=2**31, keys=(1, 2))
    d = drop_spare_pages(c, 2**31 - 7)
    assert d.num_pages == c.num_pages - (2**31 - 7) and min(p for r in d.pages for p in r) == 7
    assert [p - 7 for r in d.pages for p in r] == list(range(sum(len(r) for r in c.pages)))
    with pytest.raises(ValueError, match="spare pages"):
        drop_spare_pages(c, 2**31 + 1)


def test_a_bug_that_needs_two_requests_keeps_two():
    c = _case(lens=(30, 5, 70, 8), keys=(1, 2, 3, 4))
    judge, _ = _judge(lambda x: x.batch_size >= 2)
    best, _ = reduce_failure(CaseOutcome("fake", c, "fail"), judge)
    assert best.case.batch_size == 2 and best.case.context_lens == (0, 0)


def test_the_step_budget_holds_and_is_said():
    c = _case(lens=(4000, 3000, 2000), keys=(1, 2, 3))
    judge, calls = _judge(lambda x: sum(x.context_lens) >= 1)
    best, log = reduce_failure(CaseOutcome("fake", c, "fail"), judge, max_steps=3)
    assert len(calls) == 3 and log.exhausted and "stopped by the step budget" in log.line()
    assert best.case.batch_size == 1  # the cuts it made are kept
    with pytest.raises(ValueError, match="max_steps"):
        reduce_failure(CaseOutcome("fake", c, "fail"), judge, max_steps=0)


def test_scale_profile_shrinks_with_the_case_reducer():
    assert PROFILES["scale"].shrinker == "cases"
    assert Phase.shrink not in profile_settings("scale").phases
    assert Phase.shrink in profile_settings("ci").phases
    with pytest.raises(ValueError, match="shrinker"):
        dataclasses.replace(PROFILES["ci"], shrinker="none")


def test_check_lowering_reduces_when_hypothesis_does_not_shrink():
    """A CPU mutant that reads a wrong page once a page id passes 40 (a wrapped offset in a large pool):
    hypothesis's shrink phase off, the case reducer shrinks it to one request and keeps the pool; a
    control with hypothesis's shrinker on runs no reducer."""
    from parity.engine import policy as parity_policy
    from parity.engine.runner import RunOptions, check_lowering
    from tests.mutant_bases import ContextMutant, context_read

    class PageIdWraps(ContextMutant):
        name = "mutant:page_id_wraps"

        def read(self, inputs):
            return context_read(inputs, table=torch.where(inputs.page_table >= 40, inputs.page_table - 40,
                                                          inputs.page_table))

    lw = PageIdWraps()
    strat = cases(lw, limits=Limits(max_batch=6, max_context=600), page_size=16, block_size=4)
    base = dict(max_examples=40, derandomize=True, database=None, deadline=None, report_multiple_bugs=False,
                suppress_health_check=list(HealthCheck))
    no_shrink = settings(phases=[Phase.explicit, Phase.generate], **base)
    judged = RunOptions(device="cpu", check_determinism=False, check_inputs_untouched=False)  # no re-runs: shrinking
    rep = check_lowering(lw, parity_policy.load(), strategy=strat, settings=no_shrink, opts=judged, flaky_runs=0)
    assert rep.status == "fail" and rep.failures, rep.extra
    case = rep.failures[0].outcome.case
    assert case.batch_size == 1 and case.num_pages > 40, case.short()
    assert any("case reducer" in e for e in rep.extra), rep.extra
    with_shrink = settings(phases=[Phase.explicit, Phase.generate, Phase.shrink], **base)
    rep2 = check_lowering(lw, parity_policy.load(), strategy=strat, settings=with_shrink, opts=judged, flaky_runs=0)
    assert rep2.status == "fail" and not any("case reducer" in e for e in rep2.extra)


def test_the_request_furthest_into_the_pool_is_tried_second():
    """An offset bug in the pool's top page, owned by a short request: found on the second solo try."""
    c = _case(lens=(300, 5, 70, 8), keys=(1, 2, 3, 4), spare=5000)
    top = max(c.pages[3])
    judge, calls = _judge(lambda x: any(p >= top for r in x.pages for p in r))
    best, log = reduce_failure(CaseOutcome("fake", c, "fail"), judge)
    assert best.case.value_keys == (4,) and calls[1].value_keys == (4,), [k.value_keys for k in calls[:3]]


def test_a_batch_bug_leaves_steps_for_the_lengths():
    """A dispatch bug that needs 33 requests: the batch cuts stop at their share of the budget, and the
    lengths still shrink."""
    c = _case(lens=(100,) * 40, keys=tuple(range(40)))
    judge, calls = _judge(lambda x: x.batch_size >= 33)
    best, log = reduce_failure(CaseOutcome("fake", c, "fail"), judge)
    assert 33 <= best.case.batch_size <= 40 and log.cut_short[:1] == ["batch"], log.line()
    assert log.kept.get("length", 0) >= 1 and len(calls) <= 64, log.line()
    assert "stopped by the step budget in: batch" in log.line()


def test_sigint_keeps_the_cuts_made_so_far():
    c = _case(lens=(300, 2049, 70, 4100, 12), keys=(1, 2, 3, 4, 5))
    seen = []

    def judge(case):
        seen.append(case)
        if len(seen) == 3:
            raise KeyboardInterrupt
        return CaseOutcome("fake", case, "fail" if max(case.context_lens) >= 2049 else "pass")
    best, log = reduce_failure(CaseOutcome("fake", c, "fail"), judge)
    assert log.interrupted and best.case.batch_size == 1 and "interrupted (SIGINT)" in log.line()


def _interrupting_reducer(outcome, judge):
    def stop(case):
        raise KeyboardInterrupt
    return reduce_failure(outcome, stop)  # the real one, imported above


def _exiting_reducer(outcome, judge):
    raise SystemExit(3)


@pytest.mark.parametrize("reducer, phrase, interrupted", [
    (_interrupting_reducer, "interrupted while reducing a failing case", True),
    (_exiting_reducer, "SystemExit(3) while the case reducer ran", False),
])
def test_in_check_lowering_sigint_and_exit_keep_the_failure(monkeypatch, reducer, phrase, interrupted):
    """`check_lowering` with the reducer: SIGINT in a step keeps the failure, marked interrupted and not
    shrunk; a plugin's SystemExit keeps it as found, with a note."""
    from parity.engine import policy as parity_policy
    from parity.engine.runner import RunOptions, check_lowering
    from tests import mutants as M

    monkeypatch.setattr("parity.engine.reduce.reduce_failure", reducer)
    lw = M.WindowLeftW()
    no_shrink = settings(phases=[Phase.explicit, Phase.generate], max_examples=40, derandomize=True, database=None,
                         deadline=None, report_multiple_bugs=False, suppress_health_check=list(HealthCheck))
    rep = check_lowering(lw, parity_policy.load(), strategy=cases(lw, limits=Limits(max_batch=4, max_context=40)),
                         settings=no_shrink, opts=RunOptions(device="cpu"), flaky_runs=0)
    assert rep.status == "fail" and len(rep.failures) == 1 and any(phrase in e for e in rep.extra), rep.extra
    assert rep.interrupted == interrupted and rep.failures[0].shrunk == (not interrupted)
