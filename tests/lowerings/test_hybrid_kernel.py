"""Tests of the hybrid paged split-KV Triton kernel (lowerings/_hybrid_kernel.py).

Without CUDA the kernels run under TRITON_INTERPRET=1 on CPU tensors (set below, before triton is
imported); with a GPU (and TRITON_INTERPRET unset) the same tests run the compiled kernels on it, plus
the GPU-only tests at the end. The reference is plain fp64 torch written here: gather the context keys
through the page table, append the block keys, softmax.
"""

import os
import sys
import zlib

from lowerings import ensure_interpreter_on_cpu, interpreting  # noqa: E402

ensure_interpreter_on_cpu()  # sets TRITON_INTERPRET=1 on machines without CUDA, before triton imports

import math  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from lowerings import _hybrid_kernel as hk  # noqa: E402
from lowerings import (  # noqa: E402
    kernel_is_interpreted,
    kernel_param_is_constexpr,
    kernel_param_not_specialized,
    triton_available,
)

INTERP = kernel_is_interpreted(hk._hybrid_single_kernel)
DEVICE = torch.device("cpu") if INTERP else torch.device("cuda")
# Interpreter: fp32 dots, fp32->bf16 stores truncate (<= 1 ulp). GPU: P rounded to bf16 for the PV
# MMA plus round-to-nearest stores.
N_ULP = 2 if INTERP else 4
LSE_TOL = 1e-3
FP8 = getattr(torch, "float8_e4m3fn", None)


# --------------------------------------------------------------------------------------------------
# Reference and case builder
# --------------------------------------------------------------------------------------------------


def ulp(x: float, dtype: torch.dtype) -> float:
    mant = 7 if dtype == torch.bfloat16 else 10
    return 2.0 ** (math.floor(math.log2(abs(x))) - mant)


def reference(q, k_pool, v_pool, page_table, lens, k_block, v_block, scale, k_scale=1.0, v_scale=1.0):
    """fp64 O [B, K, Hq, D] and natural-log LSE [B, K, Hq], from the same (quantized) stored values."""
    B, K, Hq, D = q.shape
    page_size, Hkv = k_pool.shape[1], k_pool.shape[2]
    G = Hq // Hkv
    pt = page_table.cpu().long()
    kp = k_pool.cpu().to(torch.float64) * k_scale
    vp = v_pool.cpu().to(torch.float64) * v_scale
    O = torch.empty(B, K, Hq, D, dtype=torch.float64)
    LSE = torch.empty(B, K, Hq, dtype=torch.float64)
    for b in range(B):
        t = torch.arange(lens[b])
        pages = pt[b, t // page_size]
        slots = t % page_size
        keys = torch.cat([kp[pages, slots], k_block[b].cpu().double()], 0)  # [L+K, Hkv, D]
        vals = torch.cat([vp[pages, slots], v_block[b].cpu().double()], 0)
        for h in range(Hq):
            s = scale * q[b, :, h].cpu().double() @ keys[:, h // G].T  # [K, L+K]
            O[b, :, h] = torch.softmax(s, -1) @ vals[:, h // G]
            LSE[b, :, h] = torch.logsumexp(s, -1)
    return O, LSE


class Case:
    """Random inputs. Pool slots no request owns, and page-table entries past each request's last
    page, hold poison (NaN / huge ids): reading one shows up as NaN or a crash."""

    def __init__(self, B, K, Hq, Hkv, D, page_size, lens, *, dtype=torch.bfloat16, pool_dtype=None,
                 seed=0, extra_pages=3, max_pages=None):
        g = torch.Generator().manual_seed(seed)
        self.B, self.K, self.Hq, self.Hkv, self.D, self.page_size = B, K, Hq, Hkv, D, page_size
        self.lens = list(lens)
        self.dtype = dtype
        need = [-(-L // page_size) for L in self.lens]
        self.max_pages = max_pages or max(1, max(need) + 1)
        num_pages = sum(need) + extra_pages
        perm = torch.randperm(num_pages, generator=g)
        pt = torch.full((B, self.max_pages), 2**30, dtype=torch.int32)  # poison beyond the used pages
        k_pool = torch.full((num_pages, page_size, Hkv, D), float("nan"))
        v_pool = torch.full((num_pages, page_size, Hkv, D), float("nan"))
        used = 0
        for b, L in enumerate(self.lens):
            pages = perm[used:used + need[b]]
            used += need[b]
            pt[b, :need[b]] = pages.int()
            for t in range(L):
                k_pool[pages[t // page_size], t % page_size] = torch.randn(Hkv, D, generator=g)
                v_pool[pages[t // page_size], t % page_size] = torch.randn(Hkv, D, generator=g)
        pool_dtype = pool_dtype or dtype
        self.k_pool = k_pool.to(pool_dtype).to(DEVICE)
        self.v_pool = v_pool.to(pool_dtype).to(DEVICE)
        self.page_table = pt.to(DEVICE)
        self.ctx_len = torch.tensor(self.lens, dtype=torch.int32, device=DEVICE)
        self.q = torch.randn(B, K, Hq, D, generator=g).to(dtype).to(DEVICE)
        self.k_block = torch.randn(B, K, Hkv, D, generator=g).to(dtype).to(DEVICE)
        self.v_block = torch.randn(B, K, Hkv, D, generator=g).to(dtype).to(DEVICE)
        self.scale = D ** -0.5

    def run(self, **kw):
        kw.setdefault("scale", self.scale)
        pt = kw.pop("page_table", self.page_table)
        return hk.hybrid_paged_attention(self.q, self.k_pool, self.v_pool, pt, self.ctx_len,
                                         self.k_block, self.v_block, **kw)

    def ref(self, k_scale=1.0, v_scale=1.0):
        return reference(self.q, self.k_pool, self.v_pool, self.page_table, self.lens, self.k_block,
                         self.v_block, self.scale, k_scale, v_scale)


def assert_close(O, LSE, O_ref, LSE_ref, dtype=torch.bfloat16, n_ulp=N_ULP):
    O = O.cpu().double()
    LSE = LSE.cpu().double()
    assert torch.isfinite(O).all(), "non-finite output"
    assert torch.isfinite(LSE).all(), "non-finite LSE"
    bound = n_ulp * ulp(O_ref.abs().max().item(), dtype)
    err = (O - O_ref).abs().max().item()
    assert err <= bound, f"max |O - O_ref| = {err} > {n_ulp} ulp = {bound}"
    lerr = (LSE - LSE_ref).abs().max().item()
    assert lerr < LSE_TOL, f"max |LSE - LSE_ref| = {lerr}"


# --------------------------------------------------------------------------------------------------
# Correctness across shapes and paths
# --------------------------------------------------------------------------------------------------

SHAPES = {
    # name: (B, K, Hq, Hkv, page_size, lens)
    "R24_K6_G4": (2, 6, 8, 2, 16, [100, 37]),
    "R20_G5": (1, 4, 10, 2, 16, [75]),
    "R6_K3_G2": (2, 3, 4, 2, 16, [130, 17]),
    "L0_all": (2, 3, 4, 2, 16, [0, 0]),
    "L_not_page_aligned_and_lt_tile": (3, 2, 4, 1, 8, [37, 5, 1]),
    "L_page_aligned": (2, 4, 4, 2, 32, [64, 128]),
    "K1_G1": (2, 1, 2, 2, 16, [50, 0]),
}


@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("name", list(SHAPES))
def test_matches_reference(name, num_splits):
    B, K, Hq, Hkv, ps, lens = SHAPES[name]
    c = Case(B, K, Hq, Hkv, 64, ps, lens, seed=zlib.crc32(name.encode()) % 1000)
    launches = []
    O, LSE = c.run(num_splits=num_splits, block_n=64, launches=launches)
    assert O.shape == (B, K, Hq, 64) and O.dtype == torch.bfloat16
    assert LSE.shape == (B, K, Hq) and LSE.dtype == torch.float32
    if num_splits == 1:
        assert launches == ["hybrid_paged_single"]
    else:
        assert launches == ["hybrid_paged_split", "hybrid_paged_merge_splits"]
    assert_close(O, LSE, *c.ref())


def test_fp16():
    c = Case(2, 3, 4, 2, 64, 16, [70, 9], dtype=torch.float16, seed=5)
    for ns in (1, 2):
        O, LSE = c.run(num_splits=ns, block_n=64)
        assert O.dtype == torch.float16
        assert_close(O, LSE, *c.ref(), dtype=torch.float16)


def test_more_splits_than_tiles_and_empty_splits():
    # 70 tokens = 2 tiles of 64; 8 splits -> 6 empty splits; second request L=0 -> all splits empty.
    c = Case(2, 2, 4, 2, 64, 16, [70, 0], seed=11)
    O, LSE = c.run(num_splits=8, block_n=64)
    assert_close(O, LSE, *c.ref())


def test_single_vs_split_agree():
    c = Case(2, 6, 8, 2, 64, 16, [200, 90], seed=3)
    O1, L1 = c.run(num_splits=1, block_n=64)
    for ns in (2, 4):
        O2, L2 = c.run(num_splits=ns, block_n=64)
        amax = O1.abs().max().item()
        assert (O1.float() - O2.float()).abs().max().item() <= ulp(amax, torch.bfloat16)
        assert (L1 - L2).abs().max().item() < 1e-5


@pytest.mark.parametrize("B,K,Hq,Hkv,lens,max_pages,path", [
    (1, 3, 4, 2, [150], 40, "hybrid_paged_split"),  # capacity 640: 2 splits
    (2, 2, 4, 2, [20, 40], 4, "hybrid_paged_single"),  # capacity 64: too short to split
])
def test_default_tile_and_splits(B, K, Hq, Hkv, lens, max_pages, path):
    # The default tile and the split count chosen by the heuristic; planned_launches predicts them.
    c = Case(B, K, Hq, Hkv, 64, 16, lens, seed=4, max_pages=max_pages)
    launches = []
    O, LSE = c.run(launches=launches)
    plan = hk.planned_launches(B, K, Hq, Hkv, 64, max_pages * 16, device=DEVICE)
    assert launches == plan and launches[0] == path
    assert_close(O, LSE, *c.ref())


@pytest.mark.skipif(FP8 is None, reason="torch without float8_e4m3fn")
@pytest.mark.parametrize("num_splits", [1, 2])
def test_fp8_pool_with_scales(num_splits):
    c = Case(2, 3, 4, 2, 64, 16, [45, 80], pool_dtype=FP8, seed=8)
    O, LSE = c.run(num_splits=num_splits, block_n=64, k_scale=0.5, v_scale=2.0)
    assert_close(O, LSE, *c.ref(k_scale=0.5, v_scale=2.0))
    # the scales matter: ignoring them gives a different answer
    O_noscale, _ = c.ref()
    assert (O.cpu().double() - O_noscale).abs().max().item() > 0.05


def test_non_default_scale():
    c = Case(1, 3, 4, 2, 64, 16, [40], seed=9)
    c.scale = 0.3
    O, LSE = c.run(num_splits=2, block_n=64)
    assert_close(O, LSE, *c.ref())


# --------------------------------------------------------------------------------------------------
# Page-table layouts
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("num_splits", [1, 2])
def test_page_table_layouts_bit_identical(num_splits):
    c = Case(2, 3, 4, 2, 64, 8, [45, 20], seed=12)
    O0, L0 = c.run(num_splits=num_splits, block_n=64)
    pt = c.page_table
    B, P = pt.shape
    # int64 ids
    variants = {"int64": pt.long()}
    # strided column view (every other column of a wider table)
    wide = torch.full((B, 2 * P), -7, dtype=torch.int32, device=DEVICE)
    wide[:, ::2] = pt
    variants["col_stride2"] = wide[:, ::2]
    # column-major storage (row stride 1)
    variants["col_major"] = pt.t().contiguous().t()
    # a row slice of a taller table
    tall = torch.full((B + 2, P), -7, dtype=torch.int64, device=DEVICE)
    tall[1:B + 1] = pt
    variants["row_slice_int64"] = tall[1:B + 1]
    for name, v in variants.items():
        O, L = c.run(num_splits=num_splits, block_n=64, page_table=v)
        assert torch.equal(O, O0), name
        assert torch.equal(L, L0), name


# --------------------------------------------------------------------------------------------------
# Stores: padded rows, out buffers, no NaN
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("num_splits", [1, 3])
def test_padded_rows_never_stored(num_splits):
    # R = 3 * 2 = 6 -> R_PAD = 16: ten padded rows per program.
    c = Case(2, 3, 4, 2, 64, 16, [33, 0], seed=13)
    B, K, Hq, D = c.q.shape
    big = torch.full((B, K + 2, Hq + 2, D), float("nan"), dtype=torch.bfloat16, device=DEVICE)
    big_lse = torch.full((B, K + 2, Hq + 2), float("nan"), dtype=torch.float32, device=DEVICE)
    out = big[:, 1:K + 1, 1:Hq + 1]
    lse_out = big_lse[:, 1:K + 1, 1:Hq + 1]
    O, LSE = c.run(num_splits=num_splits, block_n=64, out=out, lse_out=lse_out)
    assert O.data_ptr() == out.data_ptr() and LSE.data_ptr() == lse_out.data_ptr()
    assert not torch.isnan(out).any(), "an element of out was not written"
    assert not torch.isnan(lse_out).any(), "an element of lse_out was not written"
    mask = torch.ones(B, K + 2, Hq + 2, dtype=torch.bool, device=DEVICE)
    mask[:, 1:K + 1, 1:Hq + 1] = False
    assert torch.isnan(big[mask]).all(), "a store landed outside out (padded row?)"
    assert torch.isnan(big_lse[mask]).all(), "a store landed outside lse_out (padded row?)"
    assert_close(O, LSE, *c.ref())


def test_inputs_not_mutated():
    c = Case(2, 3, 4, 2, 64, 16, [33, 50], seed=14)
    before = [t.clone() for t in (c.q, c.k_pool, c.v_pool, c.page_table, c.ctx_len, c.k_block, c.v_block)]
    c.run(num_splits=2, block_n=64)
    after = (c.q, c.k_pool, c.v_pool, c.page_table, c.ctx_len, c.k_block, c.v_block)
    for b_, a_ in zip(before, after):  # bytewise (the pools hold NaN canaries)
        assert torch.equal(b_.view(torch.uint8), a_.view(torch.uint8))


def test_deterministic():
    c = Case(1, 6, 8, 2, 64, 16, [90], seed=15)
    a = c.run(num_splits=2, block_n=64)
    b = c.run(num_splits=2, block_n=64)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


# --------------------------------------------------------------------------------------------------
# Workspace, heuristic, compile-stability
# --------------------------------------------------------------------------------------------------


def test_workspace_reuse_across_batch_and_splits():
    K, Hq, Hkv, D = 3, 4, 2, 64
    r_pad = hk.padded_rows(K, Hq // Hkv)
    assert r_pad == 16
    ws = hk.alloc_workspace(3, Hkv, 4, r_pad, D, DEVICE)
    assert ws.acc.shape == (3, Hkv, 4, r_pad, D) and ws.m.shape == (3, Hkv, 4, r_pad)
    ptrs = (ws.acc.data_ptr(), ws.m.data_ptr(), ws.l.data_ptr())
    for B, ns, lens in ((1, 2, [70]), (3, 4, [10, 0, 140]), (2, 3, [65, 64])):
        c = Case(B, K, Hq, Hkv, D, 16, lens, seed=B * 10 + ns)
        launches = []
        O, LSE = c.run(num_splits=ns, block_n=64, workspace=ws, launches=launches)
        assert launches == ["hybrid_paged_split", "hybrid_paged_merge_splits"]
        assert (ws.acc.data_ptr(), ws.m.data_ptr(), ws.l.data_ptr()) == ptrs
        assert_close(O, LSE, *c.ref())
    c = Case(1, K, Hq, Hkv, D, 16, [20], seed=1)
    with pytest.raises(ValueError, match="num_splits 5 > max_splits 4"):
        c.run(num_splits=5, workspace=ws)
    c4 = Case(4, K, Hq, Hkv, D, 16, [1, 2, 3, 4], seed=1)
    with pytest.raises(ValueError, match="batch 4 > max_batch 3"):
        c4.run(num_splits=2, workspace=ws)


def test_default_num_splits_heuristic():
    # Large batches fill the GPU: single pass.
    assert hk.default_num_splits(64, 4, 8192, num_sms=132) == 1
    assert hk.default_num_splits(128, 1, 8192, num_sms=132, ctas_per_sm=1) == 1
    # Small batches split (values measured best on an H200, see the docstring).
    assert hk.default_num_splits(1, 4, 8192, num_sms=132) == 16
    assert hk.default_num_splits(8, 4, 8192, num_sms=132) == 8
    assert hk.default_num_splits(16, 4, 8192, num_sms=132) == 4
    assert hk.default_num_splits(32, 4, 8192, num_sms=132) == 2
    assert hk.default_num_splits(32, 1, 8192, num_sms=132, ctas_per_sm=1) == 4
    # bounded by MAX_SPLITS and by the capacity
    assert hk.default_num_splits(1, 1, 10**6, num_sms=132) == hk.MAX_SPLITS
    assert hk.default_num_splits(1, 4, 256, num_sms=132, block_n=64) == 1  # 4 tiles: no split
    # monotone non-increasing in the batch
    vals = [hk.default_num_splits(b, 2, 32768, num_sms=132) for b in range(1, 200)]
    assert all(a >= b for a, b in zip(vals, vals[1:])) and vals[-1] == 1
    with pytest.raises(ValueError):
        hk.default_num_splits(0, 4, 8192)


def test_num_splits_is_a_runtime_argument():
    for kern in (hk._hybrid_split_kernel, hk._hybrid_merge_splits_kernel):
        assert not kernel_param_is_constexpr(kern, "num_splits")
        assert kernel_param_not_specialized(kern, "num_splits")
    # nothing batch-dependent is a constexpr: the constexprs are exactly the tile/shape meta-params
    for kern, expected in (
        (hk._hybrid_single_kernel, {"PAGE_SIZE", "BLOCK_N", "BLOCK_R", "KB_PAD", "D", "UPCAST"}),
        (hk._hybrid_split_kernel, {"PAGE_SIZE", "BLOCK_N", "BLOCK_R", "D", "UPCAST"}),
        (hk._hybrid_merge_splits_kernel, {"BLOCK_R", "KB_PAD", "D", "UPCAST"}),
    ):
        import inspect

        names = list(inspect.signature(getattr(kern, "fn", kern)).parameters)
        got = {n for n in names if kernel_param_is_constexpr(kern, n)}
        assert got == expected, (kern, got)


# --------------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------------


def _raw(B=1, K=2, Hq=4, Hkv=2, D=64, ps=16, P=4, dtype=torch.bfloat16):
    return dict(
        q=torch.zeros(B, K, Hq, D, dtype=dtype, device=DEVICE),
        k_pool=torch.zeros(P, ps, Hkv, D, dtype=dtype, device=DEVICE),
        v_pool=torch.zeros(P, ps, Hkv, D, dtype=dtype, device=DEVICE),
        page_table=torch.zeros(B, 2, dtype=torch.int32, device=DEVICE),
        ctx_len=torch.zeros(B, dtype=torch.int32, device=DEVICE),
        k_block=torch.zeros(B, K, Hkv, D, dtype=dtype, device=DEVICE),
        v_block=torch.zeros(B, K, Hkv, D, dtype=dtype, device=DEVICE),
    )


def _call(a, **kw):
    kw.setdefault("scale", 0.125)
    launches = []
    try:
        return hk.hybrid_paged_attention(a["q"], a["k_pool"], a["v_pool"], a["page_table"], a["ctx_len"],
                                         a["k_block"], a["v_block"], launches=launches, **kw)
    finally:
        assert launches == [], "a kernel was launched before the ValueError"


def test_rejects_head_dim_96():
    with pytest.raises(ValueError, match=r"D \(q.shape\[3\]\).*96"):
        _call(_raw(D=96))


def test_rejects_non_pow2_page_size():
    with pytest.raises(ValueError, match=r"page_size \(k_pool.shape\[1\]\).*12"):
        _call(_raw(ps=12))


@pytest.mark.parametrize("mutate,match", [
    (lambda a: a.update(q=a["q"].float()), "q must be bfloat16 or float16"),
    (lambda a: a.update(k_block=a["k_block"].half()), "k_block dtype"),
    (lambda a: a.update(v_pool=a["v_pool"][:, :, :1]), "same shape|one shape"),
    (lambda a: a.update(q=a["q"][:, :, :3]), "multiple of Hkv"),
    (lambda a: a.update(page_table=a["page_table"].float()), "page_table must be int32 or int64"),
    (lambda a: a.update(page_table=a["page_table"][0]), "page_table must be 2-D"),
    (lambda a: a.update(ctx_len=a["ctx_len"].float()), "ctx_len must be int32"),
    (lambda a: a.update(ctx_len=torch.zeros(3, dtype=torch.int32, device=DEVICE)), "ctx_len must have shape"),
    (lambda a: a.update(v_block=a["v_block"][:, :1]), "v_block must have shape"),
    (lambda a: a.update(k_pool=a["k_pool"][..., :32], v_pool=a["v_pool"][..., :32]), "k_pool head dim"),
])
def test_rejects_bad_inputs(mutate, match):
    a = _raw()
    mutate(a)
    with pytest.raises(ValueError, match=match):
        _call(a)


def test_rejects_bad_options():
    with pytest.raises(ValueError, match="num_splits"):
        _call(_raw(), num_splits=0)
    with pytest.raises(ValueError, match="out must be"):
        _call(_raw(), out=torch.empty(1, 2, 4, 64, device=DEVICE))
    with pytest.raises(ValueError, match="lse_out must be"):
        _call(_raw(), lse_out=torch.empty(1, 2, 4, dtype=torch.float64, device=DEVICE))
    with pytest.raises(ValueError, match="block_n"):
        _call(_raw(), block_n=48)
    with pytest.raises(ValueError, match="k_scale"):
        _call(_raw(), k_scale=float("nan"))


def test_triton_env_helpers():
    ok, why = triton_available()
    assert ok, why
    if INTERP:  # the kernels were decorated under the interpreter, and the helpers agree
        assert interpreting()
        assert os.environ.get("TRITON_INTERPRET", "").lower() in ("1", "true", "on", "yes")
    if not torch.cuda.is_available():
        assert INTERP, "without CUDA the kernels must have been decorated as interpreted"


def test_compiled_kernels_make_the_cpu_unavailable_not_failing(monkeypatch):
    """On a GPU runner the kernels are compiled for the GPU: a `--device cpu` check lists the Triton
    lowerings as unavailable, with the way out, instead of failing every case on CPU tensors."""
    import lowerings
    from lowerings import _triton_env

    monkeypatch.setattr(_triton_env, "interpreting", lambda: False)
    for name in ("hybrid_paged", "windowed_merge[triton]"):
        ok, why = lowerings.get(name).available("cpu")
        assert not ok and "compiled for the GPU" in why and "TRITON_INTERPRET=1" in why, (name, why)
    assert _triton_env.triton_device() == "cuda"
    assert lowerings.get("windowed_merge[eager]").available("cpu")[0]  # torch lowerings are not affected


# --------------------------------------------------------------------------------------------------
# GPU only: real compiled kernels at production shapes, CUDA-graph replay
# --------------------------------------------------------------------------------------------------

gpu_only = pytest.mark.skipif(INTERP or not torch.cuda.is_available(),
                              reason="needs a CUDA device with compiled (non-interpreted) Triton kernels")


@gpu_only
@pytest.mark.parametrize("K,Hq,Hkv,D,ps", [(16, 16, 4, 128, 32), (6, 16, 4, 128, 64), (7, 16, 1, 128, 64),
                                           (4, 32, 8, 64, 16), (16, 16, 1, 256, 32)])
def test_gpu_production_shapes(K, Hq, Hkv, D, ps):
    c = Case(2, K, Hq, Hkv, D, ps, [1000, 333], seed=K * D)
    ref = c.ref()
    for ns in (1, 5, None):
        O, LSE = c.run(num_splits=ns)
        assert_close(O, LSE, *ref)


@gpu_only
def test_gpu_cuda_graph_replay_with_new_lengths():
    # pages for 300 tokens per request; the replays rewrite the lengths inside that capacity
    c = Case(2, 6, 8, 2, 128, 16, [300, 300], seed=21, extra_pages=40, max_pages=40)
    ws = hk.alloc_workspace(2, 2, 8, hk.padded_rows(6, 4), 128, DEVICE)
    out = torch.empty_like(c.q)
    lse = torch.empty(2, 6, 8, dtype=torch.float32, device=DEVICE)
    for ns in (1, 8):
        args = dict(num_splits=ns, workspace=ws, out=out, lse_out=lse)
        c.run(**args)  # warm-up compiles
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            c.run(**args)
        for lens in ([300, 200], [17, 0], [250, 299]):
            c.ctx_len.copy_(torch.tensor(lens, dtype=torch.int32))
            c.lens = lens
            g.replay()
            torch.cuda.synchronize()
            eager = c.run(num_splits=ns)
            assert torch.equal(out, eager[0]) and torch.equal(lse, eager[1])
            assert_close(out, lse, *c.ref())
        c.ctx_len.copy_(torch.tensor([300, 300], dtype=torch.int32))
        c.lens = [300, 300]
        # Rotated page-table rows: the same logical keys moved to other pages (pool and table rewritten
        # in place, the captured addresses unchanged): the replay must follow the new table.
        for shift in (1, 7):
            old_pt = c.page_table.clone()
            used = [-(-L // c.page_size) for L in c.lens]
            ids = torch.cat([old_pt[b, :n] for b, n in enumerate(used)]).long()
            rotated = torch.roll(ids, shift)
            kp, vp = c.k_pool.clone(), c.v_pool.clone()
            c.k_pool[rotated] = kp[ids]
            c.v_pool[rotated] = vp[ids]
            off = 0
            for b, n in enumerate(used):
                c.page_table[b, :n] = rotated[off:off + n].to(torch.int32)
                off += n
            assert not torch.equal(c.page_table, old_pt)
            g.replay()
            torch.cuda.synchronize()
            eager = c.run(num_splits=ns)
            assert torch.equal(out, eager[0]) and torch.equal(lse, eager[1]), f"rotated by {shift}: replay != eager"
            assert_close(out, lse, *c.ref())


@gpu_only
def test_gpu_no_recompile_across_batch_and_splits():
    seen = []
    for B, ns in ((1, 2), (2, 7), (3, 3), (2, 16)):
        c = Case(B, 3, 4, 2, 64, 16, [40 * (b + 1) for b in range(B)], seed=B)
        c.run(num_splits=ns)
        seen.append(len(hk._hybrid_split_kernel.device_caches[torch.cuda.current_device()][0]))
    assert seen[-1] == seen[0], f"split kernel compiled more variants: {seen}"


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
