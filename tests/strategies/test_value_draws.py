"""The value fields of drawn cases: the regime (plain first, every regime reached, `--limit values=`)
and one value key per request, drawn with the request's length so that deleting a request keeps the
others' keys (tests/parity/test_value_shrinking.py shows the shrink end to end)."""

from __future__ import annotations

import collections

import pytest
from hypothesis import HealthCheck, find, given, seed, settings

from oracle.case import VALUE_REGIMES
from strategies import Limits, cases, limit_overrides, seed_only_draws
from strategies._cases import value_regimes

SMALL = Limits(max_batch=4, max_context=40)
# 300 draws: the fewest where this (derandomized, seed-only) sequence reaches every regime more than once
# (200: `tiny` once, plain 77.5%; 300: every regime 12+ times, plain 69%; 500: plain 66%).
DRAWS = settings(max_examples=300, derandomize=True, deadline=None, database=None,
                 suppress_health_check=list(HealthCheck))


def _collect(strategy):
    """What `check` draws from `strategy`: derandomized, from the seed alone (`seed_only_draws`: without
    it, hypothesis mixes the integer constants of every module the process loaded into its draws, and
    the counts below changed with the test modules loaded alongside)."""
    seen = []

    @DRAWS
    @given(strategy)
    def draw(x):
        seen.append(x)

    with seed_only_draws():
        draw()
    return seen


def test_every_regime_is_drawn_and_plain_about_half_the_time():
    """Nine regimes since issue 47: one 300-draw sequence may miss one or two of them (hypothesis's draws
    cluster: seeds 1 and 2 reach 8 and 7 of 9); two seeded sequences of 200 reach all (each 11+ times, plain
    50%)."""
    seen = []
    for s in (0, 1):
        @seed(s)
        @settings(DRAWS, max_examples=200, derandomize=False)
        @given(cases(limits=SMALL))
        def draw(c):
            seen.append(c.values)

        with seed_only_draws():
            draw()
    counts = collections.Counter(seen)
    assert set(counts) == set(VALUE_REGIMES), counts
    assert 0.35 <= counts["plain"] / sum(counts.values()) <= 0.75, counts


def test_shrinking_moves_towards_plain_then_the_first_regime():
    assert find(cases(limits=SMALL), lambda c: True).values == "plain"
    assert find(cases(limits=SMALL), lambda c: c.values != "plain").values == "large"
    assert find(cases(limits=SMALL), lambda c: c.values in ("tiny", "ties")).values == "ties"


def test_every_request_draws_a_value_key():
    for c in _collect(cases(limits=Limits(max_batch=8))):
        assert len(c.value_keys) == c.batch_size and all(0 <= k <= 2**16 for k in c.value_keys)
    assert len(find(cases(context_lens=[3, 0, 5]), lambda c: True).value_keys) == 3


def test_limits_and_fixed_regimes():
    assert {c.values for c in _collect(cases(limits=Limits(max_batch=4, max_context=40, values=("tiny", "huge"))))} == {"tiny", "huge"}
    assert {c.values for c in _collect(cases(limits=SMALL, values="sink"))} == {"sink"}
    assert find(value_regimes(Limits(values=("outliers", "large"))), lambda r: True) == "large"  # canonical order
    assert limit_overrides(["values=plain,huge"]) == {"values": ("plain", "huge")}
    with pytest.raises(ValueError, match="Limits.values: one or more of plain, large"):
        Limits(values=("gaussian",))
    with pytest.raises(ValueError, match="--limit: Limits.values"):
        limit_overrides(["values=plain,gaussian"])
