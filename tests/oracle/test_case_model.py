"""The case model: JSON round trip, validation naming the field at fault, deterministic tensors,
canaries in unowned slots, and the ulp unit."""

from __future__ import annotations

import json
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from oracle import CASE_FORMAT_VERSION, Case, InvalidInput, materialize, pages_needed, ulp_bf16, ulp_fp16, window_for
from tests.oracle.oracle_cases import build_case, cases

FP8 = "float8_e4m3fn"


def _valid_kwargs(**over):
    kw = dict(context_lens=(3, 5), block_size=2, num_q_heads=4, num_kv_heads=2, head_dim=8, page_size=4,
              pages=((0, 1), (2, 3)), num_pages=6)
    kw.update(over)
    return kw


def test_valid_baseline_builds():
    c = Case(**_valid_kwargs())
    assert c.batch_size == 2 and c.group_size == 2 and c.max_keys == 7 and c.spare_pages() == (4, 5)
    assert c.softmax_scale == 8 ** -0.5


# ---- JSON round trip -------------------------------------------------------------------------------

@settings(derandomize=True, deadline=None, max_examples=60, database=None)
@given(case=cases())
def test_json_round_trip(case):
    text = case.to_json()
    back = Case.from_json(text)
    assert back == case
    assert back.to_json() == text
    assert hash(back) == hash(case)
    d = json.loads(text)
    assert d["version"] == CASE_FORMAT_VERSION and d["batch_size"] == case.batch_size
    # A failure file wraps the case with its verdict.
    assert Case.from_json(json.dumps({"case": d, "verdict": "fail"})) == case
    assert Case.from_json(case.to_json(indent=None)) == case


# ---- validation: each invalid description names its field -------------------------------------------

INVALID = {
    "Hq_not_multiple_of_Hkv": (dict(num_q_heads=3), "num_q_heads"),
    "context_longer_than_pages": (dict(context_lens=(3, 7)), "pages[1]"),
    "page_id_outside_pool": (dict(pages=((0, 1), (2, 6))), "pages[1]"),
    "negative_page_id": (dict(pages=((0, -1), (2, 3))), "pages[0]"),
    "page_owned_twice": (dict(pages=((0, 1), (1, 3))), "pages[1]"),
    "page_id_bool": (dict(pages=((0, 1), (2, True))), "pages[1]"),  # True == 1: also owned twice
    "page_id_float": (dict(pages=((0, 1.0), (2, 3))), "pages[0]"),
    "negative_context_length": (dict(context_lens=(-1, 5)), "context_lens[0]"),
    "unknown_dtype": (dict(dtype="float32", kv_dtype="float32"), "dtype"),
    "unknown_kv_dtype": (dict(kv_dtype="int8"), "kv_dtype"),
    "unknown_layout": (dict(layout="NDH"), "layout"),
    "bad_window_left": (dict(window=(-2, 0)), "window"),
    "bad_window_right": (dict(window=(0, -2)), "window"),
    "window_not_a_pair": (dict(window=(1, 2, 3)), "window"),
    "scale_zero": (dict(scale=0.0), "scale"),
    "scale_negative": (dict(scale=-0.5), "scale"),
    "scale_nan": (dict(scale=float("nan")), "scale"),
    "k_scale_not_1_for_bf16": (dict(k_scale=2.0), "k_scale"),
    "v_scale_not_1_for_bf16": (dict(v_scale=0.5), "v_scale"),
    "fp8_k_scale_zero": (dict(kv_dtype=FP8, k_scale=0.0), "k_scale"),
    "kv_dtype_mismatch": (dict(dtype="bfloat16", kv_dtype="float16"), "kv_dtype"),
    "unknown_block_storage": (dict(block_storage="paged"), "block_storage"),
    "unknown_page_table_dtype": (dict(page_table_dtype="int16"), "page_table_dtype"),
    "negative_page_table_pad": (dict(page_table_pad=-1), "page_table_pad"),
    "zero_block_size": (dict(block_size=0), "block_size"),
    "zero_heads": (dict(num_kv_heads=0), "num_kv_heads"),
    "negative_seed": (dict(seed=-1), "seed"),
    "pages_per_request_count": (dict(pages=((0, 1),)), "pages"),
    "empty_batch": (dict(context_lens=(), pages=()), "context_lens"),
    "bool_as_int": (dict(block_size=True), "block_size"),
}


@pytest.mark.parametrize("name", sorted(INVALID))
def test_invalid_case_names_field(name):
    over, field = INVALID[name]
    with pytest.raises(InvalidInput) as ei:
        Case(**_valid_kwargs(**over))
    assert ei.value.where == field, f"{name}: where={ei.value.where!r}, want {field!r} ({ei.value})"
    assert str(ei.value).startswith(field + ":")
    assert ei.value.rule


@pytest.mark.parametrize("over, field", [(dict(context_lens=(1, True)), "context_lens[1]"),
                                         (dict(context_lens=(1.0, 5)), "context_lens[0]"),
                                         (dict(context_lens=(1, 2**70)), "pages[1]")])
def test_a_value_past_the_one_pass_check_is_named_by_the_loop(over, field):
    """`_validate` checks plain ints in one pass and names a culprit only where that fails: a bool or a float
    still names its request (the JSON loader refuses both before, naming the field); a huge int passes as before."""
    with pytest.raises(InvalidInput) as ei:
        Case(**_valid_kwargs(**over))
    assert ei.value.where == field, str(ei.value)


@pytest.mark.parametrize("name", sorted(INVALID))
def test_invalid_case_from_json_names_field(name):
    """The same rules through the JSON loader: the field appears in the message after the source."""
    over, field = INVALID[name]
    d = Case(**_valid_kwargs()).to_json_dict()
    d.update({k: (list(v) if isinstance(v, tuple) else v) for k, v in over.items()})
    if "context_lens" in over:
        d["batch_size"] = len(over["context_lens"])
    with pytest.raises(InvalidInput) as ei:
        Case.from_json(json.dumps(d), source="x.json")
    assert ei.value.where == f"x.json: {field}", str(ei.value)


def _json_dict():
    return Case(**_valid_kwargs()).to_json_dict()


def test_unknown_json_field():
    d = _json_dict()
    d["soft_cap"] = 30.0
    with pytest.raises(InvalidInput) as ei:
        Case.from_json(json.dumps(d))
    assert "soft_cap" in ei.value.where and "unknown" in ei.value.rule


@pytest.mark.parametrize("version", [0, 4, None, "1", True, 1.5])
def test_wrong_version(version):
    d = _json_dict()
    if version is None:
        del d["version"]
    else:
        d["version"] = version
    with pytest.raises(InvalidInput) as ei:
        Case.from_json(json.dumps(d))
    assert "version" in ei.value.where


@pytest.mark.parametrize("text", ["{", "", "[1, 2", "{'version': 1}", "nul"])
def test_malformed_json(text):
    with pytest.raises(InvalidInput) as ei:
        Case.from_json(text, source="bad.json")
    assert ei.value.where == "bad.json" and "JSON" in ei.value.rule


@pytest.mark.parametrize("payload", ["[]", "3", "\"case\""])
def test_json_not_an_object(payload):
    with pytest.raises(InvalidInput):
        Case.from_json(payload)


def test_batch_size_inconsistent():
    d = _json_dict()
    d["batch_size"] = 3
    with pytest.raises(InvalidInput) as ei:
        Case.from_json(json.dumps(d))
    assert "batch_size" in ei.value.where


def test_missing_required_field():
    d = _json_dict()
    del d["head_dim"]
    with pytest.raises(InvalidInput) as ei:
        Case.from_json(json.dumps(d))
    assert "head_dim" in ei.value.where


def test_window_for_and_pages_needed():
    assert window_for("noncausal") == (-1, -1)
    assert window_for("causal") == (-1, 0)
    assert window_for("noncausal_swa", 4) == (3, 3)
    assert window_for("causal_swa", 1) == (0, 0)
    for bad in ((("noncausal_swa", 0), "width"), (("causal_swa", None), "width"), (("sideways", 3), "kind")):
        with pytest.raises(InvalidInput) as ei:
            window_for(*bad[0])
        assert ei.value.where == bad[1]
    assert pages_needed(0, 1, 16) == 1
    assert pages_needed(15, 1, 16) == 1 and pages_needed(16, 1, 16) == 2
    assert pages_needed(7, 3, 1) == 10 and pages_needed(0, 8, 4) == 2


# ---- materialize -------------------------------------------------------------------------------------

def _bits(t: torch.Tensor) -> torch.Tensor:
    """Bit pattern of a tensor, so NaN canaries compare equal to themselves."""
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


MAT_CASES = [
    build_case((5, 0, 19), 3, 2, 2, 8, 4, seed=7, spare_pages=3, extra_pages=(1, 0, 0)),
    build_case((33,), 4, 1, 3, 16, 16, seed=8, layout="HND", block_storage="appended", spare_pages=2),
    build_case((2, 9), 2, 2, 1, 8, 2, seed=9, kv_dtype=FP8, k_scale=0.5, v_scale=2.0, spare_pages=1),
    build_case((6, 1), 5, 1, 2, 8, 4, seed=10, dtype="float16", kv_dtype=FP8, layout="HND",
               block_storage="appended", spare_pages=2, page_table_pad=3, page_table_dtype="int64"),
]


@pytest.mark.parametrize("case", MAT_CASES, ids=lambda c: c.short())
def test_materialize_is_deterministic(case):
    a, b = materialize(case), materialize(case)
    for name, t in a.tensors().items():
        u = b.tensors()[name]
        assert t.dtype == u.dtype and t.shape == u.shape and t.stride() == u.stride(), name
        assert torch.equal(_bits(t.contiguous()), _bits(u.contiguous())), name
    other = materialize(case.replace(seed=case.seed + 1))
    assert not torch.equal(a.q, other.q)
    assert not torch.equal(_bits(a.k_pool), _bits(other.k_pool))
    assert not torch.equal(a.k_block, other.k_block)


def _slot(inputs, pool, page, slot):
    return pool[page, slot] if inputs.case.layout == "NHD" else pool[page, :, slot]


@pytest.mark.parametrize("case", MAT_CASES, ids=lambda c: c.short())
def test_canary_fills_unowned_slots_and_owned_slots_are_finite(case):
    inputs = materialize(case)  # canary NaN by default
    assert inputs.canary == "nan"
    c = case
    owned = set()
    for b, L in enumerate(c.context_lens):
        n = L + (c.block_size if c.block_storage == "appended" else 0)
        for t in range(n):
            owned.add((c.pages[b][t // c.page_size], t % c.page_size))
    for pool in (inputs.k_pool, inputs.v_pool):
        for page in range(c.num_pages):
            for slot in range(c.page_size):
                x = _slot(inputs, pool, page, slot).float()
                if (page, slot) in owned:
                    assert torch.isfinite(x).all(), (page, slot)
                else:
                    assert torch.isnan(x).all(), (page, slot)
    for page in c.spare_pages():
        assert torch.isnan(inputs.k_pool[page].float()).all() and torch.isnan(inputs.v_pool[page].float()).all()
    assert torch.isfinite(inputs.q.float()).all()
    assert torch.isfinite(inputs.k_block.float()).all() and torch.isfinite(inputs.v_block.float()).all()
    for kind, want in (("zero", 0.0), ("large", 448.0 if c.kv_dtype == FP8 else 1.0e4)):
        other = materialize(case, canary=kind)
        for page in c.spare_pages():
            stored = torch.tensor(want).to(other.k_pool.dtype).float()  # 1e4 is 9984 in bf16
            assert (other.k_pool[page].float() == stored).all() and (other.v_pool[page].float() == stored).all()


@pytest.mark.parametrize("case", MAT_CASES, ids=lambda c: c.short())
def test_page_table_rows_and_appended_block(case):
    inputs = materialize(case)
    pt = inputs.page_table
    assert pt.dtype == {"int32": torch.int32, "int64": torch.int64}[case.page_table_dtype]
    assert pt.shape == (case.batch_size, case.max_pages_per_request)
    assert pt.stride(0) == case.max_pages_per_request + case.page_table_pad
    for b, row in enumerate(case.pages):
        assert pt[b, : len(row)].tolist() == list(row)
    if case.block_storage == "appended":
        for b, L in enumerate(case.context_lens):
            for j in range(case.block_size):
                page, slot = case.pages[b][(L + j) // case.page_size], (L + j) % case.page_size
                for pool, blk, s in ((inputs.k_pool, inputs.k_block, case.k_scale),
                                     (inputs.v_pool, inputs.v_block, case.v_scale)):
                    x = _slot(inputs, pool, page, slot).float()
                    x = x * s if case.kv_dtype == FP8 else x
                    assert torch.equal(x, blk[b, j].float())


def test_unknown_canary():
    with pytest.raises(InvalidInput) as ei:
        materialize(MAT_CASES[0], canary="inf")
    assert ei.value.where == "canary"


# ---- ulp ---------------------------------------------------------------------------------------------

def test_ulp_values():
    assert ulp_bf16(1.0) == 2**-7
    assert ulp_bf16(3.0) == 2**-6
    assert ulp_bf16(-3.0) == 2**-6
    assert ulp_bf16(0.75) == 2**-8
    assert ulp_fp16(1.0) == 2**-10
    assert ulp_fp16(65504.0) == 2**5
    assert ulp_bf16(0.0) == 2.0 ** (-126 - 7) and ulp_fp16(0.0) == 2.0 ** (-14 - 10)
    assert ulp_fp16(2.0**-20) == 2.0 ** (-14 - 10)  # subnormal range: constant spacing
    assert math.isinf(ulp_bf16(math.inf))
    # Agrees with the actual spacing of torch's bf16/fp16 at normal numbers.
    for x in (1.0, 1.5, 3.0, 100.0, 0.01, 12345.0):
        for dt, f in ((torch.bfloat16, ulp_bf16), (torch.float16, ulp_fp16)):
            t = torch.tensor(x, dtype=dt)
            nxt = torch.nextafter(t, torch.tensor(math.inf, dtype=dt))
            if abs(x) == 2.0 ** math.floor(math.log2(abs(x))):
                continue  # at a power of two the spacing below differs; above is what we check
            assert (nxt.double() - t.double()).item() == f(t.item()), (x, dt)


def test_ulp_just_below_a_power_of_two():
    """floor(log2 |x|) must be exact: math.log2 rounds 8 - 2**-50 up to 3.0 (the bug fixed in ulp.py)."""
    for e in range(-20, 20):
        x = math.nextafter(2.0**e, 0.0)
        assert ulp_bf16(x) == 2.0 ** (e - 1 - 7), (e, x)
        assert ulp_fp16(x) == 2.0 ** (e - 1 - 10) or e - 1 < -14, (e, x)
        assert ulp_bf16(2.0**e) == 2.0 ** (e - 7)


def test_to_json_dict_is_what_dataclasses_asdict_gives():
    """`Case.to_json_dict` copies field by field (no deep copy of every page id); the dict is the one the
    `dataclasses.asdict` form gave, for a format 2 and a format 1 case."""
    import dataclasses

    from strategies import build_case

    c = build_case(dict(context_lens=[70, 0, 33], block_size=3, num_kv_heads=2, group=2, head_dim=64, page_size=16,
                        window=("causal_swa", 5), dtype="bfloat16", kv_dtype="float8_e4m3fn", k_scale=0.5, v_scale=2.0,
                        scale=0.1, layout="HND", block_storage="dense", page_table_dtype="int64", page_table_pad=3,
                        spare_pages=2, extra_pages=1, perm_seed=4, seed=9))
    for case in (c, dataclasses.replace(c, version=1, values="plain", value_keys=())):
        d = dataclasses.asdict(case)
        for k in ("context_lens", "pages", "window", "value_keys"):
            d[k] = [list(r) for r in d[k]] if k == "pages" else list(d[k])
        if case.version == 1:
            del d["values"], d["value_keys"]
        del d["peak_keys"]  # optional: written only when set (a `peak` case's), so every other file is as it was
        want = {"version": d.pop("version"), "batch_size": case.batch_size, **d}
        assert case.to_json_dict() == want and list(case.to_json_dict()) == list(want)
