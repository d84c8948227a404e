"""The extremes' mutants (tests/extreme_mutants.py, issue 47) under the default `ci` check on a CPU: what
`dflash-parity check` draws for each (its limits with the CPU's production defaults, the boundary cases
first, then 60 derandomized cases; the window's with its model row on, `--limit models=...`, the only way
a CPU check draws a 4096-key window). Each is caught by the boundary case of its extreme, whose other side
(the same case one step short of it) passes: the minimal case, recorded as shrunk, whatever the seed.
"""

from __future__ import annotations

import time

import pytest

import lowerings
from parity.engine import policy as parity_policy
from parity.engine.runner import RunOptions, check_lowering
from strategies import check_cases, profile_settings
from tests import extreme_mutants as XM, mutants as M

WINDOW_ROW = {"models": ("minimax-m3.1-dspark/tp4",)}


@pytest.fixture(scope="module")
def policy():
    return parity_policy.load()


def _check(name: str, policy, seed: int | None = None):
    lw = M.catalogue()[name]
    plan = check_cases(lw, "cpu", profile="ci", overrides=WINDOW_ROW if "window" in name else None)
    t0 = time.perf_counter()
    rep = check_lowering(lw, policy, strategy=plan.strategy, boundaries=plan.boundaries,
                         settings=profile_settings("ci", seed=seed), opts=RunOptions(device="cpu"),
                         yardstick=lowerings.get("sdpa"), seed=seed)
    return rep, time.perf_counter() - t0


# name -> (a phrase of the failure, the label of the boundary case that catches it, the shrunk case it lands on)
EXPECTED = {
    "mutant:fp8_saturates_at_240": ("got -240, expected -448", "fp8 stored values across e4m3fn's range",
                                    lambda c: c.kv_dtype == "float8_e4m3fn" and c.values == "full_range"),
    "mutant:rows_past_64": ("output: max |O - O_ref|", "K x G = 16 x 8 = 128",
                            lambda c: c.block_size * c.group_size == 128),
    "mutant:drops_last_key_past_4096": ("output: max |O - O_ref|", "L = 4097 = 2^12 + 1, heaviest key at L - 1",
                                        lambda c: c.context_lens == (4097,) and c.peak_keys == (4096,)),
    "mutant:split_edge_key_twice": ("max |LSE - LSE_ref| = 0.6931",  # ln 2: the heavy key counted twice
                                    "L = 2049 = 2^11 + 1, heaviest key at L - 1",
                                    lambda c: c.peak_key(0) == XM.SPLIT),
    "mutant:window_ignored_from_4096": ("output: max |O - O_ref|", "model row minimax-m3.1-dspark/tp4: W = 4096, "
                                        "L = 4090", lambda c: c.values == "sink" and c.context_lens == (4090,)),
}


def test_every_extreme_mutant_has_an_expectation():
    assert {cls().name for cls in XM.EXTREME_MUTANTS} == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED), ids=[n.split(":", 1)[1] for n in sorted(EXPECTED)])
def test_extreme_mutant_is_caught_and_shrunk_by_the_default_ci_check(name, policy, single_threaded_torch):
    phrase, label, lands = EXPECTED[name]
    rep, secs = _check(name, policy)
    case = rep.failures[0].outcome.case if rep.failures else None
    print(f"{name}: {secs:.1f}s, {rep.cases} cases, shrunk: {case.short() if case else '-'}")
    assert rep.status == "fail", f"{name} was not caught in {rep.cases} cases"
    msgs = [m for f in rep.failures for m in f.outcome.failures]
    assert any(phrase in m for m in msgs), msgs
    assert rep.failures[0].shrunk and case.batch_size == 1 and lands(case), case.short()
    caught = f"caught by the boundary case {label}"
    assert any(caught in x and "its other side passes" in x for x in rep.extra), rep.extra


def test_the_split_mutant_is_caught_where_it_declares_its_splits(policy, single_threaded_torch):
    """Its shrunk case puts the mass on a declared split boundary (2048: also the last context key of
    L = 2049), and the boundary case of its first declared split fails on its own, its other side passing."""
    from parity.engine.runner import run_case

    lw = M.catalogue()["mutant:split_edge_key_twice"]
    split = next(b for b in check_cases(lw, "cpu", profile="ci").boundaries if "split_boundaries" in b.label)
    assert split.case.peak_keys == (XM.SPLIT,) and XM.SPLIT in lw.split_boundaries(split.case)[0]
    yard = lowerings.get("sdpa")
    assert run_case(lw, split.case, policy, RunOptions(device="cpu"), yard).status == "fail"
    assert run_case(lw, split.other_side, policy, RunOptions(device="cpu"), yard).status == "pass"


@pytest.mark.parametrize("seed", [3, 8])
def test_any_seed_catches_them_before_the_first_drawn_case(seed, policy, single_threaded_torch):
    for name in ("mutant:fp8_saturates_at_240", "mutant:drops_last_key_past_4096"):
        rep, _ = _check(name, policy, seed=seed)
        assert rep.status == "fail" and rep.failures[0].shrunk and EXPECTED[name][2](rep.failures[0].outcome.case)
