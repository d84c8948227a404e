"""A case's values (oracle/values.py): per-request streams, the two case formats, the value regimes.

- Issue 21: a request's tensors do not depend on the other requests, nor (for the keys it keeps) on
  its own context length, so hypothesis can delete requests and shorten contexts without losing the
  values a failure needs. Negative control: keyed by the request's index (`value_keys=()`), removing
  an earlier request does change them.
- Format 1 cases (one generator for the batch) still replay bit for bit: digests of the tensors the
  format 1 code built (commit d23c8ef, torch 2.13.0 CPU), both builds, both canaries.
- Format 2 is pinned the same way, so that a change of the scheme cannot silently change what a saved
  failure means.
- Each regime does what it says, keeps q within fp16 and fp8 pools within 448, and the oracle finite.
"""

from __future__ import annotations

import hashlib
import json
import math

import pytest
import torch

from oracle import reference
from oracle.case import VALUE_REGIMES, Case
from oracle.errors import InvalidInput
from oracle.inputs import Inputs, materialize
from oracle.values import FP8, case_values, position_blocks
from strategies import build_case

ON_GPU = torch.cuda.is_available()
gpu = pytest.mark.parity_gpu

BASE = dict(context_lens=[5, 0, 17], block_size=3, num_kv_heads=2, group=2, head_dim=64, page_size=4,
            window=("noncausal", None), dtype="bfloat16", kv_dtype="same", k_scale=1.0, v_scale=1.0, scale=None,
            layout="NHD", block_storage="dense", page_table_dtype="int32", page_table_pad=0, spare_pages=1,
            extra_pages=0, perm_seed=7, seed=3)
VARIANTS = {
    "bf16-nhd-dense": {},
    "fp16-hnd-appended-pad": dict(dtype="float16", layout="HND", block_storage="appended", page_table_pad=3, seed=11),
    "fp8-appended-int64": dict(kv_dtype="float8_e4m3fn", k_scale=0.5, v_scale=2.0, block_storage="appended",
                               page_table_dtype="int64", seed=12345),
    "fp8-hnd-dense": dict(kv_dtype="float8_e4m3fn", k_scale=4.0, v_scale=0.25, layout="HND", dtype="float16", seed=2),
}


def _params(**changes) -> dict:
    return dict(BASE, **changes)


def _case(**changes) -> Case:
    return build_case(_params(**changes))


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def _digest(t: torch.Tensor) -> str:
    return hashlib.sha256(_bits(t).cpu().view(torch.uint8).numpy().tobytes()).hexdigest()[:16]


def _context(x: Inputs, b: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Request `b`'s context keys and values `[L, Hkv, D]` as stored, read through its pages."""
    c = x.case
    t = torch.arange(c.context_lens[b])
    pid = torch.tensor(c.pages[b], dtype=torch.long)[t // c.page_size].to(x.device)
    slot = (t % c.page_size).to(x.device)
    return tuple(pool[pid, slot] if c.layout == "NHD" else pool[pid, :, slot] for pool in (x.k_pool, x.v_pool))


def _request(x: Inputs, b: int) -> dict[str, torch.Tensor]:
    """Request `b`'s queries, block K/V and context K/V, as raw bits."""
    k, v = _context(x, b)
    out = {"q": x.q[b], "k_block": x.k_block[b], "v_block": x.v_block[b], "k": k, "v": v}
    return {name: _bits(t) for name, t in out.items()}


def _without(p: dict, b: int) -> Case:
    """The case of build parameters `p` with request `b` removed (its length and value key)."""
    drop = lambda xs: [x for i, x in enumerate(xs) if i != b]  # noqa: E731
    return build_case(dict(p, context_lens=drop(p["context_lens"]), value_keys=drop(p["value_keys"])))


# ---- issue 21: per-request streams --------------------------------------------------------------------

def test_position_blocks_cover_every_length_as_a_prefix():
    longest = list(position_blocks(140_000))
    for n in list(range(0, 300)) + [2047, 2048, 2049, 4095, 4096, 4097, 131_071, 131_072, 131_073]:
        blocks = list(position_blocks(n))
        assert blocks == longest[: len(blocks)], n  # the blocks of a shorter context are a prefix
        assert all(s == (blocks[i - 1][0] + blocks[i - 1][1] if i else 0) for i, (s, _) in enumerate(blocks))
        end = blocks[-1][0] + blocks[-1][1] if blocks else 0
        assert n <= end <= n + n // 4 + 15, (n, end)  # waste: a quarter, plus 15
    assert len(list(position_blocks(131_072))) == 48


# The counter build (format 3) under Triton's interpreter costs half a second a build: each storage variant once,
# the regimes spread over them (its streams are keyed by seed, position and element whatever the regime).
COUNTER_REMOVALS = [("bf16-nhd-dense", "plain"), ("fp16-hnd-appended-pad", "sink"), ("fp8-appended-int64", "huge"),
                    ("fp8-hnd-dense", "sink")]


@pytest.mark.parametrize("variant,values,build",
                         [(v, r, b) for b in ("host", "device") for r in ("plain", "sink", "huge") for v in sorted(VARIANTS)]
                         + [(v, r, "counter") for v, r in COUNTER_REMOVALS])
def test_removing_a_request_keeps_the_others_bit_identical(variant, values, build):
    p = _params(**VARIANTS[variant], context_lens=[5, 0, 17, 9], value_keys=[7, 300, 7, 0], values=values)
    case = build_case(p)
    full = materialize(case, build=build)
    for gone in range(case.batch_size):
        part = materialize(_without(p, gone), build=build)
        kept = [b for b in range(case.batch_size) if b != gone]
        for new_b, b in enumerate(kept):
            want, got = _request(full, b), _request(part, new_b)
            for name in want:
                assert torch.equal(want[name], got[name]), f"request {b}'s {name} changed when request {gone} was removed"


def test_index_keyed_values_shift_when_an_earlier_request_goes():
    """Negative control: with `value_keys=()` a request is keyed by its index, so removing request 0
    gives request 1 request 0's values; the test above would fail for such keys."""
    p = _params(context_lens=[5, 17], value_keys=[])
    full, part = materialize(build_case(p)), materialize(_without(p, 0))
    assert not torch.equal(_request(full, 1)["q"], _request(part, 0)["q"])
    assert torch.equal(_request(full, 0)["q"], _request(part, 0)["q"])


@pytest.mark.parametrize("build", ["host", "device", "counter"])
@pytest.mark.parametrize("values", [r for r in VALUE_REGIMES if r != "peak"])  # peak: test_extreme_values.py
def test_shortening_a_context_keeps_its_remaining_keys(values, build):
    long = _case(context_lens=[300, 70], value_keys=[4, 9], values=values, page_size=16)
    x = materialize(long, build=build)
    lengths = (0, 1, 15, 16, 17, 63, 64, 65, 129, 299)
    if build == "counter" and values != "plain":  # the counters are the regime's alike: every edge once, in plain
        lengths = (0, 17, 129)
    for L in lengths:
        y = materialize(_case(context_lens=[L, 70], value_keys=[4, 9], values=values, page_size=16), build=build)
        a, b = _request(x, 0), _request(y, 0)
        for name in ("q", "k_block", "v_block"):
            assert torch.equal(a[name], b[name]), (L, name)
        assert torch.equal(a["k"][:L], b["k"]) and torch.equal(a["v"][:L], b["v"]), L
        assert all(torch.equal(u, v) for u, v in zip(_request(x, 1).values(), _request(y, 1).values()))


def test_a_smaller_block_keeps_the_first_queries():
    x = materialize(_case(block_size=8, value_keys=[1, 2, 3]))
    y = materialize(_case(block_size=3, value_keys=[1, 2, 3]))
    assert torch.equal(_bits(x.q[:, :3]), _bits(y.q)) and torch.equal(_bits(x.k_block[:, :3]), _bits(y.k_block))


def test_equal_value_keys_give_equal_values_and_index_keys_distinct_ones():
    x = materialize(_case(context_lens=[5, 9, 5], value_keys=[3, 3, 8]))
    a, b, c = _request(x, 0), _request(x, 1), _request(x, 2)
    assert torch.equal(a["q"], b["q"]) and torch.equal(a["k"], b["k"][:5]) and not torch.equal(a["q"], c["q"])
    x = materialize(_case(context_lens=[5, 5, 5], value_keys=[]))
    assert not torch.equal(x.q[0], x.q[1]) and not torch.equal(_request(x, 0)["k"], _request(x, 1)["k"])


def test_host_and_device_builds_agree_on_the_cpu():
    case = _case(**VARIANTS["fp8-appended-int64"], values="outliers", value_keys=[5, 6, 7])
    a, b = materialize(case, build="host"), materialize(case, build="device")
    for name in ("q", "k_block", "v_block", "page_table"):
        assert torch.equal(_bits(getattr(a, name)), _bits(getattr(b, name))), name
    for r in range(case.batch_size):  # the pools differ only in the canary's NaN bits
        assert all(torch.equal(u, v) for u, v in zip(_request(a, r).values(), _request(b, r).values()))


# ---- format 1 replays, format 2 is pinned ---------------------------------------------------------------

# Format 1 digests: computed by the format 1 code (the parent of this change) on torch 2.13.0, CPU.
# (A torch whose CPU `randn` draws differently changes both formats' values, and these digests with them.)
# `_digest` of each tensor of `materialize(case, "cpu", build=..., canary=...)`, in `tensors()` order.
FORMAT1 = {
    "bf16-nhd-dense/host/nan":
        "b05a7e41d21304bb fe0d58165d618c88 f6e1a1264d440383 5cd33cb80808cf51 "
        "104c8c7169ee7265 cbdc57edb950f54f 6ae4c4264744671d",
    "bf16-nhd-dense/host/large":
        "b05a7e41d21304bb 132e3c4b6807be09 35d1511eeb232a90 5cd33cb80808cf51 "
        "104c8c7169ee7265 cbdc57edb950f54f 6ae4c4264744671d",
    "bf16-nhd-dense/device/nan":
        "b05a7e41d21304bb 13d5533486b8bf64 2f1c907ce50df57c 5cd33cb80808cf51 "
        "104c8c7169ee7265 b53ee4013f00ac1e c64ddeacf276d645",
    "bf16-nhd-dense/device/large":
        "b05a7e41d21304bb 06698eb4d5685b0d af33355a68acd8a2 5cd33cb80808cf51 "
        "104c8c7169ee7265 b53ee4013f00ac1e c64ddeacf276d645",
    "fp16-hnd-appended-pad/host/nan":
        "2f0d010f96fd22ac 8c4b256f847cb37a 185fa17fe61f607d 5cd33cb80808cf51 "
        "104c8c7169ee7265 bf8e03860940bb98 b3540a8b519c161a",
    "fp16-hnd-appended-pad/host/large":
        "2f0d010f96fd22ac 541869174056d80d 00e6c710aeba6ae3 5cd33cb80808cf51 "
        "104c8c7169ee7265 bf8e03860940bb98 b3540a8b519c161a",
    "fp16-hnd-appended-pad/device/nan":
        "2f0d010f96fd22ac 1c6da1a51632a142 0d09d0367c5a30ed 5cd33cb80808cf51 "
        "104c8c7169ee7265 093b68837649cce4 a63d1fb75fd5a569",
    "fp16-hnd-appended-pad/device/large":
        "2f0d010f96fd22ac cbe22e9cdfd06da3 34298f578f526401 5cd33cb80808cf51 "
        "104c8c7169ee7265 093b68837649cce4 a63d1fb75fd5a569",
    "fp8-appended-int64/host/nan":
        "3ba926e0577b5c0a cdbacccf5c68c68a 38224610fa1ee9a0 fbf675a0b75b0c8c "
        "104c8c7169ee7265 80384e6ffa3f439b 2228bfc8774ea74e",
    "fp8-appended-int64/host/large":
        "3ba926e0577b5c0a 46b423b562dcc371 fec9c97400a4fc0a fbf675a0b75b0c8c "
        "104c8c7169ee7265 80384e6ffa3f439b 2228bfc8774ea74e",
    "fp8-appended-int64/device/nan":
        "3ba926e0577b5c0a 86f7ec13187ba34e 822bb082b8eca8ed fbf675a0b75b0c8c "
        "104c8c7169ee7265 a3942744877fde1b 082297d49a0f7bc9",
    "fp8-appended-int64/device/large":
        "3ba926e0577b5c0a 917394de5f3200cb 86ddc85c23344fe2 fbf675a0b75b0c8c "
        "104c8c7169ee7265 a3942744877fde1b 082297d49a0f7bc9",
    "fp8-hnd-dense/host/nan":
        "78ec198475970af6 55a4f54a264c259f 1ae6c2a7914f4dab 5cd33cb80808cf51 "
        "104c8c7169ee7265 bacaac1c2cb46834 862203fc1199d5a8",
    "fp8-hnd-dense/host/large":
        "78ec198475970af6 c821ce107150c30c 050333e9a728ea2f 5cd33cb80808cf51 "
        "104c8c7169ee7265 bacaac1c2cb46834 862203fc1199d5a8",
    "fp8-hnd-dense/device/nan":
        "78ec198475970af6 cf463cf718f2599e f760a3768453c7b3 5cd33cb80808cf51 "
        "104c8c7169ee7265 12a3c861511ed4ac c469bfbaf778c57f",
    "fp8-hnd-dense/device/large":
        "78ec198475970af6 028e9653e9aa6217 24ddb7906ae87dd5 5cd33cb80808cf51 "
        "104c8c7169ee7265 12a3c861511ed4ac c469bfbaf778c57f",
}


def _digests(x: Inputs) -> str:
    return " ".join(_digest(t) for t in x.tensors().values())


@pytest.mark.parametrize("key", sorted(FORMAT1))
def test_format1_cases_replay_bit_for_bit(key):
    variant, build, canary = key.split("/")
    case = _case(**VARIANTS[variant]).replace(version=1)
    assert _digests(materialize(case, "cpu", build=build, canary=canary)) == FORMAT1[key]


def test_format1_case_file_reads_and_writes_as_format1():
    v2 = _case(**VARIANTS["fp8-hnd-dense"])
    text = v2.to_json_dict()
    del text["values"], text["value_keys"]
    text["version"] = 1  # what the format 1 code wrote
    case = Case.from_json(json.dumps(text), source="old.json")
    assert case.version == 1 and case.values == "plain" and case.value_keys == ()
    assert case.short().endswith("(case format 1)") and "format" not in v2.short()
    assert case.to_json_dict() == text  # saved again, it stays a format 1 file
    assert not torch.equal(materialize(case).q, materialize(v2).q)  # and keeps its format 1 values
    with pytest.raises(InvalidInput) as err:
        Case.from_json(json.dumps(dict(text, values="huge")), source="old.json")
    assert err.value.where == "old.json: values" and "format 1" in err.value.rule
    with pytest.raises(InvalidInput) as err:
        case.replace(values="large")
    assert err.value.where == "version"


# Format 2 digests of one fp8 case per regime (torch 2.13.0, CPU): what a saved format 2 case means.
FORMAT2 = {
    "plain":
        "042771e5cbbac1ed 2b2d547fc4893b92 f136b7d831b1980b fbf675a0b75b0c8c "
        "104c8c7169ee7265 8a717023e6cdf990 138d6ae64da6105e",
    "large":
        "b81281e1fecfc8ca 2b2d547fc4893b92 f136b7d831b1980b fbf675a0b75b0c8c "
        "104c8c7169ee7265 8a717023e6cdf990 138d6ae64da6105e",
    "huge":
        "8fe60a01b1050c85 171744e4f3f75e30 f136b7d831b1980b fbf675a0b75b0c8c "
        "104c8c7169ee7265 09549fcf30afdf9a 138d6ae64da6105e",
    "sink":
        "60a46585c919e544 04bcf1404633f277 f136b7d831b1980b fbf675a0b75b0c8c "
        "104c8c7169ee7265 8a717023e6cdf990 138d6ae64da6105e",
    "ties":
        "042771e5cbbac1ed 913aee7b625886ac f136b7d831b1980b fbf675a0b75b0c8c "
        "104c8c7169ee7265 5057999ce191f58f 138d6ae64da6105e",
    "tiny":
        "e3dc374a39d4908b 0f0c3c2af90653bf e9fb313bf3546a53 fbf675a0b75b0c8c "
        "104c8c7169ee7265 32403e57ba72cf7e f22fd028285d9687",
    "outliers":
        "a5a37bb977bbff8d 0fbc2ae52804cfc6 3cb1ebf26e6e4ac5 fbf675a0b75b0c8c "
        "104c8c7169ee7265 643f28e77c0bdfdd 6529106a29d7e4cc",
    "full_range":
        "3bf343297900601f ae66982a0887592e 06744db1f4028305 fbf675a0b75b0c8c "
        "104c8c7169ee7265 5d40547f25e6976d e39423aac5c64578",
    "peak":  # the default heavy keys (`peak_keys=()`: each request's last context key)
        "f05b52ee311cc116 e4b3396d409dccf7 f136b7d831b1980b fbf675a0b75b0c8c "
        "104c8c7169ee7265 a9af6c6589e07490 138d6ae64da6105e",
}


@pytest.mark.parametrize("values", VALUE_REGIMES)
def test_format2_values_are_pinned(values):
    case = _case(**VARIANTS["fp8-appended-int64"], values=values, value_keys=[11, 0, 65535])
    got = _digests(materialize(case))
    assert FORMAT2.get(values) == got, f"format 2 values of {values!r} changed: {got!r}"


# ---- regimes -----------------------------------------------------------------------------------------------

CORNERS = [dict(dtype=d, kv_dtype=kv, k_scale=ks, v_scale=ks, scale=sc, head_dim=D)
           for d, kv, ks in (("bfloat16", "same", 1.0), ("float16", "same", 1.0), ("bfloat16", "float8_e4m3fn", 0.25),
                             ("float16", "float8_e4m3fn", 4.0))
           for sc in (None, 0.05, 1.0) for D in (64, 128)]


def _scores(x: Inputs, b: int) -> torch.Tensor:
    """fp32 scores `[K, Hq, L + K]` of request `b` over its context then its block keys (dequantized)."""
    c = x.case
    k = torch.cat([_context(x, b)[0].float() * (c.k_scale if c.kv_dtype == FP8 else 1.0), x.k_block[b].float()])
    q = x.q[b].float().view(c.block_size, c.num_kv_heads, c.group_size, c.head_dim)
    return torch.einsum("ihgd,thd->ihgt", q, k).reshape(c.block_size, c.num_q_heads, -1) * c.softmax_scale


@pytest.mark.parametrize("values", VALUE_REGIMES)
def test_regimes_stay_representable_and_the_oracle_finite(values):
    for corner in CORNERS:
        case = _case(**corner, context_lens=[40, 0, 3], values=values, value_keys=[1, 2, 3])
        fp8 = case.kv_dtype == FP8
        for val in case_values(case, torch.device("cpu")):
            assert val.q.abs().max() < 2.0 ** 15, (values, corner)  # fp16 max is 65504
            for x, sc in ((val.k, case.k_scale), (val.kb, case.k_scale), (val.v, case.v_scale), (val.vb, case.v_scale)):
                assert torch.isfinite(x).all()
                if fp8 and x.numel() and values != "full_range":  # full_range saturates at 448 by design
                    assert (x / sc).abs().max() <= 448, (values, corner)  # never clamped into the fp8 pool
        ref = reference.attention(materialize(case))
        assert torch.isfinite(ref.out).all() and torch.isfinite(ref.lse).all(), (values, corner)


# Format 3's device build (the "counter" build, under Triton's interpreter here) on one corner per dtype pair.
COUNTER_CORNERS = [c for c in CORNERS if c["scale"] is None and c["head_dim"] == 64]


@pytest.mark.parametrize("corner,build", [(c, "host") for c in CORNERS] + [(c, "counter") for c in COUNTER_CORNERS],
                         ids=lambda c: c if isinstance(c, str) else
                         f"{c['dtype'][:4]}-{c['kv_dtype'][:4]}-{c['scale']}-{c['head_dim']}")
def test_each_regime_does_what_it_says(corner, build):
    def made(values):
        case = _case(**corner, context_lens=[40, 0, 3], block_size=4, values=values, value_keys=[1, 2, 3])
        return case, materialize(case, build=build)

    k_eff = corner["k_scale"] if corner["kv_dtype"] == FP8 else 1.0
    plain_std = (made("plain")[0].softmax_scale * math.sqrt(corner["head_dim"]) * k_eff)
    s = _scores(made("large")[1], 0)
    assert (s.amax(-1) > 88.8).float().mean() >= 0.9  # exp(s) overflows fp32/bf16 in most rows
    s = _scores(made("huge")[1], 0)
    assert (s.abs().amax(-1) > 1e4).all() and (s.abs() > 1e3).all()
    case, x = made("sink")
    s = _scores(x, 0)
    assert (s.argmax(-1) == 0).all() and (torch.softmax(s, -1)[..., 0] > 0.5).all()  # key 0 takes most of every row
    s = _scores(made("ties")[1], 0)
    # In an fp8 pool the spread is e4m3's rounding of the shared vector (3 significand bits: up to 2^-4 of each
    # element), not the 2^-6 noise, and it varies with the draw: measured plain/23 and plain/14 (bf16/fp8 corner,
    # format 2's host build and format 3's device build); plain/8 there, plain/16 for the other pools.
    assert (s.std(-1) < plain_std / (8 if corner["kv_dtype"] == FP8 else 16)).all()
    case, x = made("tiny")
    v = _context(x, 0)[1].float()
    assert x.q.float().abs().max() < 2.0 ** -6
    if case.kv_dtype == FP8:
        assert 0 < v.abs().max() and (v.abs() < 2.0 ** -6).float().mean() > 0.5  # e4m3 subnormals (stored units)
    else:
        assert v.abs().max() < 2.0 ** -9 and (v.abs() < 2.0 ** -14).float().mean() > 0.05  # some fp16 subnormals
    case, x = made("outliers")
    k = x.k_block.float().pow(2).mean(dim=(0, 1, 2))  # per channel
    top = k.topk(2).values
    assert top.min() > 16 * k.median()


@pytest.mark.parametrize("values", VALUE_REGIMES)
def test_the_counter_build_stays_representable_and_the_oracle_finite(values):
    """Format 3's device build (module `oracle._device_values`) keeps each regime within fp16 for q and
    within 448 stored for an fp8 pool, and the oracle finite."""
    for corner in COUNTER_CORNERS:
        case = _case(**corner, context_lens=[40, 0, 3], values=values, value_keys=[1, 2, 3])
        x = materialize(case, build="counter")
        assert x.q.float().abs().max() < 2.0 ** 15 and torch.isfinite(x.k_block.float()).all()
        for b in range(case.batch_size):
            for stored in _context(x, b):
                assert torch.isfinite(stored.float()).all() and (stored.float().abs().max() if stored.numel() else 0.0) <= 448 * (
                    1 if case.kv_dtype == FP8 else 2 ** 15), (values, corner)
        ref = reference.attention(x)
        assert torch.isfinite(ref.out).all() and torch.isfinite(ref.lse).all(), (values, corner)


def test_the_counter_build_is_a_few_launches_whatever_the_batch_and_lengths(monkeypatch):
    """Format 3's point: its kernel launches do not grow with the requests or their lengths (format 2's
    device build draws one generator call per block of positions per stream per request)."""
    from oracle import _values_kernel

    launches = []
    real = _values_kernel.stream_kernel

    class Counting:
        def __getitem__(self, grid):
            launches.append(grid)
            return real[grid]

    monkeypatch.setattr(_values_kernel, "stream_kernel", Counting())
    for lens, values in (([5], "plain"), ([300, 0, 17, 65, 129, 2, 9, 40], "huge"), ([400] * 3, "sink")):
        launches.clear()
        x = materialize(_case(context_lens=lens, value_keys=list(range(len(lens))), values=values), build="counter")
        assert len(launches) == 5 + (values != "plain"), (lens, values)  # k, v, q, kb, vb (+ the regime's direction)
        assert torch.equal(_request(x, 0)["q"], _request(materialize(x.case, build="counter"), 0)["q"])


def test_the_build_warm_up_covers_every_kernel_variant(monkeypatch):
    """`oracle.inputs.warm_build` (run by `parity.exec.warmup` on CUDA) builds tiny cases that launch every compiled
    variant of the format 3 kernel a drawn case can (destination dtype, paged or dense; the regime switches are
    run-time arguments, and the affine maps a regime does not read are fp32 placeholders, so the pointers'
    dtypes do not vary), and its seeds are 16-byte aligned whatever the batch size (Triton specializes on it)."""
    from oracle import _device_values, _values_kernel
    from oracle.inputs import warm_build_cases

    seen = set()

    class Recording:
        """Records each launch's signature and launches nothing: what compiles is the signature (the values are
        the other tests' to check), and the interpreter would spend half a second on each of these builds."""

        def __getitem__(self, grid):
            def launch(dst, seeds, *args, **kw):
                assert seeds.data_ptr() % 16 == 0
                # the pointers' dtypes are the kernel's signature: a, c, s, the sink's position (read or not), the table
                seen.add((dst.dtype, kw["PAGED"], *(t.dtype for t in args[1:6])))
            return launch

    monkeypatch.setattr(_values_kernel, "stream_kernel", Recording())
    cases = warm_build_cases()
    for case in cases:
        materialize(case, build="counter")
    assert len(cases) == 8
    warmed = set(seen)

    def drawn_like(regimes=VALUE_REGIMES) -> set:
        seen.clear()
        for values in regimes:  # drawn-like cases: more requests, longer contexts, other layouts, both tables
            for corner in COUNTER_CORNERS:
                for table in ("int32", "int64"):
                    materialize(_case(**corner, context_lens=[40, 0, 3], values=values, value_keys=[1, 2, 3],
                                      layout="HND", page_table_dtype=table), build="counter")
        return set(seen)

    got = drawn_like()
    assert all(key[-1] == torch.int32 for key in got if key[1])  # every paged launch reads an int32 table
    assert got <= warmed, got - warmed
    # The check can fail: without the int32 view an int64 table makes its own variant, which no warm case launches
    # (H200 run 89: the isolated workers compiled three such variants in their first cases).
    monkeypatch.setattr(_device_values, "page_table_int32", lambda table: table)
    assert not drawn_like(("plain",)) <= warmed  # one regime shows it: a table's dtype is the same in every one


def test_the_builds_values_do_not_depend_on_the_page_tables_dtype():
    """An int64 page table is read as int32 by the device build: the same ids, so the same pools, bit for bit."""
    from parity.engine import result_bits as rb

    for corner in COUNTER_CORNERS[:2]:
        a, b = (materialize(_case(**corner, context_lens=[40, 0, 3], page_table_pad=2, page_table_dtype=t),
                            build="counter") for t in ("int32", "int64"))
        for name in ("q", "k_pool", "v_pool", "k_block", "v_block"):
            assert torch.equal(rb.bit_view(getattr(a, name)), rb.bit_view(getattr(b, name))), name


def test_the_counter_builds_values_do_not_depend_on_its_tile(monkeypatch):
    """Under the interpreter the build runs 128 positions a program, compiled 16 (`_device_values`): the same
    values either way, a value keyed by its seed, position and element only. Fails for a tile-keyed stream."""
    from oracle import _device_values

    case = _case(context_lens=[300, 0, 17], values="sink", value_keys=[1, 2, 3], layout="HND")
    wide = materialize(case, build="counter")
    monkeypatch.setattr(_device_values, "BLOCK_T_INTERPRETED", _device_values.BLOCK_T)
    narrow = materialize(case, build="counter")
    for name, t in wide.tensors().items():
        assert torch.equal(_bits(t), _bits(narrow.tensors()[name])), name
    # The check can fail: a stream keyed by its tile (seeds shifted by the tile's height) gives two builds apart.
    real = _device_values._launch
    monkeypatch.setattr(_device_values, "_launch", lambda dst, seeds, *a, **kw: real(
        dst, seeds + _device_values.BLOCK_T_INTERPRETED, *a, **kw))
    keyed_narrow = materialize(case, build="counter")
    monkeypatch.setattr(_device_values, "BLOCK_T_INTERPRETED", 128)
    assert not torch.equal(_bits(materialize(case, build="counter").k_pool), _bits(keyed_narrow.k_pool))


def test_the_counter_build_is_format_3s_only():
    case = _case()
    assert case.version == 3
    with pytest.raises(InvalidInput) as err:
        materialize(case.replace(version=2), build="counter")
    assert err.value.where == "build" and "format 2" in err.value.rule
    # On the CPU the device build of a format 3 case draws format 2's values (the counter build is CUDA's).
    assert torch.equal(_bits(materialize(case, build="device").q), _bits(materialize(case.replace(version=2), build="device").q))
    assert not torch.equal(_bits(materialize(case, build="device").q), _bits(materialize(case, build="counter").q))


def test_values_field_in_the_json_and_the_short_line():
    case = _case(values="ties", value_keys=[9, 8, 7])
    assert "values=ties" in case.short() and "values" not in _case().short()
    assert Case.from_json(case.to_json()) == case
    for bad, where in ((dict(values="gaussian"), "values"), (dict(value_keys=(1, 2)), "value_keys"),
                       (dict(value_keys=(1, -2, 3)), "value_keys[1]")):
        with pytest.raises(InvalidInput) as err:
            case.replace(**bad)
        assert err.value.where == where


# ---- on the GPU: the device build follows the same scheme ---------------------------------------------------

@gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU")
@pytest.mark.parametrize("version", [2, 3])
@pytest.mark.parametrize("values", VALUE_REGIMES)
def test_cuda_device_build_keeps_requests_and_prefixes(values, version):
    """Format 2's device build (a generator call per block) and format 3's (counter-based) on CUDA."""
    p = _params(**VARIANTS["fp8-appended-int64"], context_lens=[5, 0, 300, 9], value_keys=[7, 300, 7, 0],
                values=values)
    case = build_case(p).replace(version=version)
    full = materialize(case, "cuda")
    assert full.k_pool.device.type == "cuda"
    for gone in range(case.batch_size):
        part = materialize(_without(p, gone).replace(version=version), "cuda")
        for new_b, b in enumerate(x for x in range(case.batch_size) if x != gone):
            want, got = _request(full, b), _request(part, new_b)
            assert all(torch.equal(want[n], got[n]) for n in want), (values, gone, b)
    short_case = build_case(dict(p, context_lens=[5, 0, 129, 9])).replace(version=version)
    short = materialize(short_case, "cuda")
    same = short_case.peak_key(2) if values == "peak" else 129  # `peak`: a prefix but for the heavy key (the last)
    assert torch.equal(_request(full, 2)["k"][:same], _request(short, 2)["k"][:same]), values
    again = materialize(case, "cuda")
    assert all(torch.equal(_bits(a), _bits(b)) for a, b in zip(full.tensors().values(), again.tensors().values()))
