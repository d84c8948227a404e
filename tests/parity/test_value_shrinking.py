"""Value-dependent failures through the whole framework (`check_lowering`, the `ci` profile, CPU).

- Issue 21: a lowering that fails only on one request's particular values, found in a batch, shrinks
  to that one request and the shortest context that still fails (each request's values come from its
  own streams, by position: oracle/values.py).
- Issue 13: a softmax without max subtraction in a bf16-only lowering (tests/mutants.py) is caught by
  the default `ci` profile for every one of 10 seeds: only the value regimes reach scores past 88.
"""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import Phase, settings

import lowerings
from lowerings.torch_emulation import Context
from oracle.case import Case
from oracle.inputs import Inputs, materialize
from parity.front import cli
from parity.engine import policy as parity_policy
from parity.engine.runner import RunOptions, check_lowering
from strategies import Limits, build_case, cases, profile_settings
from tests import mutants as M

THRESHOLD = 4.5  # |stored key| above it: about 1 key in 400 of plain values (Hkv * D = 128 elements)
# The sweeps below judge values and shrinking: the hardening re-runs (determinism, canaries, untouched inputs) would
# double each case's cost and find nothing these lowerings do.
JUDGED_ONLY = RunOptions(device="cpu", check_determinism=False, check_inputs_untouched=False)


def _flagged_keys(inputs: Inputs, b: int) -> torch.Tensor:
    """Which context positions of request `b` hold a stored key element above THRESHOLD (bool `[L]`)."""
    c = inputs.case
    t = torch.arange(c.context_lens[b])
    pid = torch.tensor(c.pages[b], dtype=torch.long)[t // c.page_size]
    k = inputs.k_pool[pid, t % c.page_size] if c.layout == "NHD" else inputs.k_pool[pid, :, t % c.page_size]
    return (k.float().abs() > THRESHOLD).flatten(1).any(1)


class KeyThreshold(Context):
    """The context lowering, except that a request with a context key element above 4.5 (stored units)
    gets a NaN output, as a kernel whose fp8 re-quantization of the keys overflows would: a failure of
    one request's particular values, at one position."""

    name = "test:key_threshold"

    def run(self, inputs: Inputs):
        bad = [bool(_flagged_keys(inputs, b).any()) for b in range(inputs.case.batch_size)]
        res = super().run(inputs)
        for b, flag in enumerate(bad):
            if flag:
                res.out[b] = float("nan")
        return res


@pytest.fixture(scope="module")
def policy():
    return parity_policy.load()


@pytest.fixture(autouse=True)
def _one_thread(single_threaded_torch):  # tests/conftest.py
    yield


def _shorter(case: Case, L: int) -> Case:
    """`case` (one request) with its context cut to `L` keys (the same pages, values and fields)."""
    return case.replace(context_lens=(L,))


# Up to 16 requests and one query head per KV head (the keys the failure depends on are drawn as before): the
# derandomized sweep finds the failure in a batch of 16 and the shrinker, whose steps on the default limits'
# 31-request find were three fifths of this file's time, has half the requests to delete.
BATCH_OF_16 = Limits(max_batch=16, max_group=1)


def test_a_value_dependent_failure_shrinks_to_one_request_and_the_shortest_context(policy):
    low = KeyThreshold()
    first: list[Case] = []

    def progress(rep, out) -> None:
        if out.status == "fail" and not first:
            first.append(out.case)

    rep = check_lowering(low, policy, strategy=cases(low, values="plain", limits=BATCH_OF_16),
                         settings=profile_settings("ci"), opts=JUDGED_ONLY, yardstick=lowerings.get("sdpa"),
                         progress=progress)
    assert rep.status == "fail" and rep.failures and rep.failures[0].shrunk
    found, shrunk = first[0], rep.failures[0].outcome.case
    print(f"found in {found.short()}\nshrunk to {shrunk.short()} after {rep.cases} cases")
    assert found.batch_size >= 8, f"expected the failure to be found in a batch, got {found.short()}"
    assert shrunk.batch_size == 1, f"not shrunk to one request: {shrunk.short()}"
    L = shrunk.context_lens[0]
    flagged = _flagged_keys(materialize(shrunk), 0)
    assert L >= 1 and bool(flagged[L - 1]) and not bool(flagged[: L - 1].any()), \
        f"L={L} is not the shortest failing context: flagged positions {flagged.nonzero().flatten().tolist()}"
    assert not _flagged_keys(materialize(_shorter(shrunk, L - 1)), 0).any()  # one key less passes


def test_the_threshold_lowering_fails_on_values_not_shapes(policy):
    """The same shrunk shape with other values passes: the failure is one request's values."""
    case = build_case(dict(context_lens=[300], value_keys=[0], block_size=1, num_kv_heads=1, group=1, head_dim=64,
                           page_size=16, window=("noncausal", None), dtype="bfloat16", kv_dtype="same", k_scale=1.0,
                           v_scale=1.0, scale=None, layout="NHD", block_storage="dense", page_table_dtype="int32",
                           page_table_pad=0, spare_pages=1, extra_pages=0, perm_seed=0, seed=0))
    outcomes = {key: bool(_flagged_keys(materialize(case.replace(value_keys=(key,))), 0).any()) for key in range(40)}
    assert 0 < sum(outcomes.values()) < len(outcomes), outcomes


@pytest.mark.parametrize("seed", range(10))
def test_softmax_without_max_is_caught_by_the_ci_profile_for_every_seed(seed, policy):
    mutant = M.catalogue()["mutant:softmax_without_max"]
    fast = settings(profile_settings("ci", seed=seed), phases=[Phase.explicit, Phase.generate])  # caught, not shrunk
    rep = check_lowering(mutant, policy, strategy=cases(mutant), settings=fast, opts=RunOptions(device="cpu"),
                         yardstick=lowerings.get("sdpa"), seed=seed)
    assert rep.status == "fail", f"seed {seed}: not caught in {rep.cases} cases"
    failure = rep.failures[0].outcome
    assert any("non-finite" in m for m in failure.failures), failure.failures
    print(f"seed {seed}: caught at case {rep.cases} on {failure.case.short()}")


def test_softmax_without_max_passes_on_plain_values(policy):
    """The counterpart: with plain values only (what the strategies drew before the regimes) the same
    sweep passes; the regimes are what catch it."""
    mutant = M.catalogue()["mutant:softmax_without_max"]
    rep = check_lowering(mutant, policy, strategy=cases(mutant, values="plain"), settings=profile_settings("ci"),
                         opts=JUDGED_ONLY, yardstick=lowerings.get("sdpa"))
    assert rep.status == "pass" and rep.cases >= 60, [f.outcome.failures for f in rep.failures]


def test_a_format1_failure_file_replays_with_its_own_values(tmp_path, capsys):
    """A failure saved by the previous format (version 1, no value fields) replays through `repro`
    with the values it failed on: the key above 4.5 sits where format 1 put it, not where format 2
    would (format 2 draws other values for the same case)."""
    case = build_case(dict(context_lens=[40], block_size=1, num_kv_heads=1, group=1, head_dim=64, page_size=16,
                           window=("noncausal", None), dtype="bfloat16", kv_dtype="same", k_scale=1.0, v_scale=1.0,
                           scale=None, layout="NHD", block_storage="dense", page_table_dtype="int32",
                           page_table_pad=0, spare_pages=1, extra_pages=0, perm_seed=0, seed=0))
    old = next(case.replace(version=1, seed=s) for s in range(1000)
               if _flagged_keys(materialize(case.replace(version=1, seed=s)), 0).any()
               and not _flagged_keys(materialize(case.replace(seed=s)), 0).any())
    text = old.to_json_dict()
    assert text["version"] == 1 and "values" not in text and "value_keys" not in text
    path = tmp_path / "test_key_threshold-1.json"
    path.write_text(json.dumps({"lowering": "sdpa", "case": text}))
    plugin = tmp_path / "plugin.py"
    plugin.write_text("import lowerings\nfrom tests.parity.test_value_shrinking import KeyThreshold\n"
                      "lowerings.register(KeyThreshold())\n")
    try:
        code = cli.main(["repro", str(path), "--plugin", str(plugin), "--lowering", "test:key_threshold",
                         "--device", "cpu"])
        out = capsys.readouterr().out
    finally:
        lowerings.registry.unregister("test:key_threshold")
    assert code == 1 and "non-finite" in out and "(case format 1)" in out, out
