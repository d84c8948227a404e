"""The lowering protocol's optional hooks (`OptionalHooks`, read through `optional_hook` /
`optional_attribute`), `devices` enforced before `available()`, and the semantic rules the lowerings share
(`oracle.rules`)."""

from __future__ import annotations

import inspect

import pytest
from hypothesis import strategies as st

import lowerings
from lowerings import flashinfer
from lowerings.protocol import (OPTIONAL_ATTRIBUTES, OPTIONAL_METHODS, OptionalHooks, device_refusal,
                                optional_attribute, optional_hook, protocol_violations)
from lowerings.torch_emulation import Context, DecodeRows, Sdpa
from oracle import rules
from parity.engine import policy
from parity.engine.runner import RunOptions, check_lowering, lowering_available
from strategies import build_case


class CudaOnlyClaimingCpu(Sdpa):
    """Declares `devices = ("cuda",)` but its `available()` says yes everywhere (the mismatch a plugin
    author makes); `available()` records that it was asked."""

    name = "cuda_only_claiming_cpu"
    devices = ("cuda",)

    def __init__(self) -> None:
        self.asked = 0

    def available(self, device):
        self.asked += 1
        return True, ""


def test_devices_is_enforced_before_available():
    lw = CudaOnlyClaimingCpu()
    assert lowering_available(lw, "cpu") == (False, "cuda_only_claiming_cpu runs on cuda only, not cpu")
    assert lw.asked == 0, "available() must not be asked on a device the lowering does not declare"
    rep = check_lowering(lw, policy.load(), strategy=st.nothing(), settings=lambda f: f, opts=RunOptions())
    assert rep.status == "unavailable" and rep.reason == "cuda_only_claiming_cpu runs on cuda only, not cpu"
    assert device_refusal(Sdpa(), "cpu") is None and device_refusal(Sdpa(), "cuda") is None


def test_optional_hooks_are_read_by_name_and_a_typo_is_refused():
    ctx = flashinfer.FlashinferContext("fa2")
    assert optional_hook(ctx, "kernel_families") == ctx.kernel_families
    assert optional_hook(Sdpa(), "kernel_families") is None
    assert optional_hook(DecodeRows(), "dispatch_boundaries")() == {"batch_size": (rules.DECODE_ROWS_MAX_BATCH,)}
    assert optional_attribute(Sdpa(), "writes_given_output") is False
    assert optional_attribute(DecodeRows(), "threshold") == 32 and optional_attribute(Sdpa(), "threshold") is None
    assert optional_attribute(ctx, "graph_safe") is True
    with pytest.raises(KeyError, match="kernel_family"):
        optional_hook(ctx, "kernel_family")
    with pytest.raises(KeyError, match="graphsafe"):
        optional_attribute(ctx, "graphsafe")


@pytest.mark.parametrize("attr,value,problem", [
    ("deterministic", 1, "'deterministic' must be True or False, got 1"),
    ("supports_by_shape", "yes", "'supports_by_shape' must be True or False, got 'yes'"),
    ("graph_safe", None, "'graph_safe' must be True or False, got None"),
    ("writes_given_output", 0, "'writes_given_output' must be True or False, got 0"),
    ("max_compiles", "3", "'max_compiles' must be None or an integer >= 0, got '3'"),
    ("max_compiles", -1, "'max_compiles' must be None or an integer >= 0, got -1"),
    ("threshold", True, "'threshold' must be None or an integer >= 0, got True"),
])
def test_a_declared_attribute_of_the_wrong_type_is_refused_at_registration(attr, value, problem):
    """Read loosely, `supports_by_shape = "yes"` was True and `max_compiles = "3"` a TypeError in the judge."""
    lw = Sdpa()
    setattr(lw, attr, value)
    assert protocol_violations(lw) == [problem]
    assert protocol_violations(Sdpa()) == [] and protocol_violations(DecodeRows()) == []


def test_the_protocol_declares_every_optional_hook_it_lists():
    """`OptionalHooks` declares each name of `OPTIONAL_METHODS` as a method and each of `OPTIONAL_ATTRIBUTES` as
    an annotated attribute, and its docstring documents every one of them."""
    doc = inspect.getdoc(OptionalHooks)
    for name in OPTIONAL_METHODS:
        assert callable(getattr(OptionalHooks, name, None)), name
        assert f"`{name}(" in doc, name
    for name in OPTIONAL_ATTRIBUTES:
        assert name in OptionalHooks.__annotations__, name
        assert f"`{name}`" in doc, name


def test_every_builtin_declares_only_known_optional_hooks():
    """A method or attribute named like a hook but misspelt would be silently ignored: every public callable of
    a built-in lowering is a required method, a known optional hook, or its own helper (listed)."""
    own = {"merge_calls", "uses_rows", "append_block", "decode", "prefill", "decode_call", "prefill_call",
           "append_call", "workspace", "decode_wrapper", "prefill_wrapper", "graph_decode",
           "graph_prefill", "graph_outputs", "graph_append", "poisoned_workspace"}
    required = {"available", "supports", "expected_calls", "run"}
    for lw in lowerings.all_lowerings():
        public = {n for n in dir(lw) if not n.startswith("_") and callable(getattr(lw, n))}
        unknown = public - required - set(OPTIONAL_METHODS) - own
        assert not unknown, (lw.name, unknown)


@pytest.mark.parametrize("window,K,reason", [
    (("noncausal", None), 4, None), (("noncausal_swa", 4), 4, None), (("noncausal_swa", 3), 4, "exact iff K-1 <= right"),
    (("causal", None), 1, None), (("causal", None), 2, "exact iff K-1 <= right"),
])
def test_the_context_window_rule_is_one_rule(window, K, reason):
    """The torch and flashinfer context adapters refuse exactly the cases `oracle.rules` refuses, word for word."""
    case = build_case(dict(context_lens=[20], block_size=K, num_kv_heads=1, group=1, head_dim=64, page_size=16,
                           window=window, dtype="bfloat16", kv_dtype="same", k_scale=1.0, v_scale=1.0, scale=None,
                           layout="NHD", block_storage="dense", page_table_dtype="int32", page_table_pad=0,
                           spare_pages=1, extra_pages=0, perm_seed=0, seed=1))
    want = rules.context_window_reason(case)
    assert (want is None) == (reason is None) and (reason is None or reason in want)
    assert Context().supports(case) == want
    assert flashinfer.FlashinferContext("fa2").supports(case) == want
    decode = rules.decode_rows_window_reason(case)
    assert DecodeRows().supports(case) == decode == flashinfer.FlashinferDecodeRows().supports(case)


@pytest.mark.parametrize("window,grouped", [(("noncausal", None), False), (("causal_swa", 5), False),
                                            (("noncausal", None), True)])
def test_the_yardstick_output_alone_is_the_same_bits_as_run(window, grouped, monkeypatch):
    """`Sdpa.run_output` (the yardstick's path, no LSE) returns `run(...).out` bit for bit, also one KV
    head's query group at a time (`SDPA_GROUPED_ELEMENTS`)."""
    import torch

    from lowerings import torch_emulation
    from oracle.inputs import materialize

    if grouped:
        monkeypatch.setattr(torch_emulation, "SDPA_GROUPED_ELEMENTS", 1)
    case = build_case(dict(context_lens=[33, 0, 70], block_size=3, num_kv_heads=2, group=2, head_dim=64, page_size=16,
                           window=window, dtype="bfloat16", kv_dtype="same", k_scale=1.0, v_scale=1.0, scale=None,
                           layout="NHD", block_storage="dense", page_table_dtype="int32", page_table_pad=0,
                           spare_pages=1, extra_pages=0, perm_seed=0, seed=1))
    inputs = materialize(case)
    full, alone = Sdpa().run(inputs), Sdpa().run_output(inputs)
    assert full.lse is not None and torch.equal(alone, full.out)


def _repeat_form(inputs):
    """The yardstick as it was before grouping its queries (commit 6e15ce2): K/V repeated `G` times per request,
    one query head per attention head. The reference `Sdpa` must agree with to within rounding."""
    import torch
    import torch.nn.functional as F

    from lowerings import paged

    c = inputs.case
    ps, K, G = c.page_size, c.block_size, c.group_size
    outs = []
    for b, L in enumerate(inputs.context_lens_host):
        t = torch.arange(L, device=inputs.device)
        pid = inputs.page_table[b].to(torch.long)[t // ps]
        k = torch.cat([paged.read_pool(inputs.k_pool, pid, t % ps, c.layout, c.k_scale, inputs.q.dtype),
                       inputs.k_block[b]]).transpose(0, 1).repeat_interleave(G, 0)
        v = torch.cat([paged.read_pool(inputs.v_pool, pid, t % ps, c.layout, c.v_scale, inputs.q.dtype),
                       inputs.v_block[b]]).transpose(0, 1).repeat_interleave(G, 0)
        pos = L + torch.arange(K, device=inputs.device).view(-1, 1)
        tt = torch.arange(L + K, device=inputs.device).view(1, -1)
        mask = torch.ones((K, L + K), dtype=torch.bool, device=inputs.device)
        if c.window[0] != -1:
            mask &= tt >= pos - c.window[0]
        if c.window[1] != -1:
            mask &= tt <= pos + c.window[1]
        outs.append(F.scaled_dot_product_attention(inputs.q[b].transpose(0, 1), k, v, attn_mask=mask,
                                                   scale=c.softmax_scale).transpose(0, 1))
    return torch.stack(outs)


def test_the_grouped_yardstick_agrees_with_repeated_keys_to_rounding():
    """GQA by grouping queries (`Sdpa._attend`) computes what repeating K/V per query head computed: equal to
    within one working-dtype rounding of the output (the SDPA kernels block the query rows differently: on
    a 2-core CPU of CI's kind 32 of these 120 cases differ in some element, by at most 2.5e-3 of max |O|,
    under one bf16 ulp there). Prints how many cases are bit for bit equal (on the H200: 79 of 120, worst 2.36e-3 of max |O|,
    docs/gpu/2026-12-02-h200-session11.md run 36)."""
    import torch
    from hypothesis import HealthCheck, given, settings

    from oracle.inputs import materialize
    from strategies import Limits, cases

    device = "cuda" if torch.cuda.is_available() else "cpu"
    seen = {"cases": 0, "equal": 0, "worst": 0.0}

    @settings(max_examples=120, derandomize=True, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(case=cases(Sdpa(), limits=Limits(max_batch=4, max_context=300, dtypes=("bfloat16", "float16"),
                                            kv_dtypes=("same", "float8_e4m3fn"))))
    def run(case):
        inputs = materialize(case, device)
        a, b = Sdpa().run_output(inputs).float(), _repeat_form(inputs).float()
        seen["cases"] += 1
        seen["equal"] += bool(torch.equal(a, b))
        if a.numel():
            err = float((a - b).abs().max() / a.abs().max().clamp_min(1e-30))
            seen["worst"] = max(seen["worst"], err)
            assert err <= 2.0 ** -7, (case.short(), err)  # one ulp of bf16 at the output's largest magnitude

    run()
    print(f"grouped vs repeated yardstick on {device}: {seen['equal']} of {seen['cases']} cases bit for bit equal, "
          f"worst difference {seen['worst']:.2e} of max |O|")


def test_the_batched_yardstick_is_each_request_alone_to_rounding(monkeypatch):
    """`sdpa_batches` puts requests of several lengths in one SDPA call, padded to the longest; the padding is
    zeros every row's mask hides, so each request's output is what it is alone (one request per call), to
    within one rounding of the output (torch's CPU kernels block a batch of calls differently: the same
    products and sums, another order in some elements), for ragged batches, windows, fp8 pools, both layouts
    and storages; the batches really hold several requests. A padding key the mask let through, or a row
    scattered back to another request, is off by far more (the per-request form failed 1.36 of max |O| while
    batching scattered rows wrongly, during development)."""
    import torch
    from hypothesis import HealthCheck, given, settings

    from lowerings import torch_emulation
    from oracle.inputs import materialize
    from strategies import Limits, cases

    seen = {"cases": 0, "batched": 0, "equal": 0, "worst": 0.0}

    @settings(max_examples=60, derandomize=True, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(case=cases(Sdpa(), limits=Limits(max_batch=6, max_context=300, kv_dtypes=("same", "float8_e4m3fn"))))
    def run(case):
        inputs = materialize(case)
        batched = Sdpa().run_output(inputs).float()
        with monkeypatch.context() as m:
            m.setattr(torch_emulation, "sdpa_batches", lambda c: [[b] for b in range(c.batch_size)])
            alone = Sdpa().run_output(inputs).float()
        seen["cases"] += 1
        seen["batched"] += len(torch_emulation.sdpa_batches(case)) < case.batch_size
        seen["equal"] += bool(torch.equal(batched, alone))
        err = float((batched - alone).abs().max() / alone.abs().max().clamp_min(1e-30))
        seen["worst"] = max(seen["worst"], err)
        assert err <= 2.0 ** -8, (case.short(), err)  # one rounding of a bf16 output: half an ulp at max |O|

    run()
    print(f"batched vs per-request yardstick: {seen['equal']} of {seen['cases']} cases bit for bit equal, worst "
          f"{seen['worst']:.2e} of max |O|; {seen['batched']} cases batched several requests")
    assert seen["batched"] >= 20, seen


def test_the_batched_yardstick_comparison_catches_a_row_scattered_to_another_request(monkeypatch):
    """Negative control for the test above: a batch whose rows come back in another order (each request given
    its neighbour's output) is far outside one rounding."""
    import torch

    from lowerings import torch_emulation
    from oracle.inputs import materialize
    from strategies import build_case

    case = build_case(dict(context_lens=[40, 17, 5], block_size=3, num_kv_heads=2, group=2, head_dim=64, page_size=16,
                           window=("noncausal", None), dtype="bfloat16", kv_dtype="same", k_scale=1.0, v_scale=1.0,
                           scale=None, layout="NHD", block_storage="dense", page_table_dtype="int32",
                           page_table_pad=0, spare_pages=1, extra_pages=0, perm_seed=0, seed=1))
    inputs = materialize(case)
    assert len(torch_emulation.sdpa_batches(case)) == 1
    real = torch_emulation.sdpa_batch
    monkeypatch.setattr(torch_emulation, "sdpa_batch",
                        lambda x, rows, with_lse, **kw: tuple(t.roll(1, 0) if t is not None else t
                                                              for t in real(x, rows, with_lse=with_lse, **kw)))
    scattered = Sdpa().run_output(inputs).float()
    monkeypatch.setattr(torch_emulation, "sdpa_batches", lambda c: [[b] for b in range(c.batch_size)])
    alone = Sdpa().run_output(inputs).float()
    assert float((scattered - alone).abs().max() / alone.abs().max()) > 2.0 ** -3
