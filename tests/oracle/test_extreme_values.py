"""The value regimes that reach the extremes (oracle/values.py, issue 47): `full_range` (fp8 stored values
across e4m3fn's whole range: +-448 in every request and KV head, subnormals, zeros) and `peak` (the
attention mass on one key per request, anywhere: `Case.peak_keys`). Both keep the values module's
contract: per-request streams (removing a request keeps the others' values), a shorter context a prefix of
the longer one (but for the heavy key, which follows `peak_keys`), deterministic, in the host build and
format 3's device build alike. And the case field: optional, written only when set, validated.
"""

from __future__ import annotations

import json

import pytest
import torch

from oracle.case import Case
from oracle.errors import InvalidInput
from oracle.inputs import materialize
from oracle.values import FP8_MAX, RANGE_SCORE_STD, stored_fp8_peak
from parity.engine.reduce import drop_requests
from strategies import build_case
from tests.oracle.test_values import _bits, _context, _params, _request, _scores, _without

FP8_CORNER = dict(kv_dtype="float8_e4m3fn", k_scale=0.5, v_scale=2.0, block_storage="appended")
BUILDS = ("host", "counter")


def _range_case(**changes) -> Case:
    return build_case(_params(**FP8_CORNER, values="full_range", context_lens=[40, 0, 17], value_keys=[1, 2, 3],
                              **changes))


@pytest.mark.parametrize("build", BUILDS)
def test_full_range_stores_448_and_subnormals_in_every_request_and_head(build):
    case = _range_case()
    x = materialize(case, build=build)
    for b, L in enumerate(case.context_lens):
        k, v = _context(x, b)
        kb = (x.k_block[b].float() / case.k_scale)  # the block's values in stored units
        for stored in (k.float(), v.float(), kb):
            if not stored.numel():
                continue
            top = stored.abs().amax(dim=(0, 2))  # per KV head
            assert torch.equal(top, torch.full_like(top, FP8_MAX)), (build, b, top)
            small = (stored != 0) & (stored.abs() < 2.0 ** -6)  # e4m3 subnormals
            assert small.any() and (stored == 0).any(), (build, b)
    assert stored_fp8_peak(case) == FP8_MAX
    assert stored_fp8_peak(case.replace(values="plain")) is None
    assert stored_fp8_peak(build_case(_params(values="full_range"))) is None  # a bf16 pool: no fp8


@pytest.mark.parametrize("build", BUILDS)
def test_full_range_scores_stay_moderate(build):
    """q is scaled so that the scores over the ladder channels have standard deviation `RANGE_SCORE_STD`: the
    regime tests the range of the stored values, not the softmax's."""
    x = materialize(_range_case(), build=build)
    s = _scores(x, 0)
    spread = (s - s.mean(-1, keepdim=True)).std(-1)
    assert (spread > RANGE_SCORE_STD / 4).all() and (spread < RANGE_SCORE_STD * 4).all(), spread


@pytest.mark.parametrize("build", BUILDS)
@pytest.mark.parametrize("values", ["full_range", "peak"])
def test_the_new_regimes_keep_requests_apart(values, build):
    p = _params(**FP8_CORNER, context_lens=[5, 0, 17, 9], value_keys=[7, 300, 7, 0], values=values)
    full = materialize(build_case(p), build=build)
    for gone in (0, 2):
        part = materialize(_without(p, gone), build=build)
        for new_b, b in enumerate(x for x in range(4) if x != gone):
            want, got = _request(full, b), _request(part, new_b)
            assert all(torch.equal(want[n], got[n]) for n in want), (values, gone, b)


@pytest.mark.parametrize("build", BUILDS)
def test_shorter_contexts_are_prefixes_but_for_the_heavy_key(build):
    long = build_case(_params(context_lens=[65, 40], value_keys=[4, 9], values="full_range", page_size=16))
    x = materialize(long, build=build)
    for L in (0, 17, 33):
        y = materialize(build_case(_params(context_lens=[L, 40], value_keys=[4, 9], values="full_range",
                                           page_size=16)), build=build)
        a, b = _request(x, 0), _request(y, 0)
        assert torch.equal(a["k"][:L], b["k"]) and torch.equal(a["v"][:L], b["v"]) and torch.equal(a["q"], b["q"])
    # peak: a fixed heavy key keeps its place; every other key is the plain regime's, position by position
    peak = lambda L, t: build_case(_params(context_lens=[L, 40], value_keys=[4, 9], values="peak",  # noqa: E731
                                           peak_keys=[t, 3], page_size=16))
    x = materialize(peak(65, 20), build=build)
    plain = materialize(build_case(_params(context_lens=[65, 40], value_keys=[4, 9], page_size=16)), build=build)
    y = _request(materialize(peak(21, 20), build=build), 0)
    assert torch.equal(_request(x, 0)["k"][:21], y["k"]) and torch.equal(_request(x, 0)["q"], y["q"])
    kx, kp = _request(x, 0)["k"], _request(plain, 0)["k"]
    differs = (kx != kp).flatten(1).any(1)
    assert differs.nonzero().flatten().tolist() == [20]


def _mass(x, b: int, t: int) -> torch.Tensor:
    """The softmax weight of key `t` in every query row of request `b` (its keys: context then block)."""
    return torch.softmax(_scores(x, b), -1)[..., t]


@pytest.mark.parametrize("corner,build", [(dict(), "host"), (dict(FP8_CORNER, dtype="float16"), "host"),
                                          (dict(scale=0.05, head_dim=128), "host"), (dict(FP8_CORNER), "counter")],
                         ids=["bf16", "fp16-fp8", "bf16-scale-D128", "fp8-counter"])
def test_peak_puts_the_mass_on_its_key_in_the_context_or_the_block(corner, build):
    case = build_case(_params(**corner, context_lens=[40, 0, 17, 5], value_keys=[1, 2, 3, 4], block_size=4,
                              values="peak", peak_keys=[39, 2, 16, 99]))
    x = materialize(case, build=build)
    assert [case.peak_key(b) for b in range(4)] == [39, 2, 16, 8]  # 99: clipped to the last key (L + K - 1)
    for b in range(4):
        t = case.peak_key(b)
        s = _scores(x, b)
        assert (s.argmax(-1) == t).all() and (_mass(x, b, t) > 0.9).all(), (b, t)


def test_peak_without_keys_holds_each_requests_last_context_key():
    case = build_case(_params(context_lens=[40, 0, 17], value_keys=[1, 2, 3], values="peak"))
    assert [case.peak_key(b) for b in range(3)] == [39, 0, 16]
    x = materialize(case)
    assert all((_scores(x, b).argmax(-1) == case.peak_key(b)).all() for b in range(3))


def test_peak_keys_field_is_optional_written_only_when_set_and_validated():
    plain = build_case(_params(value_keys=[1, 2, 3]))
    assert "peak_keys" not in plain.to_json_dict()  # every case without it writes the file it always did
    case = plain.replace(values="peak", peak_keys=(4, 0, 19))
    d = case.to_json_dict()
    assert d["peak_keys"] == [4, 0, 19] and Case.from_json(case.to_json()) == case
    assert "peak_keys=[4, 0, 19]" in case.short()
    for bad, where in ((dict(peak_keys=(1, 2)), "peak_keys"), (dict(values="sink"), "peak_keys"),
                       (dict(peak_keys=(1, -1, 2)), "peak_keys[1]")):
        with pytest.raises(InvalidInput) as err:
            case.replace(**bad)
        assert err.value.where == where, bad
    with pytest.raises(InvalidInput, match="an array of integers"):
        Case.from_json(json.dumps(dict(d, peak_keys=5)))
    kept = drop_requests(case, [2, 0])
    assert kept.peak_keys == (19, 4) and kept.value_keys == (3, 1)
    assert torch.equal(_bits(materialize(kept).q[0]), _bits(materialize(case).q[2]))
