"""CUDA-graph capture and replay of the flashinfer adapters' `prepare()` (lowerings/flashinfer/).

One scenario driver, two backends:

- GPU (`@pytest.mark.parity_gpu`, real flashinfer): `prepare(inputs)`, one warm-up call, capture in a
  `torch.cuda.CUDAGraph`; then, per scenario, new context lengths and rotated page-table rows (the pool
  holding the same logical keys at other pages) are written into the captured tensors in place and
  `prepare` re-plans into the same fixed buffers; the replay must equal, bit for bit, an eager call of
  a separately prepared adapter on the same inputs, and pass the runner's oracle judgement. Negative
  control: after rewriting the lengths and pages WITHOUT re-planning, the replay must differ from the
  eager call and fail the oracle; re-planning then recovers.
- CPU (a fake flashinfer whose graph-mode wrappers, like the real kernels, read the page table from the
  fixed buffers at run time): the same driver, where a "replay" calls the captured function again. It
  checks the glue: fixed buffers reused, re-planning into them, counters once per call, run() unchanged.
"""

from __future__ import annotations

import dataclasses
import sys

import pytest
import torch

import lowerings
from lowerings import counters
from lowerings import flashinfer as fp
from oracle import reference
from oracle.case import Case
from oracle.inputs import Inputs, materialize
from parity.engine import policy as policy_mod
from parity.engine.runner import judge_result, tolerance_for
from tests.lowerings.test_flashinfer_adapters import (
    FakeDecodeWrapper,
    FakePrefillWrapper,
    _seq_lens,
    install_fake_flashinfer,
    skip_compiled_triton_on_cpu_tensors,
)

POLICY = policy_mod.load()
GRAPH_SAFE = [a.name for a in fp.adapters() if a.graph_safe]


pytestmark = pytest.mark.usefixtures("single_threaded_torch")  # tests/conftest.py: tiny CPU tensors


def fresh(name: str) -> fp.FlashinferBase:
    return {a.name: a for a in fp.adapters()}[name]


# --------------------------------------------------------------------------------------------------
# Cases of fixed shapes: every request owns `cols` pages, lengths vary inside that capacity
# --------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Shape:
    batch: int = 2
    block: int = 4
    kv_heads: int = 2
    group: int = 4
    head_dim: int = 128
    page_size: int = 16
    cols: int = 3
    layout: str = "NHD"
    window: tuple[int, int] = (-1, -1)

    @property
    def capacity(self) -> int:  # the longest context a request can hold with its block appended
        return self.cols * self.page_size - self.block


def make_case(shape: Shape, lens: list[int], rotation: int, seed: int) -> Case:
    """`rotation` shifts every page id of the pool: the same logical keys at other pages."""
    n = shape.batch * shape.cols + 1  # one spare page
    shift = (rotation * (shape.cols + 2)) % n
    ids = [(p + shift) % n for p in range(n)]
    pages = tuple(tuple(ids[b * shape.cols:(b + 1) * shape.cols]) for b in range(shape.batch))
    return Case(context_lens=tuple(lens), block_size=shape.block, num_q_heads=shape.kv_heads * shape.group,
                num_kv_heads=shape.kv_heads, head_dim=shape.head_dim, page_size=shape.page_size, pages=pages,
                num_pages=n, layout=shape.layout, window=shape.window, seed=seed)


def load_into(dst: Inputs, src: Inputs) -> Inputs:
    """Write `src`'s tensors into `dst`'s in place (what a serving loop does before a replay); returns an
    `Inputs` over `dst`'s tensors with `src`'s case and host lengths."""
    for name in ("q", "k_pool", "v_pool", "page_table", "context_lens", "k_block", "v_block"):
        d, s = getattr(dst, name), getattr(src, name)
        assert d.shape == s.shape and d.dtype == s.dtype, (name, d.shape, s.shape)
        d.copy_(s)
    return dataclasses.replace(dst, case=src.case, context_lens_host=src.context_lens_host, canary=src.canary)


def same_bits(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return torch.equal(a.contiguous().view(ints), b.contiguous().view(ints))


def same_result(a, b) -> bool:
    return same_bits(a.out, b.out) and same_bits(a.lse, b.lse)


def judge(lowering, inputs: Inputs, result) -> list[str]:
    """The runner's judgement (output and every partial against the oracle, yardstick included)."""
    c = inputs.case
    tol, _ = tolerance_for(POLICY, lowering, c, dict(lowering.expected_calls(c)))  # the kernels it declares
    ref = reference.attention(inputs)
    yard = lowerings.get("sdpa").run(inputs.clone()).out
    return [m for cmp in judge_result(lowering, c, inputs, result, ref, tol, yard) for m in cmp.failures]


# --------------------------------------------------------------------------------------------------
# Capture: a real CUDA graph, or (CPU) calling the prepared function again
# --------------------------------------------------------------------------------------------------


class CallAgain:
    """CPU stand-in for a graph: a replay calls the captured function again (the fake flashinfer reads
    the fixed buffers at run time, as the captured kernels do)."""

    def __init__(self, fn):
        self.fn = fn
        self.result = fn()

    def replay(self):
        self.result = self.fn()
        return self.result


class CudaGraph:
    def __init__(self, fn):
        torch.cuda.synchronize()
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.result = fn()
        torch.cuda.synchronize()

    def replay(self):
        self.graph.replay()
        torch.cuda.synchronize()
        return self.result


def scenarios(shape: Shape) -> tuple[list[tuple[list[int], int]], tuple[list[int], int]]:
    """(lengths, rotation) replays after a capture at `[cap - 5, 9, ...]` rotation 0, and the negative
    control's: request 0 shrinks (a stale plan reads its canary slots), request 1 grows."""
    cap = shape.capacity
    first = [cap - 5] + [9] * (shape.batch - 1)
    replays = [
        (first, 1),                                              # pure rotation: only the pages move
        ([3] + [cap] * (shape.batch - 1), 2),                    # new lengths and pages
        ([0] + [cap // 2] * (shape.batch - 1), 3),               # an empty context
        ([cap] * shape.batch, 0),
    ]
    negative = ([5] + [cap - 1] * (shape.batch - 1), 4)
    return [(first, 0)] + replays, negative


def drive(name: str, shape: Shape, device: str, capture_cls) -> dict:
    """The whole capture/replay protocol for adapter `name`; returns what it saw (for printing)."""
    adapter = fresh(name)
    reference_adapter = fresh(name)  # eager calls on buffers of its own
    (first, rot0), *replays = scenarios(shape)[0]
    negative = scenarios(shape)[1]
    seed = 11

    def materialized(lens, rot):
        return materialize(make_case(shape, lens, rot, seed + sum(lens) + rot), device)

    base = materialized(first, rot0)
    fn = adapter.prepare(base)
    warm = fn()  # warm-up before any capture: Triton compiles, flashinfer caches its buffers
    again = fn()
    assert warm.out.data_ptr() == again.out.data_ptr() and warm.lse.data_ptr() == again.lse.data_ptr(), \
        "prepare()'s function must return the same output tensors on every call"
    assert adapter.prepare(base)().out.data_ptr() == warm.out.data_ptr(), "a re-plan must share the buffers"
    with counters.KernelCounter() as kc:
        cap = capture_cls(fn)
    assert dict(kc.calls) == adapter.expected_calls(base.case), (dict(kc.calls), adapter.expected_calls(base.case))
    seen = {"replays": 0, "bit_identical_to_run": []}

    def check(lens, rot, *, replan: bool):
        new = materialized(lens, rot)
        view = load_into(base, new)
        if replan:
            again = adapter.prepare(view)
            assert again is not fn
        res = cap.replay()
        eager = reference_adapter.prepare(materialized(lens, rot))()
        if device == "cuda":
            torch.cuda.synchronize()
        return new, res, eager

    for lens, rot in [(first, rot0)] + replays:
        new, res, eager = check(lens, rot, replan=True)
        seen["replays"] += 1
        assert same_result(res, eager), f"{name} {lens} rot {rot}: replay differs from the eager call"
        failures = judge(adapter, new, res)
        assert not failures, f"{name} {lens} rot {rot}: replay fails the oracle: {failures}"
        plain = reference_adapter.run(materialized(lens, rot))  # eager wrappers, no graph mode
        assert not judge(adapter, new, plain), f"{name} {lens} rot {rot}: run() fails the oracle"
        seen["bit_identical_to_run"].append(same_result(res, plain))

    # Negative control: lengths and pages rewritten, no re-plan: the graph replays the stale plan.
    lens, rot = negative
    new, res, eager = check(lens, rot, replan=False)
    stale_equal = same_result(res, eager)
    stale_failures = judge(adapter, new, res)
    assert not stale_equal, f"{name}: a replay without re-planning gave the eager bits: the test cannot fail"
    assert stale_failures, f"{name}: a replay without re-planning passed the oracle: the test cannot fail"
    seen["negative_control"] = stale_failures[0][:160]
    # ... and re-planning recovers.
    new, res, eager = check(lens, rot, replan=True)
    assert same_result(res, eager) and not judge(adapter, new, res), f"{name}: no recovery after re-planning"
    return seen


def shape_for(name: str, layout: str) -> Shape:
    if name.startswith("windowed_merge"):
        return Shape(layout=layout, window=(2, 2))  # non-causal sliding window W=3: part A + merge
    return Shape(layout=layout)


# --------------------------------------------------------------------------------------------------
# CPU: a fake flashinfer with graph-mode wrappers
# --------------------------------------------------------------------------------------------------

WRAPPERS: list = []


class FakeGraphDecodeWrapper(FakeDecodeWrapper):
    """flashinfer's graph mode: fixed buffers at construction, plan() copies into them, run() (like the
    captured kernel) reads them and writes the given `out`/`lse`."""

    def __init__(self, float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False, use_tensor_cores=False,
                 paged_kv_indptr_buffer=None, paged_kv_indices_buffer=None, paged_kv_last_page_len_buffer=None,
                 backend="auto", jit_args=None):
        super().__init__(float_workspace_buffer, kv_layout, use_cuda_graph, use_tensor_cores)
        self.graph = use_cuda_graph
        self.bufs = (paged_kv_indptr_buffer, paged_kv_indices_buffer, paged_kv_last_page_len_buffer)
        if use_cuda_graph:
            assert all(torch.is_tensor(b) for b in self.bufs), "cudagraph mode needs the three buffers"
            assert len(paged_kv_indptr_buffer) == len(paged_kv_last_page_len_buffer) + 1
        WRAPPERS.append(self)

    def plan(self, indptr, indices, last_page_len, *args, **kw):
        super().plan(indptr, indices, last_page_len, *args, **kw)
        if self.graph:
            ip, ix, lp = self.bufs
            assert len(last_page_len) == len(lp), "the batch size is fixed in cudagraph mode"
            assert len(indices) <= len(ix), "indices exceed the fixed buffer"
            ip.copy_(indptr)
            lp.copy_(last_page_len)
            ix[: len(indices)].copy_(indices)

    def run(self, q, paged_kv_cache, *args, out=None, lse=None, return_lse=False, **kw):
        if not self.graph:
            assert out is None and lse is None
            return super().run(q, paged_kv_cache, *args, return_lse=return_lse, **kw)
        ip, ix, lp = self.bufs
        self.indptr, self.indices, self.lens = ip.cpu(), ix.cpu(), _seq_lens(ip.cpu(), lp.cpu(), self.ps)
        o, l2 = super().run(q, paged_kv_cache, *args, return_lse=True, **kw)
        assert out is not None and lse is not None and out.shape == o.shape and lse.shape == l2.shape
        out.copy_(o)
        lse.copy_(l2)
        return (out, lse) if return_lse else out


class FakeGraphPrefillWrapper(FakePrefillWrapper):
    def __init__(self, float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False, qo_indptr_buf=None,
                 paged_kv_indptr_buf=None, paged_kv_indices_buf=None, paged_kv_last_page_len_buf=None,
                 custom_mask_buf=None, mask_indptr_buf=None, backend="auto", jit_args=None):
        super().__init__(float_workspace_buffer, kv_layout, use_cuda_graph, backend)
        self.graph = use_cuda_graph
        self.bufs = (qo_indptr_buf, paged_kv_indptr_buf, paged_kv_indices_buf, paged_kv_last_page_len_buf)
        if use_cuda_graph:
            assert all(torch.is_tensor(b) for b in self.bufs), "cudagraph mode needs the four buffers"
        WRAPPERS.append(self)

    def plan(self, qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, *args, **kw):
        super().plan(qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, *args, **kw)
        if self.graph:
            qo, ip, ix, lp = self.bufs
            assert len(qo_indptr) == len(qo) and len(paged_kv_last_page_len) == len(lp)
            assert len(paged_kv_indices) <= len(ix)
            qo.copy_(qo_indptr)
            ip.copy_(paged_kv_indptr)
            lp.copy_(paged_kv_last_page_len)
            ix[: len(paged_kv_indices)].copy_(paged_kv_indices)

    def run(self, q, paged_kv_cache, *args, out=None, lse=None, return_lse=False, **kw):
        if not self.graph:
            assert out is None and lse is None
            return super().run(q, paged_kv_cache, *args, return_lse=return_lse, **kw)
        qo, ip, ix, lp = self.bufs
        self.qo_indptr, self.indptr, self.indices = qo.cpu(), ip.cpu(), ix.cpu()
        self.lens = _seq_lens(ip.cpu(), lp.cpu(), self.ps)
        o, l2 = super().run(q, paged_kv_cache, *args, return_lse=True, **kw)
        out.copy_(o)
        lse.copy_(l2)
        return (out, lse) if return_lse else out


@pytest.fixture
def fake_graph_flashinfer(monkeypatch):
    fi = install_fake_flashinfer(monkeypatch, FakeGraphDecodeWrapper, FakeGraphPrefillWrapper, "fake-graph")
    WRAPPERS.clear()
    return fi


def test_graph_safety_is_declared():
    assert GRAPH_SAFE == [a.name for a in fp.adapters() if not a.name.startswith("trtllm_gen")]
    from oracle.inputs import materialize as mat
    inputs = mat(make_case(Shape(head_dim=64), [3, 4], 0, 1), "cpu")
    for kind in ("decode", "context"):
        t = fp.TrtllmGen(kind)
        assert t.graph_safe is False
        with pytest.raises(NotImplementedError, match="not supported"):
            t.prepare(inputs)


def test_prepare_refuses_inside_a_capture(monkeypatch, fake_graph_flashinfer):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    inputs = materialize(make_case(Shape(head_dim=64), [3, 4], 0, 1), "cpu")
    with pytest.raises(RuntimeError, match="before capturing"):
        fp.FlashinferContext("fa2").prepare(inputs)


def test_graph_wrapper_checks_the_constructor():
    class OldWrapper:
        def __init__(self, float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False, indptr_buf=None):
            pass

    with pytest.raises(NotImplementedError, match="paged_kv_indptr_buffer"):
        fp.graph_wrapper(OldWrapper, torch.zeros(1, dtype=torch.uint8), "NHD",
                          {"paged_kv_indptr_buffer": torch.zeros(2)})


CPU_CASES = [(n, "NHD") for n in GRAPH_SAFE] + [(n, "HND") for n in GRAPH_SAFE if "compiled" not in n]


@pytest.mark.parametrize("name,layout", CPU_CASES, ids=[f"{n}-{lo}" for n, lo in CPU_CASES])
def test_cpu_capture_replay_protocol(fake_graph_flashinfer, name, layout):
    skip_compiled_triton_on_cpu_tensors(name)
    shape = dataclasses.replace(shape_for(name, layout), head_dim=64, kv_heads=1)
    seen = drive(name, shape, "cpu", CallAgain)
    assert seen["replays"] == 5
    # The fake has no split-KV: graph mode and the eager run() give the same bits.
    assert all(seen["bit_identical_to_run"]), seen


def test_cpu_decode_rows_above_threshold_replays_the_prefill(fake_graph_flashinfer):
    shape = Shape(batch=33, block=2, kv_heads=1, head_dim=64, cols=2)
    seen = drive("decode_rows[flashinfer]", shape, "cpu", CallAgain)
    assert seen["replays"] == 5
    assert any(isinstance(w, FakeGraphPrefillWrapper) and w.graph for w in WRAPPERS)


def test_cpu_fixed_buffers_are_reused_and_counters_count_each_call(fake_graph_flashinfer):
    shape = Shape(head_dim=64, window=(2, 2))
    a = fp.FlashinferWindowedMerge("merge_state")
    one = materialize(make_case(shape, [20, 7], 0, 5), "cpu")
    fn = a.prepare(one)
    graph_wrappers = [w for w in WRAPPERS if w.graph]
    assert len(graph_wrappers) == 1
    with counters.KernelCounter() as kc:
        r1 = fn()
        r2 = fn()
    assert dict(kc.calls) == {k: 2 * v for k, v in a.expected_calls(one.case).items()}
    assert r1.partials["A"].out.data_ptr() == r2.partials["A"].out.data_ptr()  # the graph-mode out buffer
    two = load_into(one, materialize(make_case(shape, [3, 30], 1, 6), "cpu"))
    a.prepare(two)
    assert [w for w in WRAPPERS if w.graph] == graph_wrappers  # re-planned, not rebuilt
    ip, ix, lp = graph_wrappers[0].bufs
    pg = fp.build_paging(two.page_table, [b for b in range(2) for _ in range(4)],
                         [L + i + 1 for L in (3, 30) for i in range(4)], 16, "cpu")
    assert torch.equal(ip, pg.indptr) and torch.equal(lp, pg.last_page_len)
    assert torch.equal(ix[: pg.indices.numel()], pg.indices)
    # Eager run() builds its own (eager-mode) wrapper: the caches are kept apart.
    a.run(materialize(make_case(shape, [3, 30], 1, 6), "cpu"))
    assert [w.graph for w in WRAPPERS] == [True, False]


# --------------------------------------------------------------------------------------------------
# GPU: real flashinfer, real CUDA graphs (bf16, head dim 128: the precompiled modules)
# --------------------------------------------------------------------------------------------------


def _need(name: str) -> None:
    ok, why = fp.flashinfer_status()
    if not ok:
        pytest.skip(why)
    ok, why = fresh(name).available("cuda")
    if not ok:
        pytest.skip(why)


GPU_CASES = [(n, lo) for n in GRAPH_SAFE for lo in ("NHD", "HND")]


@pytest.mark.parity_gpu
@pytest.mark.parametrize("name,layout", GPU_CASES, ids=[f"{n}-{lo}" for n, lo in GPU_CASES])
def test_gpu_cuda_graph_replay(name, layout):
    _need(name)
    # 24 pages of 16 per request: contexts up to 380 keys, long enough for flashinfer's split-KV paths.
    shape = dataclasses.replace(shape_for(name, layout), cols=24)
    seen = drive(name, shape, "cuda", CudaGraph)
    print(f"{name} {layout}: {seen}")


@pytest.mark.parity_gpu
def test_gpu_cuda_graph_replay_decode_rows_above_threshold():
    name = "decode_rows[flashinfer]"
    _need(name)
    seen = drive(name, Shape(batch=33, block=2, cols=4), "cuda", CudaGraph)
    print(f"{name} B=33: {seen}")


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
