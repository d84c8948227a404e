"""No Triton recompile within a shape family, checked on the CPU (interpreted) and on a GPU runner (compiled).

Triton compiles a variant of a kernel for each combination of its constexprs and, for every integer
argument it specializes on, whether the value is 1 or divisible by 16. A value that follows the batch
(the longest context, the page table's width, the split count) must therefore never be specialized on,
or serving recompiles as batches change (docs/bugs.md, "a recompile per batch size"; found on the H200 for
the hybrid kernel's `max_ctx` and page-table stride, docs/gpu run 7). Here every launch of the hybrid
kernels and of the oracle's kernel is recorded over drawn cases (the interpreter runs them), and within
one shape family each specialized integer argument must fall in one class.
"""

from __future__ import annotations

import collections

import pytest
import torch
from hypothesis import HealthCheck, given, settings

import lowerings
from lowerings import triton_device
from oracle import attention, materialize
from strategies import Limits, cases

# Where the kernels take their tensors: the interpreter's CPU on CI, the GPU on a GPU runner.
DEVICE = triton_device()

# 15 derandomized draws per test (30 before): each test still draws as many shape families as with 30, and within
# them moves the same run-time arguments across the same Triton classes (1 / divisible by 16 / other), which is what
# lets the check fail; the interpreted kernels are nearly all of the time.
SETTINGS = settings(max_examples=15, derandomize=True, deadline=None, database=None,
                    suppress_health_check=list(HealthCheck))


def spec_class(v: int) -> str:
    """Triton's specialization of an integer argument: "1", "16" (divisible by 16) or "n"."""
    return "1" if v == 1 else ("16" if v % 16 == 0 else "n")


class Recorder:
    """Stands in for a kernel object: `kernel[grid](*args, **kw)` is recorded, then launched."""

    def __init__(self, name, kernel, log, family):
        self.name, self.kernel, self.log, self.family = name, kernel, log, family

    def __getitem__(self, grid):
        def launch(*args, **kw):
            self.log.append((self.family[0], self.name, self.kernel.arg_names, args, kw))
            return self.kernel[grid](*args, **kw)
        return launch


def _unwrap_interpreted_check(monkeypatch, module) -> None:
    """The launcher asks `kernel_is_interpreted(kernel)` (its fp32 upcast switch): answer for the kernel a
    Recorder wraps, so that the recorded launches run as the real ones would (interpreted or compiled)."""
    real = module.kernel_is_interpreted
    monkeypatch.setattr(module, "kernel_is_interpreted", lambda k: real(k.kernel if isinstance(k, Recorder) else k))


def variants(log, do_not_specialize):
    """{(family, kernel): {specialization key}} over the recorded launches."""
    seen = collections.defaultdict(set)
    for family, name, arg_names, args, kw in log:
        skip = set(do_not_specialize.get(name, ()))
        key = tuple((n, spec_class(a)) for n, a in zip(arg_names, args)
                    if isinstance(a, int) and not isinstance(a, bool) and n not in skip)
        # A tensor argument is a pointer whose element type is in the signature and whose 16-byte
        # alignment Triton specializes on: an int32 and an int64 page table are two compiles.
        key += tuple((n, f"{a.dtype}/{'16' if a.data_ptr() % 16 == 0 else 'n'}") for n, a in zip(arg_names, args)
                     if isinstance(a, torch.Tensor))
        const = tuple(sorted((k, v) for k, v in kw.items() if not k.startswith("num_")))
        seen[(family, name, const)].add(key)
    return seen


def differing(keys) -> list[str]:
    keys = list(keys)
    return sorted({n for i, (n, _) in enumerate(keys[0]) if len({k[i][1] for k in keys}) > 1})


@pytest.mark.parametrize("name", ["hybrid_paged", "hybrid_paged[splits=4]"])
def test_hybrid_kernels_compile_once_per_shape_family(name, monkeypatch):
    from lowerings import _hybrid_kernel as hk

    lw = lowerings.get(name)
    log, family = [], [None]
    _unwrap_interpreted_check(monkeypatch, hk)
    for kname in hk.DO_NOT_SPECIALIZE:
        monkeypatch.setattr(hk, kname, Recorder(kname, getattr(hk, kname), log, family))

    # One shape family (dtype, kv dtype, D, page, K*G) at a time; batch, lengths, heads, layout and
    # page-table padding vary freely. Up to 8 requests and 2 KV heads: a quarter of the interpreter's time, and
    # the same run-time arguments moved across Triton's classes as with the default 33 requests and 3 heads.
    @SETTINGS
    @given(case=cases(lw, limits=Limits(max_context=300, max_batch=8, max_kv_heads=2), block_size=3, group=2,
                      head_dim=64, page_size=16, dtype="bfloat16", kv_dtype="bfloat16"))
    def run(case):
        family[0] = lw.compile_family(case)
        lw.run(materialize(case, DEVICE))

    run()
    assert log, "no launch recorded"
    seen = variants(log, hk.DO_NOT_SPECIALIZE)
    bad = {k: differing(v) for k, v in seen.items() if len(v) > 1}
    assert not bad, f"specialized on run-time values (recompiles within a family): {bad}"


def test_oracle_kernel_compiles_once_per_family(monkeypatch):
    from oracle import _fast_kernel as fk

    log, family = [], [None]
    monkeypatch.setattr(fk, "ORACLE_KERNEL", Recorder("_oracle_kernel", fk.ORACLE_KERNEL, log, family))

    # Small batches and groups: every run-time value still varies (lengths, strides, counts, offsets), at a
    # fraction of the interpreted kernel's time (the extremes' 128 rows per KV head are the draw tests' to reach).
    @SETTINGS
    @given(case=cases(limits=Limits(max_context=300, max_batch=8, max_group=4), head_dim=64, dtype="bfloat16",
                      kv_dtype="bfloat16", block_storage="dense"))
    def run(case):
        # Its constexprs (row block, storage, ...) are part of the key below; the page table's dtype is
        # the pointer's element type (an int64 table is a second compile, once per run).
        family[0] = ("D=64", case.page_table_dtype)
        attention(materialize(case, DEVICE), engine="triton")

    run()
    seen = variants(log, {"_oracle_kernel": fk.RUNTIME_ARGS})
    bad = {k[2]: differing(v) for k, v in seen.items() if len(v) > 1}
    assert not bad, f"the oracle kernel specializes on run-time values: {bad}"


def test_the_check_sees_a_value_specialized_on(monkeypatch):
    """The check can fail: with `max_ctx` specialized again (the H200 finding), it names it."""
    from lowerings import _hybrid_kernel as hk

    lw = lowerings.get("hybrid_paged")
    log, family = [], [None]
    _unwrap_interpreted_check(monkeypatch, hk)
    monkeypatch.setattr(hk, "_hybrid_single_kernel",
                        Recorder("_hybrid_single_kernel", hk._hybrid_single_kernel, log, family))
    from tests.oracle.oracle_cases import build_case  # the oracle tests' case builder

    for lens in ([5], [13], [2, 1]):  # page size 1: max_ctx = the table's capacity, L + K: 8, 16, 5
        case = build_case(lens, 3, 1, 2, 64, 1)
        family[0] = lw.compile_family(case)
        lw.run(materialize(case, DEVICE))
    without = {k: v for k, v in hk.DO_NOT_SPECIALIZE.items()}
    without["_hybrid_single_kernel"] = [n for n in without["_hybrid_single_kernel"] if n != "max_ctx"]
    seen = variants(log, without)
    assert [differing(v) for v in seen.values()] == [["max_ctx"]]


def test_the_oracle_check_sees_a_value_specialized_on(monkeypatch):
    """The oracle's check can fail too: were `K` specialized again, K=1 and K=3 of one family differ."""
    from oracle import _fast_kernel as fk
    from tests.oracle.oracle_cases import build_case

    log, family = [], [("D=64",)]
    monkeypatch.setattr(fk, "ORACLE_KERNEL", Recorder("_oracle_kernel", fk.ORACLE_KERNEL, log, family))
    for K in (1, 3):  # K*G <= 16: one row block, the same constexprs
        attention(materialize(build_case([5], K, 1, 2, 64, 16), DEVICE), engine="triton")
    without = {"_oracle_kernel": [n for n in fk.RUNTIME_ARGS if n != "K"]}
    assert [differing(v) for v in variants(log, without).values()] == [["K"]]
    assert [differing(v) for v in variants(log, {"_oracle_kernel": fk.RUNTIME_ARGS}).values()] == [[]]


# --- torch.compile: the graphs the compiled merge builds are the ones a deployed drafter builds -----------

def _symbolic_dims(gm) -> dict[int, set[int]]:
    """For each tensor input of a dynamo graph (numbered in order, symbolic sizes left out), the dims
    that are symbolic (from the placeholders' fake tensors: the real example inputs have plain sizes)."""
    import torch

    values = [n.meta.get("example_value") for n in gm.graph.nodes if n.op == "placeholder"]
    tensors = [x for x in values if isinstance(x, torch.Tensor)]
    return {n: {d for d, size in enumerate(x.shape) if not isinstance(size, int)} for n, x in enumerate(tensors)}


def _record_graphs(monkeypatch) -> list[dict[int, set[int]]]:
    """Every graph dynamo hands the merge's counting backend, as `_symbolic_dims` of its inputs."""
    import torch._dynamo

    graphs: list[dict[int, set[int]]] = []
    real = torch._dynamo.lookup_backend

    def lookup(name):
        inner = real(name)

        def backend(gm, example_inputs):
            graphs.append(_symbolic_dims(gm))
            return inner(gm, example_inputs)
        return backend

    monkeypatch.setattr(torch._dynamo, "lookup_backend", lookup)
    return graphs


# (K, Hq, Hkv, right): four shape families a sweep draws in one process, each at three batch sizes.
FAMILIES = ((7, 16, 2, -1), (5, 8, 1, -1), (3, 4, 2, 1), (7, 16, 2, -1))


def _run_families(merge, families=FAMILIES) -> None:
    import torch

    g = torch.Generator().manual_seed(0)
    for K, Hq, Hkv, right in families:
        for B in (3, 9, 17):
            q = torch.randn(B, K, Hq, 64, generator=g).bfloat16()
            kv = torch.randn(2, B, K, Hkv, 64, generator=g).bfloat16()
            o_a = torch.randn(B, K, Hq, 64, generator=g).bfloat16()
            merge(q, kv[0], kv[1], o_a, torch.randn(B, K, Hq, generator=g), scale=0.125, right=right)


def _only_batch_symbolic(graphs) -> list[str]:
    """What is wrong with the recorded graphs: a symbolic dim other than the batch (dim 0)."""
    bad = []
    for n, g in enumerate(graphs):
        for t, dims in g.items():
            if dims - {0}:
                bad.append(f"graph {n}: tensor input {t} has symbolic dims {sorted(dims)}")
    return bad


def test_compiled_merge_builds_the_deployed_graphs_per_family(monkeypatch):
    """Per family: one static graph, then one with the batch symbolic (seed 000's automatic dynamic
    shapes); K and the head counts never become symbolic however many families one process sees."""
    from lowerings import merges

    monkeypatch.setattr(merges, "_COMPILED", {})
    graphs = _record_graphs(monkeypatch)
    _run_families(merges.merge_compiled)
    assert _only_batch_symbolic(graphs) == []
    # 3 distinct families x (static, batch-symbolic); the repeated family compiles nothing new.
    assert [bool(g[0]) for g in graphs] == [False, True] * 3


def test_the_graph_check_sees_a_shared_compiled_function(monkeypatch):
    """Negative control: one torch.compile'd function across families (the form before the fix) makes
    K and the head count symbolic from the second family on, and the check above names it."""
    import torch

    from lowerings import merges

    graphs = _record_graphs(monkeypatch)
    merges._no_silent_eager_fallback()
    shared = torch.compile(merges._fresh_merge_unrolled(("cpu", "bfloat16", 0, 0, 0, 0, -1, 2.0, 0.0)),
                           backend=merges._counting_backend("eager"), dynamic=None)

    def merge(q, k, v, o_a, lse_a, *, scale, right):
        return shared(q, k, v, o_a, lse_a, scale, right, 2.0)

    _run_families(merge, FAMILIES[:2])  # graph 2 is the second family's first: the families after it add nothing
    bad = _only_batch_symbolic(graphs)
    assert "graph 2: tensor input 0 has symbolic dims [0, 1, 2]" in bad, bad  # q: B, K and Hq


def test_the_check_sees_a_second_pointer_type_in_a_family():
    """The check can fail on a tensor argument: an int32 and an int64 page table in one family are two
    signatures of a kernel (the H200's `hybrid_paged[splits=4]` finding, docs/gpu run 16), and so is a
    pointer that loses its 16-byte alignment; the same dtype and alignment are one."""
    base = torch.zeros(64, dtype=torch.int32)
    log = [(("fam",), "k", ("pt_ptr", "n"), (base, 5), {}),
           (("fam",), "k", ("pt_ptr", "n"), (torch.zeros(64, dtype=torch.int32), 7), {})]
    assert all(len(v) == 1 for v in variants(log, {}).values())
    wide = log + [(("fam",), "k", ("pt_ptr", "n"), (torch.zeros(64, dtype=torch.int64), 5), {})]
    assert [differing(v) for v in variants(wide, {}).values()] == [["pt_ptr"]]
    shifted = log + [(("fam",), "k", ("pt_ptr", "n"), (base[1:], 5), {})]  # 4 bytes past an aligned start
    assert [differing(v) for v in variants(shifted, {}).values()] == [["pt_ptr"]]
