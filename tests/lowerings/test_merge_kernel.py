"""Tests of the one-kernel merge of future block keys (lowerings/_merge_kernel.py), docs/semantics.md 4.3.

Without CUDA the kernel runs under TRITON_INTERPRET=1 on CPU tensors (set before triton is imported);
with a GPU the same tests run the compiled kernel. The reference is fp64 torch written here.
"""

import sys

from lowerings import ensure_interpreter_on_cpu

ensure_interpreter_on_cpu()  # TRITON_INTERPRET=1 on machines without CUDA, before triton imports

import math  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from lowerings import _merge_kernel as mk  # noqa: E402
from lowerings import kernel_is_interpreted, kernel_param_is_constexpr  # noqa: E402

INTERP = kernel_is_interpreted(mk._merge_future_block_keys_kernel)
DEVICE = torch.device("cpu") if INTERP else torch.device("cuda")
N_ULP = 2 if INTERP else 4
LSE_TOL = 1e-3
LN2 = math.log(2.0)


def ulp(x: float, dtype: torch.dtype) -> float:
    mant = 7 if dtype == torch.bfloat16 else 10
    return 2.0 ** (math.floor(math.log2(abs(x))) - mant)


def reference(q, k_block, v_block, o_a, lse_a, scale, right, base):
    """fp64 merged O and LSE (LSE in ``base``), and the boolean [B, K, Hq] 'part B not empty'."""
    B, K, Hq, D = q.shape
    Hkv = k_block.shape[2]
    G = Hq // Hkv
    qd, kd, vd = q.cpu().double(), k_block.cpu().double(), v_block.cpu().double()
    oa = o_a.cpu().double()
    lse_a_nat = lse_a.cpu().double() * math.log(base)
    O = oa.clone()
    LSE = lse_a_nat.clone()
    has_b = torch.zeros(B, K, Hq, dtype=torch.bool)
    for i in range(K):
        hi = K - 1 if right == -1 else min(K - 1, i + right)
        js = list(range(i + 1, hi + 1))
        if not js:
            continue
        has_b[:, i] = True
        for h in range(Hq):
            s = scale * torch.einsum("bd,bjd->bj", qd[:, i, h], kd[:, js, h // G])  # [B, nj]
            lse_b = torch.logsumexp(s, -1)
            o_b = torch.einsum("bj,bjd->bd", torch.softmax(s, -1), vd[:, js, h // G])
            w = torch.sigmoid(lse_b - lse_a_nat[:, i, h])
            O[:, i, h] = oa[:, i, h] + w[:, None] * (o_b - oa[:, i, h])
            LSE[:, i, h] = torch.logaddexp(lse_a_nat[:, i, h], lse_b)
    return O, LSE / math.log(base), has_b


def make_inputs(B, K, Hq, Hkv, D=64, *, base=2.0, dtype=torch.bfloat16, seed=0, lse_shift=0.0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, K, Hq, D, generator=g).to(dtype).to(DEVICE)
    kb = torch.randn(B, K, Hkv, D, generator=g).to(dtype).to(DEVICE)
    vb = torch.randn(B, K, Hkv, D, generator=g).to(dtype).to(DEVICE)
    o_a = torch.randn(B, K, Hq, D, generator=g).to(dtype).to(DEVICE)
    # natural-log part-A LSE in the range of the part-B LSEs (|s| ~ 1, a few keys), plus a shift
    lse_nat = torch.randn(B, K, Hq, generator=g) * 1.5 + 1.0 + lse_shift
    lse_a = (lse_nat / math.log(base)).float().to(DEVICE)
    return q, kb, vb, o_a, lse_a


def check(O, LSE, O_ref, LSE_ref, has_b, o_a, lse_a, dtype=torch.bfloat16):
    assert torch.isfinite(O.float()).all() and torch.isfinite(LSE).all(), "NaN/Inf in the merge"
    bound = N_ULP * ulp(O_ref.abs().max().item(), dtype)
    err = (O.cpu().double() - O_ref).abs().max().item()
    assert err <= bound, f"max |O - O_ref| = {err} > {bound}"
    lerr = (LSE.cpu().double() - LSE_ref).abs().max().item()
    assert lerr < LSE_TOL, f"max |LSE - LSE_ref| = {lerr}"
    # rows with no later key in the window: part A bit for bit (output and LSE)
    hb = has_b.to(O.device)
    assert torch.equal(O[~hb].view(torch.int16), o_a[~hb].view(torch.int16))
    assert torch.equal(LSE[~hb].view(torch.int32), lse_a[~hb].view(torch.int32))


@pytest.mark.parametrize("base", [2.0, math.e], ids=["base2", "natural"])
@pytest.mark.parametrize("K", [1, 2, 3, 7])
@pytest.mark.parametrize("right_kind", ["-1", "0", "1", "2", "K-1", "K+3"])
def test_matches_reference(K, right_kind, base):
    right = {"-1": -1, "0": 0, "1": 1, "2": 2, "K-1": K - 1, "K+3": K + 3}[right_kind]
    B, Hq, Hkv = 2, 4, 2
    q, kb, vb, o_a, lse_a = make_inputs(B, K, Hq, Hkv, base=base, seed=K * 31 + right + 7)
    o_a0, lse_a0 = o_a.clone(), lse_a.clone()
    O_ref, LSE_ref, has_b = reference(q, kb, vb, o_a, lse_a, 0.125, right, base)
    launches = []
    O, LSE = mk.merge_future_block_keys_triton(q, kb, vb, o_a, lse_a, scale=0.125, right=right,
                                               lse_a_base=base, skip_when_empty=False, launches=launches)
    assert launches == ["merge_future_block_keys"]
    assert O.dtype == o_a.dtype and O.shape == o_a.shape and LSE.dtype == torch.float32
    check(O, LSE, O_ref, LSE_ref, has_b, o_a, lse_a)
    # the last query never has a later key
    assert torch.equal(O[:, K - 1].view(torch.int16), o_a[:, K - 1].view(torch.int16))
    # inputs untouched when not in place
    assert torch.equal(o_a, o_a0) and torch.equal(lse_a, lse_a0)
    # the short-circuit path gives the same bits and launches nothing when there is nothing to merge
    launches2 = []
    O2, LSE2 = mk.merge_future_block_keys_triton(q, kb, vb, o_a, lse_a, scale=0.125, right=right,
                                                 lse_a_base=base, launches=launches2)
    assert torch.equal(O2.view(torch.int16), O.view(torch.int16)) and torch.equal(LSE2, LSE)
    assert launches2 == ([] if not mk.merges_future_block_keys(K, right) else ["merge_future_block_keys"])
    if not mk.merges_future_block_keys(K, right):
        assert O2.data_ptr() != o_a.data_ptr()  # a copy, not the caller's tensor


@pytest.mark.parametrize("base", [2.0, math.e], ids=["base2", "natural"])
@pytest.mark.parametrize("shape", [(1, 7, 8, 2), (2, 7, 10, 2), (2, 16, 16, 1), (3, 5, 6, 6)],
                         ids=["R28", "R35_G5", "R256_two_row_blocks", "G1"])
def test_gqa_shapes(shape, base):
    B, K, Hq, Hkv = shape
    q, kb, vb, o_a, lse_a = make_inputs(B, K, Hq, Hkv, base=base, seed=sum(shape))
    for right in (-1, 3):
        O_ref, LSE_ref, has_b = reference(q, kb, vb, o_a, lse_a, 0.125, right, base)
        O, LSE = mk.merge_future_block_keys_triton(q, kb, vb, o_a, lse_a, scale=0.125, right=right,
                                                   lse_a_base=base)
        check(O, LSE, O_ref, LSE_ref, has_b, o_a, lse_a)


@pytest.mark.parametrize("shift", [-30.0, 30.0])
def test_large_lse_gap_both_orders(shift):
    # |LSE_A - LSE_B| large: the weight saturates at 0 or 1 without NaN; a base mix-up would show.
    q, kb, vb, o_a, lse_a = make_inputs(2, 4, 4, 2, base=2.0, seed=5, lse_shift=shift)
    O_ref, LSE_ref, has_b = reference(q, kb, vb, o_a, lse_a, 0.125, -1, 2.0)
    O, LSE = mk.merge_future_block_keys_triton(q, kb, vb, o_a, lse_a, scale=0.125, right=-1, lse_a_base=2.0)
    check(O, LSE, O_ref, LSE_ref, has_b, o_a, lse_a)


def test_base_matters():
    # The same numbers read as natural vs base 2 must give different merges (no guessing of bases).
    q, kb, vb, o_a, lse_a = make_inputs(1, 4, 4, 2, base=2.0, seed=6)
    O2, _ = mk.merge_future_block_keys_triton(q, kb, vb, o_a, lse_a, scale=0.125, right=-1, lse_a_base=2.0)
    Oe, _ = mk.merge_future_block_keys_triton(q, kb, vb, o_a, lse_a, scale=0.125, right=-1,
                                              lse_a_base=math.e)
    assert (O2.float() - Oe.float()).abs().max().item() > 1e-2


@pytest.mark.parametrize("base", [2.0, math.e], ids=["base2", "natural"])
@pytest.mark.parametrize("right", [-1, 0, 2])
def test_in_place_aliasing(right, base):
    K = 7
    q, kb, vb, o_a, lse_a = make_inputs(2, K, 8, 2, base=base, seed=40 + right)
    O_ref, L_ref = mk.merge_future_block_keys_triton(q, kb, vb, o_a, lse_a, scale=0.2, right=right,
                                                     lse_a_base=base, skip_when_empty=False)
    o_buf, l_buf = o_a.clone(), lse_a.clone()
    p0, p1 = o_buf.data_ptr(), l_buf.data_ptr()
    O, L = mk.merge_future_block_keys_triton(q, kb, vb, o_buf, l_buf, scale=0.2, right=right,
                                             lse_a_base=base, out=o_buf, out_lse=l_buf,
                                             skip_when_empty=False)
    assert O.data_ptr() == p0 and L.data_ptr() == p1
    assert torch.equal(o_buf.view(torch.int16), O_ref.view(torch.int16))
    assert torch.equal(l_buf.view(torch.int32), L_ref.view(torch.int32))
    # also the in-place short-circuit (right == 0): nothing launched, nothing changed
    if right == 0:
        launches = []
        o2, l2 = o_a.clone(), lse_a.clone()
        mk.merge_future_block_keys_triton(q, kb, vb, o2, l2, scale=0.2, right=0, lse_a_base=base,
                                          out=o2, out_lse=l2, launches=launches)
        assert launches == [] and torch.equal(o2, o_a) and torch.equal(l2, lse_a)


def test_in_place_strided_views():
    # part A living inside larger buffers (e.g. a head-sliced output): strides are honoured.
    B, K, Hq, Hkv, D = 2, 5, 4, 2, 64
    q, kb, vb, o_a, lse_a = make_inputs(B, K, Hq, Hkv, seed=77)
    big = torch.full((B, K, Hq + 3, D), float("nan"), dtype=o_a.dtype, device=DEVICE)
    bigl = torch.full((B, K, Hq + 3), float("nan"), dtype=torch.float32, device=DEVICE)
    big[:, :, 2:2 + Hq] = o_a
    bigl[:, :, 2:2 + Hq] = lse_a
    ov, lv = big[:, :, 2:2 + Hq], bigl[:, :, 2:2 + Hq]
    O_ref, LSE_ref, has_b = reference(q, kb, vb, o_a, lse_a, 0.125, 2, 2.0)
    mk.merge_future_block_keys_triton(q, kb, vb, ov, lv, scale=0.125, right=2, out=ov, out_lse=lv)
    check(ov, lv, O_ref, LSE_ref, has_b, o_a, lse_a)
    assert torch.isnan(big[:, :, :2]).all() and torch.isnan(big[:, :, 2 + Hq:]).all()
    assert torch.isnan(bigl[:, :, :2]).all() and torch.isnan(bigl[:, :, 2 + Hq:]).all()


def test_padded_rows_never_stored():
    B, K, Hq, Hkv, D = 2, 3, 4, 2, 64  # R = 6 -> R_PAD = 16
    q, kb, vb, o_a, lse_a = make_inputs(B, K, Hq, Hkv, seed=3)
    big = torch.full((B, K + 2, Hq + 2, D), float("nan"), dtype=o_a.dtype, device=DEVICE)
    bigl = torch.full((B, K + 2, Hq + 2), float("nan"), dtype=torch.float32, device=DEVICE)
    out, out_lse = big[:, 1:K + 1, 1:Hq + 1], bigl[:, 1:K + 1, 1:Hq + 1]
    mk.merge_future_block_keys_triton(q, kb, vb, o_a, lse_a, scale=0.125, right=-1, out=out, out_lse=out_lse)
    assert not torch.isnan(out).any() and not torch.isnan(out_lse).any()
    mask = torch.ones(B, K + 2, Hq + 2, dtype=torch.bool, device=DEVICE)
    mask[:, 1:K + 1, 1:Hq + 1] = False
    assert torch.isnan(big[mask]).all() and torch.isnan(bigl[mask]).all()


def test_fp16():
    q, kb, vb, o_a, lse_a = make_inputs(2, 4, 4, 2, dtype=torch.float16, base=math.e, seed=9)
    O_ref, LSE_ref, has_b = reference(q, kb, vb, o_a, lse_a, 0.125, 1, math.e)
    O, LSE = mk.merge_future_block_keys_triton(q, kb, vb, o_a, lse_a, scale=0.125, right=1, lse_a_base=math.e)
    assert O.dtype == torch.float16
    check(O, LSE, O_ref, LSE_ref, has_b, o_a, lse_a, dtype=torch.float16)


def test_right_is_a_runtime_argument():
    assert not kernel_param_is_constexpr(mk._merge_future_block_keys_kernel, "right")


def test_validation():
    q, kb, vb, o_a, lse_a = make_inputs(1, 3, 4, 2)
    kw = dict(scale=0.125, right=1)
    with pytest.raises(ValueError, match=r"D \(q.shape\[3\]\).*96"):
        z = torch.zeros(1, 3, 4, 96, dtype=q.dtype, device=DEVICE)
        mk.merge_future_block_keys_triton(z, kb[..., :1].expand(1, 3, 2, 96), vb, z, lse_a, **kw)
    with pytest.raises(ValueError, match="right must be"):
        mk.merge_future_block_keys_triton(q, kb, vb, o_a, lse_a, scale=0.125, right=-2)
    with pytest.raises(ValueError, match="lse_a_base"):
        mk.merge_future_block_keys_triton(q, kb, vb, o_a, lse_a, lse_a_base=1.0, **kw)
    with pytest.raises(ValueError, match="lse_a must be"):
        mk.merge_future_block_keys_triton(q, kb, vb, o_a, lse_a.double(), **kw)
    with pytest.raises(ValueError, match="k_block must have shape"):
        mk.merge_future_block_keys_triton(q, kb[:, :2], vb, o_a, lse_a, **kw)
    with pytest.raises(ValueError, match="multiple of Hkv"):
        mk.merge_future_block_keys_triton(q[:, :, :3], kb, vb, o_a[:, :, :3], lse_a[:, :, :3], **kw)
    with pytest.raises(ValueError, match="out overlaps o_a"):
        buf = torch.cat([o_a, o_a], 2)
        mk.merge_future_block_keys_triton(q, kb, vb, buf[:, :, :4], lse_a, out=buf[:, :, 1:5], **kw)
    with pytest.raises(ValueError, match="out must be"):
        mk.merge_future_block_keys_triton(q, kb, vb, o_a, lse_a, out=o_a.float(), **kw)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
