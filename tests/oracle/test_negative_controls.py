"""Negative controls: on cases built to separate them, each classic semantic bug (docs/bugs.md classes)
changes the oracle's answer by far more than any tolerance a lowering is judged with.

"Far more" here: max |O_a - O_b| > 100 bf16 ulp of max |O| (the default output bound is 8 ulp) and
relative L2 > 0.1 (the default bound is 1e-2), or an LSE difference > 0.5 natural-log units.
"""

from __future__ import annotations

import math

import torch

from tests.oracle.naive import naive_attention
from oracle import attention, materialize, ulp_bf16, window_for
from tests.oracle.oracle_cases import build_case

ULPS = 100
REL_L2 = 0.1
LSE_GAP = 0.5


def _out_gap(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float, float]:
    """(max |a - b|, that in bf16 ulp of max |a|, relative L2)."""
    diff = (a.double() - b.double()).abs().max().item()
    return diff, diff / ulp_bf16(a.abs().max().item()), ((a - b).double().norm() / a.double().norm()).item()


def _assert_separated(ra, rb, what, *, need_out=True, need_lse=True):
    diff, ulps, rel = _out_gap(ra.out, rb.out)
    lse_gap = (ra.lse - rb.lse).abs().max().item()
    msg = f"{what}: max|dO|={diff:.3g} ({ulps:.0f} bf16 ulp), rel L2={rel:.3g}, max|dLSE|={lse_gap:.3g}"
    print(msg)
    if need_out:
        assert ulps > ULPS and rel > REL_L2, msg
    if need_lse:
        assert lse_gap > LSE_GAP, msg
    return msg


def test_causal_vs_noncausal():
    """(-1, 0) vs (-1, -1) with K = 8 and a short context: early queries lose most block keys."""
    case = build_case((0, 3, 2), 8, 2, 2, 16, 4, window=window_for("noncausal"), seed=101)
    inputs = materialize(case)
    nc = attention(inputs)
    ca = attention(inputs, window=window_for("causal"))
    _assert_separated(nc, ca, "causal vs non-causal")
    # The last query of each request sees every key either way: identical there.
    assert torch.equal(nc.out[:, -1], ca.out[:, -1]) and torch.equal(nc.lse[:, -1], ca.lse[:, -1])


def test_windowed_vs_unwindowed_long_context():
    """(W-1, W-1) vs (-1, -1) with L >> W: the window drops almost every context key."""
    W = 3
    case = build_case((96, 64), 4, 2, 2, 16, 16, window=window_for("noncausal_swa", W), seed=102)
    inputs = materialize(case)
    sw = attention(inputs)
    full = attention(inputs, window=window_for("noncausal"))
    _assert_separated(sw, full, "noncausal SWA vs unwindowed")
    csw = attention(inputs, window=window_for("causal_swa", W))
    _assert_separated(csw, attention(inputs, window=window_for("causal")), "causal SWA vs causal")


def test_base2_vs_natural_lse():
    """The oracle's LSE is natural-log (it matches the naive ln-sum-exp); reading it as base 2 (or
    forgetting the * ln 2 on a base-2 LSE) is off by > 0.5 everywhere on a long context."""
    case = build_case((200, 230), 2, 1, 2, 16, 16, seed=103)
    inputs = materialize(case)
    r = attention(inputs, precision=torch.float64)
    _, naive_lse = naive_attention(inputs)
    assert (r.lse - naive_lse).abs().max().item() <= 1e-12
    base2 = r.lse / math.log(2)
    gap = (base2 - r.lse).abs().min().item()
    assert gap > LSE_GAP, f"min |LSE/ln2 - LSE| = {gap:.3g}"
    # And the natural LSE is what a log-sum-exp of the visible scores gives, not its base-2 form.
    assert (r.lse - naive_lse).abs().max().item() < 1e-9 < (base2 - naive_lse).abs().min().item()


def test_window_off_by_one():
    """W vs W-1: every query of a context longer than W gains keys, so every LSE grows; at least one
    row's output moves far beyond tolerance."""
    for kind in ("noncausal_swa", "causal_swa"):
        for W in (2, 3, 5):
            case = build_case((12, 9), 6, 2, 2, 16, 4, seed=104 + W)
            inputs = materialize(case)
            rw = attention(inputs, window=window_for(kind, W), precision=torch.float64)
            rw1 = attention(inputs, window=window_for(kind, W - 1), precision=torch.float64)
            assert (rw.lse > rw1.lse).all(), f"{kind} W={W}: some row did not gain a key"
            _assert_separated(rw, rw1, f"{kind} W={W} vs W-1", need_out=True, need_lse=True)
            # Row-wise: the row that moved most moved by far more than tolerance.
            row_gap = (rw.out - rw1.out).abs().amax(-1)
            assert row_gap.max().item() > ULPS * ulp_bf16(rw.out.abs().max().item())


def _wrong_gqa(inputs):
    """The oracle under the wrong GQA mapping `h -> h % Hkv`, built by permuting q's heads so that
    the correct mapping `h' -> h' // G` pairs query head h with KV head h % Hkv."""
    c = inputs.case
    Hq, Hkv, G = c.num_q_heads, c.num_kv_heads, c.group_size
    dest = [(h % Hkv) * G + h // Hkv for h in range(Hq)]
    assert sorted(dest) == list(range(Hq))
    permuted = inputs.clone()
    permuted.q[:, :, dest] = inputs.q
    r = attention(permuted)
    return r.out[:, :, dest], r.lse[:, :, dest], dest


def test_gqa_mapping_h_div_g_vs_h_mod_hkv():
    case = build_case((20, 5), 4, 2, 3, 16, 4, seed=105)  # Hq = 6, Hkv = 2, G = 3
    inputs = materialize(case)
    right = attention(inputs)
    wrong_out, wrong_lse, dest = _wrong_gqa(inputs)
    G, Hkv = case.group_size, case.num_kv_heads
    same = [h for h in range(case.num_q_heads) if h // G == h % Hkv]
    differ = [h for h in range(case.num_q_heads) if h // G != h % Hkv]
    assert same == [0, 2, 3, 5] and differ == [1, 4]
    # Construction check: heads whose KV head is the same under both mappings agree.
    assert torch.allclose(wrong_out[:, :, same], right.out[:, :, same], rtol=0, atol=1e-6)
    assert torch.allclose(wrong_lse[:, :, same], right.lse[:, :, same], rtol=0, atol=1e-6)

    class R:  # the two results restricted to the heads the mappings disagree on
        def __init__(self, out, lse):
            self.out, self.lse = out, lse

    _assert_separated(R(right.out[:, :, differ], right.lse[:, :, differ]),
                      R(wrong_out[:, :, differ], wrong_lse[:, :, differ]), "GQA h//G vs h%Hkv")
    # Independent check of the construction: the naive reference with the right mapping is `right`.
    ref_out, _ = naive_attention(inputs)
    assert (right.out.double() - ref_out).abs().max().item() < 1e-5
