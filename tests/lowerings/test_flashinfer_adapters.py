"""Tests of the flashinfer adapters (lowerings/flashinfer/).

CPU part: the module imports without flashinfer; every adapter satisfies the protocol, says why it
cannot run on a CPU (and trtllm-gen why it needs SM100), gives the right `supports()` reasons and
`expected_calls`; the paging helpers build flashinfer's CSR page table from strided int64 tables.
Then every adapter's glue (CSR page tables, qo_indptr, row anchoring, windows, fp8 scales, the append,
the merges, the counters) runs end to end through `run_case` on CPU against a *fake* `flashinfer`
written here from flashinfer's documented semantics (base-2 LSE, `last_page_len`, bottom-right
aligned queries, `window_left`, `k_scale` folded into `sm_scale`, `v_scale` on the output).

GPU part (`@pytest.mark.parity_gpu`): a few cases through the real flashinfer kernels.
"""

from __future__ import annotations

import math
import sys
import types

import pytest
import torch

import lowerings
from lowerings import flashinfer as fp
from lowerings import registry
from lowerings.protocol import protocol_violations
from parity.engine import policy as policy_mod
from parity.engine.runner import RunOptions, run_case
from strategies import build_case


def skip_compiled_triton_on_cpu_tensors(form_or_name: str) -> None:
    """The fake-flashinfer tests run on CPU tensors; on a CUDA machine the Triton merge kernel is
    compiled (not interpreted) and cannot read them: that form is covered there by the GPU tests."""
    if "triton" in form_or_name:
        from lowerings import _merge_kernel
        from lowerings import kernel_is_interpreted
        if not kernel_is_interpreted(_merge_kernel._merge_future_block_keys_kernel):
            pytest.skip("Triton kernels are compiled here (CUDA machine): CPU tensors cannot be read; "
                        "the GPU tests cover this form")

LN2 = math.log(2.0)
FP8 = getattr(torch, "float8_e4m3fn", None)


def params(**kw):
    p = dict(context_lens=[17], block_size=3, num_kv_heads=2, group=4, head_dim=64, page_size=16,
             window=("noncausal", None), dtype="bfloat16", kv_dtype="same", k_scale=1.0, v_scale=1.0, scale=None,
             layout="NHD", block_storage="dense", page_table_dtype="int32", page_table_pad=0, spare_pages=1,
             extra_pages=0, perm_seed=7, seed=3)
    p.update(kw)
    return p


def case(**kw):
    return build_case(params(**kw))


# --------------------------------------------------------------------------------------------------
# Import, registration, protocol, availability
# --------------------------------------------------------------------------------------------------


def test_module_imports_and_registers_without_flashinfer(monkeypatch, restore_registry):
    monkeypatch.setitem(sys.modules, "flashinfer", None)  # `import flashinfer` now raises ImportError
    ok, why = fp.flashinfer_status()
    assert not ok and "flashinfer is not importable" in why
    for name in fp.ADAPTER_NAMES:
        registry.unregister(name)
    added = registry.register_new(fp.adapters())
    assert sorted(added) == sorted(fp.ADAPTER_NAMES)
    assert registry.register_new(fp.adapters()) == []  # idempotent
    for name in fp.ADAPTER_NAMES:
        assert lowerings.get(name).name == name


def test_names():
    assert fp.ADAPTER_NAMES == (
        "context[flashinfer-fa2]", "context[flashinfer-fa3]", "decode_rows[flashinfer]", "decode_rows[flashinfer-tc]",
        "windowed_merge[flashinfer-eager]", "windowed_merge[flashinfer-compiled]",
        "windowed_merge[flashinfer-triton]", "windowed_merge[flashinfer-merge_state]",
        "trtllm_gen[decode]", "trtllm_gen[context]")


@pytest.mark.parametrize("adapter", fp.adapters(), ids=lambda a: a.name)
def test_protocol_and_cpu_unavailable(adapter):
    assert protocol_violations(adapter) == []
    assert adapter.devices == ("cuda",) and adapter.lse_base == 2.0 and adapter.deterministic is True
    ok, why = adapter.available("cpu")
    assert not ok and "cpu" in why


@pytest.mark.parametrize("kind", ["decode", "context"])
def test_trtllm_gen_reason_names_sm100_off_blackwell(kind):
    a = fp.TrtllmGen(kind)
    for dev in ("cpu", "cuda"):
        ok, why = a.available(dev)
        if torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 10 and dev == "cuda":
            continue
        assert not ok and "SM100" in why, why
    if torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9:
        ok, why = a.available("cuda")
        assert why.startswith("trtllm-gen kernels need SM100/SM103 (Blackwell); this GPU is sm_90"), why


def test_trtllm_gen_run_refuses_off_blackwell():
    if torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 10:
        pytest.skip("an SM100-family GPU is present: trtllm-gen may run here")
    from oracle.inputs import materialize
    inputs = materialize(case(), "cpu")
    with pytest.raises(RuntimeError, match="refuses to call trtllm-gen"):
        fp.TrtllmGen("decode").run(inputs)


# --------------------------------------------------------------------------------------------------
# supports() and expected_calls()
# --------------------------------------------------------------------------------------------------


def test_decode_rows_reject_windows():
    for a in (fp.FlashinferDecodeRows(False), fp.FlashinferDecodeRows(True)):
        for w in (("noncausal_swa", 4), ("causal", None), ("causal_swa", 4)):
            why = a.supports(case(window=w))
            assert why and "non-causal unwindowed layers only" in why, why
        assert a.supports(case()) is None


def test_cuda_core_decode_rejects_unsupported_groups():
    rows = fp.FlashinferDecodeRows(False)
    for g in (5, 7):
        why = rows.supports(case(group=g))
        assert why and "GQA groups" in why and f"G={g}" in why, why
        # Above the threshold the context form (fa2) takes the batch: any group.
        assert rows.supports(case(group=g, context_lens=[3] * 33)) is None
        assert fp.FlashinferDecodeRows(True).supports(case(group=g)) is None
        wm = fp.FlashinferWindowedMerge("eager")
        assert "GQA groups" in (wm.supports(case(group=g, window=("noncausal_swa", 4))) or "")
    for g in fp.CUDA_CORE_DECODE_GROUPS:
        if g <= 8:
            assert rows.supports(case(group=g)) is None


def test_context_rejects_k_beyond_the_window():
    for backend in ("fa2", "fa3"):
        a = fp.FlashinferContext(backend)
        why = a.supports(case(block_size=7, window=("noncausal_swa", 4)))
        assert why and "K-1 <= right" in why, why
        assert a.supports(case(block_size=4, window=("noncausal_swa", 4))) is None  # K == W: exact
        assert "K-1 <= right" in (a.supports(case(block_size=3, window=("causal", None))) or "")
        assert a.supports(case(block_size=1, window=("causal", None))) is None


def test_fa3_rejects_fp8_kv_and_fa2_takes_it():
    c = case(kv_dtype="float8_e4m3fn", k_scale=0.5, v_scale=2.0)
    assert "fp8" in (fp.FlashinferContext("fa3").supports(c) or "")
    assert fp.FlashinferContext("fa2").supports(c) is None


def test_head_dims():
    assert "head_dim" in (fp.FlashinferContext("fa2").supports(case(head_dim=96)) or "")


def test_expected_calls_follow_the_dispatch_threshold():
    dec = fp.FlashinferDecodeRows(False)
    tc = fp.FlashinferDecodeRows(True)
    b32 = case(context_lens=[5] * 32)
    b33 = case(context_lens=[5] * 33)
    app = {fp.C_BATCH_POS: 1, fp.C_APPEND: 1}
    assert dec.expected_calls(b32) == {**app, "flashinfer.BatchDecode.run": 1}
    assert tc.expected_calls(b32) == {**app, "flashinfer.BatchDecode[tc].run": 1}
    assert dec.expected_calls(b33) == {**app, "flashinfer.BatchPrefill[fa2].run": 1}
    assert tc.expected_calls(b33) == {**app, "flashinfer.BatchPrefill[fa2].run": 1}
    appended = case(context_lens=[5] * 32, block_storage="appended")
    assert dec.expected_calls(appended) == {"flashinfer.BatchDecode.run": 1}
    assert dec.kernel_families(b32)["flashinfer.BatchDecode.run"] == "BatchDecodeWithPagedKVCacheKernel"
    assert dec.kernel_families(b33)["flashinfer.BatchPrefill[fa2].run"] == "BatchPrefillWithPagedKVCacheKernel"
    assert fp.FlashinferContext("fa3").expected_calls(appended) == {"flashinfer.BatchPrefill[fa3].run": 1}


def test_fa3_kernel_families_detect_fa2_replacement():
    c = case()
    fa3 = fp.FlashinferContext("fa3")
    want = fa3.kernel_families(c)["flashinfer.BatchPrefill[fa3].run"]
    forbidden = set(fa3.forbidden_kernel_families(c).values())
    assert "BatchPrefillWithPagedKVCacheKernel" in forbidden
    # The fa3 substring must not match the fa2 kernel's name (demangled or mangled).
    assert want not in "void flashinfer::BatchPrefillWithPagedKVCacheKernel<KTraits, Params>(Params)"
    assert want in "void flashinfer::PrefillWithKVCacheKernel<flashinfer::SparseCollectiveMainloop<...>>(...)"


def test_windowed_merge_calls():
    for form in fp.WINDOWED_MERGE_FORMS:
        a = fp.FlashinferWindowedMerge(form)
        merged = a.expected_calls(case(block_size=4, window=("noncausal_swa", 3)))
        assert merged[fp.C_DECODE] == 1 and len(merged) == 4, merged
        for no_merge in (case(block_size=1, window=("noncausal_swa", 3)), case(block_size=4, window=("causal_swa", 3))):
            assert a.expected_calls(no_merge) == {fp.C_BATCH_POS: 1, fp.C_APPEND: 1, fp.C_DECODE: 1}
    assert fp.FlashinferWindowedMerge("merge_state").expected_calls(
        case(block_size=4, window=("noncausal_swa", 3)))[fp.C_MERGE_STATE] == 1


# --------------------------------------------------------------------------------------------------
# Paging helpers
# --------------------------------------------------------------------------------------------------


def test_build_paging_from_strided_int64_table():
    buf = torch.full((3, 6), -(2**40), dtype=torch.int64)
    buf[:, :4] = torch.tensor([[9, 4, 7, 1], [2, 3, 0, 0], [5, 8, 6, 0]])
    table = buf[:, :4]  # strided row view, int64, garbage past the view
    pg = fp.build_paging(table, rows=[0, 0, 1, 2], lens=[1, 33, 16, 17], page_size=16, device="cpu")
    assert pg.indptr.tolist() == [0, 1, 4, 5, 7]
    assert pg.indices.tolist() == [9, 9, 4, 7, 2, 5, 8]
    assert pg.last_page_len.tolist() == [1, 1, 16, 1]
    assert pg.indices.dtype == pg.indptr.dtype == pg.last_page_len.dtype == torch.int32
    with pytest.raises(ValueError, match="columns"):
        fp.build_paging(table, rows=[0], lens=[65], page_size=16, device="cpu")
    with pytest.raises(ValueError, match="at least one token"):
        fp.build_paging(table, rows=[0], lens=[0], page_size=16, device="cpu")


@pytest.mark.skipif(FP8 is None, reason="torch has no float8_e4m3fn")
def test_to_pool_dtype_quantizes_for_fp8():
    x = torch.tensor([[[1.0, -2.0, 0.5, 448.0]]], dtype=torch.bfloat16)
    q = fp.to_pool_dtype(x, FP8, 2.0)
    assert q.dtype == FP8 and torch.equal(q.float(), torch.tensor([[[0.5, -1.0, 0.25, 224.0]]]))
    assert fp.to_pool_dtype(x, torch.bfloat16, 1.0).dtype == torch.bfloat16


# --------------------------------------------------------------------------------------------------
# A fake flashinfer, from flashinfer's documented semantics, to run the glue end to end on CPU
# --------------------------------------------------------------------------------------------------

CUDA_CORE_GROUPS = (1, 2, 3, 4, 6, 8, 16)


def _seq_lens(indptr, last, page_size):
    n_pages = (indptr[1:] - indptr[:-1]).long()
    last = last.long()
    assert bool((n_pages >= 1).all()), "every request needs at least one page"
    assert bool(((last >= 1) & (last <= page_size)).all()), f"1 <= last_page_len <= page_size, got {last.tolist()}"
    return ((n_pages - 1) * page_size + last).tolist()


def _gather(pool, layout, indices, start, kv_len, page_size):
    t = torch.arange(kv_len)
    pages = indices[start + t // page_size].long()
    slot = t % page_size
    x = pool[pages, slot] if layout == "NHD" else pool[pages, :, slot]
    return x.float()  # [T, Hkv, D] as stored (fp8 not dequantized: scales are applied like flashinfer does)


def _attend(q, k, v, mask, sm_scale):
    """q [M, Hq, D] fp32; k, v [T, Hkv, D]; mask [M, T]. -> out [M, Hq, D], lse base 2 [M, Hq]."""
    G = q.shape[1] // k.shape[1]
    kk = k.repeat_interleave(G, dim=1).double()
    vv = v.repeat_interleave(G, dim=1).double()
    s = torch.einsum("mhd,thd->mht", q.double(), kk) * sm_scale
    s = s.masked_fill(~mask[:, None, :], float("-inf"))
    lse = torch.logsumexp(s, -1)
    o = torch.einsum("mht,thd->mhd", torch.softmax(s, -1), vv)
    return o.float(), (lse / LN2).float()


class FakeDecodeWrapper:
    def __init__(self, float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False, use_tensor_cores=False):
        assert float_workspace_buffer.dtype == torch.uint8
        self.layout, self.tc = kv_layout, use_tensor_cores
        self._use_tensor_cores, self._backend = use_tensor_cores, "auto"  # as flashinfer's wrapper keeps them

    def plan(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size, *args,
             pos_encoding_mode="NONE", window_left=-1, logits_soft_cap=None, q_data_type="float16",
             kv_data_type=None, sm_scale=None, **kw):
        assert not args, "optional plan() arguments must be passed by keyword"
        assert indptr.dtype == indices.dtype == last_page_len.dtype == torch.int32
        assert pos_encoding_mode == "NONE"
        if not self.tc and num_qo_heads // num_kv_heads not in CUDA_CORE_GROUPS:
            raise RuntimeError(f"Unsupported group_size: {num_qo_heads // num_kv_heads}")
        self.indptr, self.indices = indptr.cpu(), indices.cpu()
        self.lens = _seq_lens(self.indptr, last_page_len.cpu(), page_size)
        self.ps, self.wl, self.sm, self.D = page_size, window_left, sm_scale, head_dim
        self.q_dtype, self.kv_dtype = q_data_type, kv_data_type or q_data_type
        self.heads = (num_qo_heads, num_kv_heads)
        if self.tc and self._backend == "auto":
            self._backend = "fa2"  # flashinfer resolves the tensor-core path's backend at plan()

    def run(self, q, paged_kv_cache, *args, q_scale=None, k_scale=None, v_scale=None, out=None, lse=None,
            return_lse=False, **kw):
        k_cache, v_cache = paged_kv_cache
        assert q.dtype == self.q_dtype and k_cache.dtype == self.kv_dtype, (q.dtype, k_cache.dtype)
        assert q.shape == (len(self.lens), self.heads[0], self.D), (tuple(q.shape), len(self.lens))
        sm = (self.sm if self.sm is not None else self.D ** -0.5) * (k_scale if k_scale is not None else 1.0)
        outs, lses = [], []
        for n, kv_len in enumerate(self.lens):
            k = _gather(k_cache, self.layout, self.indices, int(self.indptr[n]), kv_len, self.ps)
            v = _gather(v_cache, self.layout, self.indices, int(self.indptr[n]), kv_len, self.ps)
            t = torch.arange(kv_len)
            mask = (t >= kv_len - 1 - self.wl) if self.wl >= 0 else torch.ones(kv_len, dtype=torch.bool)
            o, l2 = _attend(q[n:n + 1].float(), k, v, mask[None], sm)
            outs.append(o[0])
            lses.append(l2[0])
        o = torch.stack(outs).to(q.dtype)
        if v_scale is not None:
            o *= v_scale
        return (o, torch.stack(lses)) if return_lse else o


class FakePrefillWrapper:
    def __init__(self, float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False, backend="auto", **kw):
        assert backend in ("auto", "fa2", "fa3")
        self.layout, self.backend = kv_layout, backend
        self._backend = backend  # flashinfer's attribute: "auto" until plan() resolves it

    def plan(self, qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, num_qo_heads,
             num_kv_heads, head_dim_qk, page_size, head_dim_vo=None, custom_mask=None, packed_custom_mask=None,
             causal=False, pos_encoding_mode="NONE", use_fp16_qk_reduction=False, sm_scale=None, window_left=-1,
             logits_soft_cap=None, rope_scale=None, rope_theta=None, q_data_type="float16", kv_data_type=None, **kw):
        assert qo_indptr.dtype == paged_kv_indptr.dtype == paged_kv_indices.dtype == torch.int32
        if self.backend == "fa3" and kv_data_type == FP8 and q_data_type != FP8:
            raise RuntimeError("fake: fa3 has no bf16-q x fp8-kv kernel")
        self.qo_indptr = qo_indptr.cpu()
        self.indptr, self.indices = paged_kv_indptr.cpu(), paged_kv_indices.cpu()
        self.lens = _seq_lens(self.indptr, paged_kv_last_page_len.cpu(), page_size)
        self.ps, self.wl, self.sm, self.D, self.causal = page_size, window_left, sm_scale, head_dim_qk, causal
        self.q_dtype, self.kv_dtype = q_data_type, kv_data_type or q_data_type
        if self._backend == "auto":
            self._backend = "fa2"

    def run(self, q, paged_kv_cache, *args, k_scale=None, v_scale=None, out=None, lse=None, return_lse=False, **kw):
        k_cache, v_cache = paged_kv_cache
        assert q.dtype == self.q_dtype and k_cache.dtype == self.kv_dtype
        assert q.shape[0] == int(self.qo_indptr[-1])
        sm = (self.sm if self.sm is not None else self.D ** -0.5) * (k_scale if k_scale is not None else 1.0)
        outs, lses = [], []
        for b, kv_len in enumerate(self.lens):
            q0, q1 = int(self.qo_indptr[b]), int(self.qo_indptr[b + 1])
            qo_len = q1 - q0
            k = _gather(k_cache, self.layout, self.indices, int(self.indptr[b]), kv_len, self.ps)
            v = _gather(v_cache, self.layout, self.indices, int(self.indptr[b]), kv_len, self.ps)
            pos = kv_len - qo_len + torch.arange(qo_len).view(-1, 1)  # bottom-right aligned
            t = torch.arange(kv_len).view(1, -1)
            mask = torch.ones(qo_len, kv_len, dtype=torch.bool)
            if self.wl >= 0:
                mask &= t >= pos - self.wl
            if self.causal:
                mask &= t <= pos
            o, l2 = _attend(q[q0:q1].float(), k, v, mask, sm)
            outs.append(o)
            lses.append(l2)
        o = torch.cat(outs).to(q.dtype)
        if v_scale is not None:
            o *= v_scale
        return (o, torch.cat(lses)) if return_lse else o


def fake_get_batch_indices_positions(append_indptr, seq_lens, nnz):
    bi = torch.empty(nnz, dtype=torch.int32)
    pos = torch.empty(nnz, dtype=torch.int32)
    ai, sl = append_indptr.cpu().tolist(), seq_lens.cpu().tolist()
    for b in range(len(ai) - 1):
        for off in range(ai[b], ai[b + 1]):
            bi[off] = b
            pos[off] = off + sl[b] - ai[b + 1]
    return bi.to(append_indptr.device), pos.to(append_indptr.device)


def fake_append_paged_kv_cache(append_key, append_value, batch_indices, positions, paged_kv_cache, kv_indices,
                               kv_indptr, kv_last_page_len, kv_layout="NHD"):
    k_cache, v_cache = paged_kv_cache
    # The real kernel reinterprets append_key as the cache dtype without a check: make that loud here.
    if append_key.dtype != k_cache.dtype or append_value.dtype != v_cache.dtype:
        raise TypeError(f"append dtype {append_key.dtype} != cache dtype {k_cache.dtype}")
    assert append_key.dim() == 3 and append_key.stride(-1) == 1
    ps = k_cache.shape[1] if kv_layout == "NHD" else k_cache.shape[2]
    lens = _seq_lens(kv_indptr.cpu(), kv_last_page_len.cpu(), ps)
    indices, indptr = kv_indices.cpu(), kv_indptr.cpu()
    for n in range(append_key.shape[0]):
        b, p = int(batch_indices[n]), int(positions[n])
        assert 0 <= p < lens[b]
        page, slot = int(indices[int(indptr[b]) + p // ps]), p % ps
        for cache, src in ((k_cache, append_key), (v_cache, append_value)):
            if kv_layout == "NHD":
                cache[page, slot] = src[n]
            else:
                cache[page, :, slot] = src[n]


def fake_merge_state_in_place(v, s, v_other, s_other, mask=None):
    for t in (v, s, v_other, s_other):
        assert t.is_contiguous()
    assert v.dtype in (torch.float16, torch.bfloat16) and v_other.dtype == v.dtype
    assert s.dtype == s_other.dtype == torch.float32 and v.dim() == 3 and s.dim() == 2
    rows = torch.ones(v.shape[0], dtype=torch.bool) if mask is None else mask.cpu().bool()
    s_max = torch.maximum(s, s_other)
    a = torch.exp2(s - s_max)
    b = torch.exp2(s_other - s_max)
    merged = (a[..., None] * v.float() + b[..., None] * v_other.float()) / (a + b)[..., None]
    new_s = torch.log2(a + b) + s_max
    v[rows] = merged[rows].to(v.dtype)
    s[rows] = new_s[rows]


def install_fake_flashinfer(monkeypatch, decode_wrapper, prefill_wrapper, version: str = "fake"):
    """A `flashinfer` module (with `flashinfer.page`) of fakes in `sys.modules` for one test."""
    fi = types.ModuleType("flashinfer")
    fi.__version__ = version
    page = types.ModuleType("flashinfer.page")
    page.append_paged_kv_cache = fake_append_paged_kv_cache
    page.get_batch_indices_positions = fake_get_batch_indices_positions
    fi.page = page
    fi.BatchDecodeWithPagedKVCacheWrapper = decode_wrapper
    fi.BatchPrefillWithPagedKVCacheWrapper = prefill_wrapper
    fi.merge_state_in_place = fake_merge_state_in_place
    monkeypatch.setitem(sys.modules, "flashinfer", fi)
    monkeypatch.setitem(sys.modules, "flashinfer.page", page)
    return fi


@pytest.fixture
def fake_flashinfer(monkeypatch):
    return install_fake_flashinfer(monkeypatch, FakeDecodeWrapper, FakePrefillWrapper)


POLICY = policy_mod.load()


def run_on_cpu(adapter, c):
    out = run_case(adapter, c, POLICY, RunOptions(device="cpu"), yardstick=lowerings.get("sdpa"))
    assert out.status == "pass", f"{adapter.name} {c.short()}: {out.summary()}"
    return out


GLUE_CASES = {
    "b1_k1_ctx0": dict(context_lens=[0], block_size=1, group=1, num_kv_heads=1),
    "b2_hnd_page_edges": dict(context_lens=[15, 16], block_size=3, layout="HND", page_size=16),
    "int64_strided_appended": dict(context_lens=[17, 0, 33], block_size=4, page_size=4, page_table_dtype="int64",
                                   page_table_pad=3, block_storage="appended", group=2),
    "fp8_scales": dict(context_lens=[9, 20], block_size=3, kv_dtype="float8_e4m3fn", k_scale=0.5, v_scale=2.0,
                       page_size=8, layout="HND"),
}


@pytest.mark.parametrize("name", list(GLUE_CASES))
@pytest.mark.parametrize("make", [lambda: fp.FlashinferContext("fa2"), lambda: fp.FlashinferContext("fa3"),
                                  lambda: fp.FlashinferDecodeRows(False), lambda: fp.FlashinferDecodeRows(True)],
                         ids=["fa2", "fa3", "rows", "rows-tc"])
def test_glue_unwindowed_against_fake(fake_flashinfer, make, name):
    adapter = make()
    c = case(**GLUE_CASES[name])
    if adapter.supports(c):
        assert adapter.name == "context[flashinfer-fa3]" and c.kv_dtype == "float8_e4m3fn"
        return
    out = run_on_cpu(adapter, c)
    assert out.calls == adapter.expected_calls(c)


def test_glue_decode_rows_above_threshold_uses_prefill(fake_flashinfer):
    c = case(context_lens=[0, 1, 15, 16, 17] * 6 + [5, 6, 40], block_size=2, page_size=16, group=5)
    for adapter in (fp.FlashinferDecodeRows(False), fp.FlashinferDecodeRows(True)):
        out = run_on_cpu(adapter, c)
        assert out.calls == {fp.C_BATCH_POS: 1, fp.C_APPEND: 1, "flashinfer.BatchPrefill[fa2].run": 1}


@pytest.mark.parametrize("w", [2, 5])
def test_glue_context_with_window(fake_flashinfer, w):
    c = case(context_lens=[3, 20], block_size=2, window=("noncausal_swa", w), page_size=4)
    run_on_cpu(fp.FlashinferContext("fa2"), c)


WINDOW_CASES = {
    "swa_w3_k4": dict(context_lens=[0, 10], block_size=4, window=("noncausal_swa", 3), page_size=4),
    "swa_w1": dict(context_lens=[5], block_size=3, window=("noncausal_swa", 1)),
    "swa_hnd_fp8": dict(context_lens=[7, 2], block_size=5, window=("noncausal_swa", 3), layout="HND",
                        kv_dtype="float8_e4m3fn", k_scale=2.0, v_scale=0.5, page_size=8),
    "noncausal_all_later": dict(context_lens=[12], block_size=4, window=("noncausal", None)),
    "causal_swa_no_merge": dict(context_lens=[9], block_size=4, window=("causal_swa", 3)),
    "k1_no_merge": dict(context_lens=[9, 0], block_size=1, window=("noncausal_swa", 3)),
}


@pytest.mark.parametrize("name", list(WINDOW_CASES))
@pytest.mark.parametrize("form", fp.WINDOWED_MERGE_FORMS)
def test_glue_windowed_merge_against_fake(fake_flashinfer, form, name):
    skip_compiled_triton_on_cpu_tensors(form)
    adapter = fp.FlashinferWindowedMerge(form)
    c = case(**WINDOW_CASES[name])
    out = run_on_cpu(adapter, c)
    assert out.calls == adapter.expected_calls(c)
    labels = [cmp.label for cmp in out.comparisons]
    assert "partial A" in labels
    if form in ("eager", "merge_state") and c.merges_future_block_keys:
        assert "partial B" in labels


def test_merge_state_leaves_the_last_row_and_inputs_alone(fake_flashinfer):
    from oracle.inputs import materialize
    c = case(context_lens=[6, 3], block_size=4, window=("noncausal_swa", 2))
    inputs = materialize(c, "cpu")
    ms = fp.FlashinferWindowedMerge("merge_state").run(inputs)
    a = ms.partials["A"]
    # Row i = K-1 has no later key: part A bit for bit (the masked rows of merge_state_in_place).
    assert torch.equal(ms.out[:, -1], a.out[:, -1]) and torch.equal(ms.lse[:, -1], a.lse[:, -1])
    assert not torch.equal(ms.out[:, 0], a.out[:, 0])  # merged rows changed, on the adapter's copies
    assert ms.out.data_ptr() != a.out.data_ptr()


# --------------------------------------------------------------------------------------------------
# GPU: the real flashinfer kernels
# --------------------------------------------------------------------------------------------------


def _need_flashinfer():
    ok, why = fp.flashinfer_status()
    if not ok:
        pytest.skip(why)


GPU_CASES = [
    ("context[flashinfer-fa2]", dict(context_lens=[0, 17, 300], block_size=7, group=4, head_dim=128)),
    ("context[flashinfer-fa3]", dict(context_lens=[16, 15], block_size=3, group=8, head_dim=128, layout="HND")),
    ("decode_rows[flashinfer]", dict(context_lens=[17] * 32, block_size=3, group=4, head_dim=128)),
    ("decode_rows[flashinfer]", dict(context_lens=[17] * 33, block_size=3, group=4, head_dim=128)),
    ("decode_rows[flashinfer-tc]", dict(context_lens=[300, 1], block_size=7, group=8, head_dim=128,
                                        kv_dtype="float8_e4m3fn", k_scale=0.5, v_scale=2.0)),
    ("windowed_merge[flashinfer-merge_state]", dict(context_lens=[300, 16], block_size=7, group=4, head_dim=128,
                                                    window=("noncausal_swa", 4))),
    ("windowed_merge[flashinfer-eager]", dict(context_lens=[15], block_size=3, group=1, head_dim=128,
                                              window=("noncausal_swa", 2))),
]


@pytest.mark.parity_gpu
@pytest.mark.parametrize("name,kw", GPU_CASES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(GPU_CASES)])
def test_gpu_real_flashinfer(name, kw):
    _need_flashinfer()
    adapter = {a.name: a for a in fp.adapters()}[name]
    ok, why = adapter.available("cuda")
    if not ok:
        pytest.skip(why)
    c = case(**kw)
    out = run_case(adapter, c, POLICY, RunOptions(device="cuda"), yardstick=lowerings.get("sdpa"))
    assert out.status == "pass", f"{name} {c.short()}: {out.summary()}"
    assert out.calls == adapter.expected_calls(c)


@pytest.mark.parity_gpu
def test_gpu_trtllm_gen_never_attempted_off_blackwell():
    if torch.cuda.get_device_capability()[0] == 10:
        pytest.skip("SM100-family GPU: trtllm-gen may run here")
    for kind in ("decode", "context"):
        ok, why = fp.TrtllmGen(kind).available("cuda")
        assert not ok and "SM100" in why

