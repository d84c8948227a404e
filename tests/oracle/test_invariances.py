"""Storage choices that mean the same keys give bit-identical oracle results (torch.equal on O and LSE).

Page assignment, NHD/HND, appended/dense block, int32/int64 page table, a strided page-table view and
the canary in unowned slots change where values sit, never what they are (docs/semantics.md section 1).
The key chunk size changes the summation order only: allclose, not bit-identical.
"""

from __future__ import annotations

import pytest
import torch

from oracle import attention, future_block_keys_mask, materialize
from tests.oracle.oracle_cases import build_case

FP8 = "float8_e4m3fn"

BASES = {
    "bf16": dict(context_lens=(0, 17, 33, 5), block_size=5, num_kv_heads=2, group=3, head_dim=16, page_size=4),
    "fp16_win": dict(context_lens=(9, 40), block_size=8, num_kv_heads=3, group=1, head_dim=8, page_size=1,
                     dtype="float16", window=(2, 2)),
    "fp8": dict(context_lens=(21, 0, 6), block_size=3, num_kv_heads=1, group=4, head_dim=64, page_size=16,
                kv_dtype=FP8, k_scale=0.5, v_scale=2.0, window=(-1, 0)),
    "fp8_fp16_swa": dict(context_lens=(12,), block_size=4, num_kv_heads=2, group=2, head_dim=16, page_size=2,
                         dtype="float16", kv_dtype=FP8, k_scale=2.0, v_scale=0.25, window=(3, 0)),
}


def _case(name, **over):
    kw = dict(BASES[name])
    kw.update(over)
    lens = kw.pop("context_lens")
    K, Hkv, G, D, ps = (kw.pop(k) for k in ("block_size", "num_kv_heads", "group", "head_dim", "page_size"))
    kw.setdefault("seed", 1234)
    return build_case(lens, K, Hkv, G, D, ps, **kw)


def _results(case, canary="nan", build="host"):
    inputs = materialize(case, canary=canary, build=build)
    key_mask = future_block_keys_mask(case, 1)
    out = []
    for prec in (torch.float32, torch.float64):
        out.append(attention(inputs, precision=prec))
        out.append(attention(inputs, precision=prec, key_mask=key_mask))
        out.append(attention(inputs, precision=prec, window=(1, 0)))
    return out


def _assert_bit_identical(ra, rb, what):
    for n, (a, b) in enumerate(zip(ra, rb)):
        assert torch.equal(a.out, b.out), f"{what}: out differs (result {n})"
        assert torch.equal(a.lse, b.lse), f"{what}: lse differs (result {n})"


VARIANTS = {
    "page_permutation_and_spares": dict(page_seed=98765, spare_pages=7, extra_pages=(1, 0, 1, 1)),
    "HND": dict(layout="HND"),
    "appended": dict(block_storage="appended"),
    "int64_table": dict(page_table_dtype="int64"),
    "strided_table": dict(page_table_pad=5),
    "everything_at_once": dict(page_seed=5, spare_pages=0, layout="HND", block_storage="appended",
                               page_table_dtype="int64", page_table_pad=2),
}


@pytest.mark.parametrize("build", ["host", "device", "counter"])
@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("base", sorted(BASES))
def test_storage_variant_is_bit_identical(base, variant, build):
    """Every build (`materialize(build=...)`; "device" draws from a generator on the target device,
    here the CPU one, in its own order; "counter" is format 3's CUDA build, here under Triton's
    interpreter) keeps the values independent of where they sit."""
    ref_case = _case(base)
    var_case = _case(base, **VARIANTS[variant])
    assert var_case != ref_case
    _assert_bit_identical(_results(ref_case, build=build), _results(var_case, build=build),
                          f"{base} vs {variant} ({build} build)")


@pytest.mark.parametrize("base", sorted(BASES))
def test_device_build_is_deterministic_with_the_host_builds_canaries(base):
    case = _case(base, block_storage="appended", spare_pages=3)
    host, dev, again = (materialize(case, build=b) for b in ("host", "device", "device"))
    for name in ("q", "k_pool", "v_pool", "k_block", "v_block", "page_table"):
        h, d, a = getattr(host, name), getattr(dev, name), getattr(again, name)
        assert (h.shape, h.dtype, h.stride()) == (d.shape, d.dtype, d.stride()), name
        assert torch.equal(d.view(torch.uint8) if d.element_size() == 1 else d.float().nan_to_num(7.0),
                           a.view(torch.uint8) if a.element_size() == 1 else a.float().nan_to_num(7.0)), name
    assert torch.equal(torch.isnan(host.k_pool.float()), torch.isnan(dev.k_pool.float()))
    # Format 2 draws the same values in both builds on one device type (oracle/values.py); format 1
    # drew them in another order.
    assert torch.equal(host.k_pool.float().nan_to_num(0.0), dev.k_pool.float().nan_to_num(0.0))
    old = case.replace(version=1)
    assert not torch.equal(materialize(old, build="host").k_pool.float().nan_to_num(0.0),
                           materialize(old, build="device").k_pool.float().nan_to_num(0.0))


@pytest.mark.parametrize("base", sorted(BASES))
def test_page_permutation_really_moves_values(base):
    """Guard for the test above: a different permutation does put the keys on different pages."""
    a, b = _case(base), _case(base, page_seed=98765, spare_pages=7)
    assert a.pages != b.pages
    assert materialize(b).page_table.stride(0) == materialize(b).page_table.shape[1]
    pt = materialize(_case(base, page_table_pad=5)).page_table
    assert pt.stride(0) == pt.shape[1] + 5
    assert pt.shape[0] == 1 or not pt.is_contiguous()


@pytest.mark.parametrize("base", sorted(BASES))
def test_canary_kind_does_not_change_oracle(base):
    """NaN, large or zero in every slot no request owns: identical oracle bits (never read)."""
    for storage in ("dense", "appended"):
        case = _case(base, block_storage=storage, spare_pages=3)
        ref = _results(case, canary="nan")
        for kind in ("large", "zero"):
            _assert_bit_identical(ref, _results(case, canary=kind), f"{base} {storage} canary nan vs {kind}")
        for r in ref:
            assert not torch.isnan(r.out).any() and not torch.isnan(r.lse).any()


@pytest.mark.parametrize("base", sorted(BASES))
def test_chunk_size_changes_rounding_only(base):
    case = _case(base)
    inputs = materialize(case)
    ref = attention(inputs)
    for chunk in (1, 3, 16):
        r = attention(inputs, chunk=chunk)
        assert torch.allclose(r.out, ref.out, rtol=0, atol=1e-6 * ref.out.abs().max().item()), chunk
        assert torch.allclose(r.lse, ref.lse, rtol=0, atol=1e-6 * max(1.0, ref.lse.abs().max().item())), chunk
    r64 = attention(inputs, precision=torch.float64)
    for chunk in (1, 5):
        r = attention(inputs, precision=torch.float64, chunk=chunk)
        assert (r.out - r64.out).abs().max().item() <= 1e-13
        assert (r.lse - r64.lse).abs().max().item() <= 1e-13


def test_host_lengths_match_device_lengths():
    """The oracle reads the int32 device lengths; they equal the host lengths of the case."""
    case = _case("bf16")
    inputs = materialize(case)
    assert inputs.context_lens.dtype == torch.int32
    assert tuple(inputs.context_lens.tolist()) == inputs.context_lens_host == case.context_lens
