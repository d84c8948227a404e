"""The production-scale mutants (tests/mutants.py `PRODUCTION_MUTANTS`, issue 13) under the default `ci`
profile on a CPU: what `dflash-parity check` draws for each (its limits with the CPU's production
defaults, the boundary cases first, then 60 derandomized cases). Each is caught and shrunk to the
smallest case that shows it: a fixed-size split workspace and an unclamped last split at 4097 keys,
positions in fp16 at L = 2049 and in bf16 at L = 257, the dispatch off by one at B = 32 / 33 for every
seed, the fp8 scales swapped on an fp8 pool with `k_scale != v_scale`.
"""

from __future__ import annotations

import time

import pytest

import lowerings
from parity.front import cli
from parity.engine import policy as parity_policy
from parity.engine.runner import RunOptions, check_lowering
from strategies import check_cases, profile_settings
from tests import mutants as M


@pytest.fixture(scope="module")
def policy():
    return parity_policy.load()


def _check(lowering, policy, seed: int | None = None):
    plan = check_cases(lowering, "cpu", profile="ci")
    first: list[int] = []
    t0 = time.perf_counter()
    rep = check_lowering(lowering, policy, strategy=plan.strategy, boundaries=plan.boundaries,
                         settings=profile_settings("ci", seed=seed), opts=RunOptions(device="cpu"),
                         yardstick=lowerings.get("sdpa"), seed=seed,
                         progress=lambda r, out: first.append(r.cases) if out.status == "fail" and not first else None)
    return rep, (first[0] if first else None), time.perf_counter() - t0


def _keys(case) -> int:
    return max(case.context_lens) + case.block_size


# name -> (phrase in the failure, the shrunk case it must land on)
EXPECTED = {
    "mutant:split_workspace_wraps": ("output: max |O - O_ref|", lambda c: c.batch_size == 1 and _keys(c) == 4097),
    "mutant:last_split_unclamped": ("output", lambda c: c.batch_size == 1 and _keys(c) == 4097),
    "mutant:positions_fp16": ("output: max |O - O_ref|", lambda c: c.batch_size == 1 and c.context_lens == (2049,)),
    "mutant:positions_bf16": ("output: max |O - O_ref|", lambda c: c.batch_size == 1 and c.context_lens == (257,)),
    "mutant:dispatch_threshold_low": ("kernel calls: expected torch.append_paged_kv x1, torch.paged_decode x1",
                                      lambda c: c.batch_size == 32 and max(c.context_lens) == 0),
    "mutant:fp8_scales_swapped": ("output: max |O - O_ref|",
                                  lambda c: c.kv_dtype == "float8_e4m3fn" and c.k_scale != c.v_scale
                                  and c.batch_size == 1 and c.context_lens == (0,) and c.block_size == 1),
}


def test_every_production_mutant_has_an_expectation():
    assert {cls().name for cls in M.PRODUCTION_MUTANTS} == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED), ids=[n.split(":", 1)[1] for n in sorted(EXPECTED)])
def test_production_mutant_is_caught_and_shrunk_by_the_default_ci_profile(name, policy, single_threaded_torch):
    phrase, shrunk_ok = EXPECTED[name]
    rep, first, secs = _check(M.catalogue()[name], policy)
    case = rep.failures[0].outcome.case if rep.failures else None
    print(f"{name}: {secs:.1f}s, first failure at case {first}, {rep.cases} cases, "
          f"shrunk: {case.short() if case else '-'}; {rep.extra[:1]}")
    assert rep.status == "fail", f"{name} was not caught in {rep.cases} cases"
    msgs = [m for f in rep.failures for m in f.outcome.failures]
    assert any(phrase in m for m in msgs), msgs
    assert rep.failures[0].shrunk and shrunk_ok(case), f"{name}: shrunk to {case.short()}"
    # re-run and named like any failure (parity.engine.flakiness), a boundary case's too
    assert rep.failures[0].classification.runs_line == "failed 4 of 4 runs", rep.failures[0].classification


@pytest.mark.parametrize("seed", range(10))
def test_dispatch_off_by_one_is_caught_for_every_seed(seed, policy, single_threaded_torch):
    """Decode rows taken at B = 33, and the context path at B = 32: the declared boundary is drawn on both
    sides before any random case, whatever the seed (it used to be missed in 3 of 20 seeded runs)."""
    for name, B in (("mutant:dispatch_threshold_off_by_one", 33), ("mutant:dispatch_threshold_low", 32)):
        rep, first, _ = _check(M.catalogue()[name], policy, seed=seed)
        case = rep.failures[0].outcome.case if rep.failures else None
        assert rep.status == "fail" and case is not None and case.batch_size == B, (name, seed, rep.extra)
        assert first is not None and first <= len(check_cases(M.catalogue()[name], "cpu").boundaries)


def test_cli_check_catches_the_dispatch_off_by_one_with_any_seed(tmp_path, capsys, restore_registry):
    """The same through `dflash-parity check --seed N`, the mutant in a plugin file."""
    plugin = tmp_path / "plugin.py"
    plugin.write_text("import lowerings\nfrom tests.mutants import DispatchThresholdLow\n"
                      "lowerings.register(DispatchThresholdLow())\n")
    code = cli.main(["check", "--plugin", str(plugin), "--lowering", "mutant:dispatch_threshold_low", "--device",
                     "cpu", "--seed", "7", "--report", str(tmp_path / "r"), "--no-isolate", "--quiet"])
    out = capsys.readouterr().out
    assert code == 1 and "caught by the boundary case batch_size = 32" in out and "B=32 " in out, out
