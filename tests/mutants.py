"""The mutant catalogue: realistic buggy lowerings the framework must catch (BUGS.md, one bug each).

Each mutant subclasses (or wraps) the correct torch lowering it copies, keeps its declared attributes
(`devices`, `lse_base`, `deterministic`, `max_compiles`) unless the declaration *is* the bug, has a
distinct `name` ("mutant:..."), a `bugs_row` (the BUGS.md row it reproduces) and a docstring saying
what it gets wrong. `tests/parity/test_mutants.py` asserts that `check_lowering` fails on every one,
with the expected message, and shrinks the failing case small.

Not a test module (no `test_` prefix): import it as `tests.mutants`.
"""

from __future__ import annotations

import itertools
from unittest import mock

import torch

from lowerings import _paged, counters
from lowerings.merges import (LN2, MERGE_FORMS, _counting_backend, _merge_unrolled, merge_eager, merge_states,
                              merges_future_block_keys, part_b)
from lowerings.protocol import BASE_2, BASE_E, LoweringResult, Partial
from lowerings.torch_emulation import (Context, DecodeRows, WindowedMerge, _ensure_block_in_pool,
                                       causal_decode_part_a, decode_rows_attention)
from oracle.case import Case, pages_needed
from oracle.inputs import Inputs


# ---- shared, faithful copies with one hook each (test_mutants checks them bit-identical) ----------------

def _context_read(inputs: Inputs, *, table=None, kv_lens=None, scale=None, k_scale=None, v_scale=None):
    """Context.run's paged prefill read (no append, no counter), any argument overridable."""
    c = inputs.case
    return _paged.paged_attention(
        inputs.q, inputs.k_pool, inputs.v_pool, inputs.page_table if table is None else table,
        kv_lens or [L + c.block_size for L in inputs.context_lens_host], layout=c.layout, page_size=c.page_size,
        scale=c.softmax_scale if scale is None else scale, window_left=c.window[0], causal=False,
        k_scale=c.k_scale if k_scale is None else k_scale, v_scale=c.v_scale if v_scale is None else v_scale)


class _ContextMutant(Context):
    """Context with the read step split out: `run` = append, count, `read`."""

    def read(self, inputs: Inputs):
        return _context_read(inputs)

    def run(self, inputs: Inputs) -> LoweringResult:
        c = inputs.case
        _ensure_block_in_pool(inputs)
        counters.record("torch.paged_prefill", rows=c.batch_size * c.block_size)
        out, lse2 = self.read(inputs)
        return LoweringResult(out=out, lse=lse2)


def _part_a(inputs: Inputs, *, lens=None, window_left=None):
    """`causal_decode_part_a` with its row lengths and window overridable."""
    c = inputs.case
    B, K, Hq, D = inputs.q.shape
    _ensure_block_in_pool(inputs)
    counters.record("torch.paged_decode", rows=B * K)
    table = inputs.page_table.repeat_interleave(K, dim=0)
    lens = lens or [L + i + 1 for L in inputs.context_lens_host for i in range(K)]
    out, lse2 = _paged.paged_attention(inputs.q.reshape(B * K, 1, Hq, D), inputs.k_pool, inputs.v_pool, table, lens,
                                       layout=c.layout, page_size=c.page_size, scale=c.softmax_scale,
                                       window_left=c.window[0] if window_left is None else window_left,
                                       k_scale=c.k_scale, v_scale=c.v_scale)
    return out.view(B, K, Hq, D), lse2.view(B, K, Hq)


class _WindowedMutant(WindowedMerge):
    """WindowedMerge.run with three hooks: `part_a`, `needs_merge` (run only: `expected_calls` keeps the
    correct rule) and `merge` (returns out, lse and part B's Partial or None)."""

    mutant_name = ""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.mutant_name:
            self.name = self.mutant_name

    def part_a(self, inputs: Inputs):
        return causal_decode_part_a(inputs)

    def needs_merge(self, case: Case) -> bool:
        return merges_future_block_keys(case.block_size, case.window[1])

    def merge(self, inputs: Inputs, o_a, lse_a, right: int):
        c = inputs.case
        if self.form == "eager":
            out, lse, o_b, lse_b = merge_eager(inputs.q, inputs.k_block, inputs.v_block, o_a, lse_a,
                                               scale=c.softmax_scale, right=right, lse_a_base=BASE_2,
                                               return_part_b=True)
            return out, lse, Partial(out=o_b, lse=lse_b, lse_base=BASE_E, window=(-1, -1),
                                     future_block_keys_right=right)
        out, lse = MERGE_FORMS[self.form](inputs.q, inputs.k_block, inputs.v_block, o_a, lse_a,
                                          scale=c.softmax_scale, right=right, lse_a_base=BASE_2)
        return out, lse, None

    def run(self, inputs: Inputs) -> LoweringResult:
        c = inputs.case
        left, right = c.window
        o_a, lse_a = self.part_a(inputs)
        partials = {"A": Partial(out=o_a, lse=lse_a, lse_base=BASE_2, window=(left, 0))}
        if not self.needs_merge(c):
            return LoweringResult(out=o_a, lse=lse_a, partials=partials)
        out, lse, pb = self.merge(inputs, o_a, lse_a, right)
        if pb is not None:
            partials["B"] = pb
        return LoweringResult(out=out, lse=lse, partials=partials)


def _eager_merge_parts(inputs: Inputs, o_a, lse_a_nat, right: int, *, part_b_fn=part_b):
    """The eager merge's body on an already-natural part A LSE: (out, natural lse, part B Partial)."""
    c = inputs.case
    counters.record("torch.merge_eager")
    o_b, lse_b = part_b_fn(inputs.q, inputs.k_block, inputs.v_block, scale=c.softmax_scale, right=right)
    o, lse = merge_states(o_a, lse_a_nat, o_b, lse_b)
    return o.to(o_a.dtype), lse, Partial(out=o_b, lse=lse_b, lse_base=BASE_E, window=(-1, -1),
                                         future_block_keys_right=right)


# ---- BUGS 2: LSE base ------------------------------------------------------------------------------------

class LseBaseNatural(_WindowedMutant):
    """BUGS 2: part A's base-2 LSE (flashinfer) merged as if natural: the `* ln 2` is missing, so the
    sigmoid weight of part B is wrong wherever part B is not empty."""

    mutant_name = "mutant:lse_base_natural"
    bugs_row = 2

    def merge(self, inputs, o_a, lse_a, right):
        out, lse, pb = _eager_merge_parts(inputs, o_a, lse_a.float(), right)  # BUG: no * LN2
        return out, lse / LN2, pb


class LseConvertedTwice(_WindowedMutant):
    """BUGS 2: part A's LSE converted to natural log by the caller and again inside the merge
    (`lse_a_base=2.0` passed with an already-natural LSE)."""

    mutant_name = "mutant:lse_converted_twice"
    bugs_row = 2

    def merge(self, inputs, o_a, lse_a, right):
        c = inputs.case
        out, lse, o_b, lse_b = merge_eager(inputs.q, inputs.k_block, inputs.v_block, o_a, lse_a.float() * LN2,  # BUG
                                           scale=c.softmax_scale, right=right, lse_a_base=BASE_2, return_part_b=True)
        return out, lse, Partial(out=o_b, lse=lse_b, lse_base=BASE_E, window=(-1, -1), future_block_keys_right=right)


class LseBaseDeclaredNatural(Context):
    """BUGS 2: the context adapter declares torch's natural-log LSE while its kernel (flashinfer-style)
    returns base 2: every LSE is read 1/ln 2 too large. The only wrong thing is the declaration."""

    name = "mutant:lse_base_declared_natural"
    bugs_row = 2
    lse_base = BASE_E  # BUG: the kernel returns base 2


# ---- BUGS 4, 5, 1: windows --------------------------------------------------------------------------------

class WindowLeftW(_WindowedMutant):
    """BUGS 4: part A's decode rows use `window_left = W` instead of `W - 1`: one key too many on the left."""

    mutant_name = "mutant:window_left_W"
    bugs_row = 4

    def part_a(self, inputs):
        left = inputs.case.window[0]
        return _part_a(inputs, window_left=left + 1 if left != -1 else -1)  # BUG: W, not W-1


class PartBRightExclusive(_WindowedMutant):
    """BUGS 4: part B's right bound `j < i + right` instead of `j <= i + right`: the last later block key
    inside the window is dropped."""

    mutant_name = "mutant:part_b_right_exclusive"
    bugs_row = 4

    def merge(self, inputs, o_a, lse_a, right):
        out, lse, pb = super().merge(inputs, o_a, lse_a, right - 1 if right > 0 else right)  # BUG: < vs <=
        return out, lse, Partial(pb.out, pb.lse, pb.lse_base, pb.window, future_block_keys_right=right)


class ContextRightUnclipped(Context):
    """BUGS 5: context FMHA claims every window; with `K > W` (K-1 > right) its end-aligned left-only
    window lets early queries see later block keys past their right edge."""

    name = "mutant:context_right_unclipped"
    bugs_row = 5

    def supports(self, case: Case) -> str | None:
        return None  # BUG: exact only iff K-1 <= right


class PartABlockEndAnchor(_WindowedMutant):
    """BUGS 1: part A's decode rows all use `seq_len = L + K` (anchored at the block end, as plain decode
    rows are) instead of `L + i + 1`: early queries lose their left keys and see later ones twice."""

    mutant_name = "mutant:part_a_block_end_anchor"
    bugs_row = 1

    def part_a(self, inputs):
        K = inputs.case.block_size
        return _part_a(inputs, lens=[L + K for L in inputs.context_lens_host for _ in range(K)])  # BUG


# ---- BUGS 6 / 9: merges -----------------------------------------------------------------------------------

def _part_b_unguarded(q, k_block, v_block, *, scale: float, right: int):
    """`part_b` without its empty-row guard: `exp(s - m)` with `m = -inf` gives `exp(-inf - -inf)` = NaN."""
    B, K, Hq, D = q.shape
    Hkv = k_block.shape[2]
    i, j = torch.arange(K, device=q.device).view(-1, 1), torch.arange(K, device=q.device).view(1, -1)
    allowed = (j > i) & ((j <= i + right) if right != -1 else True)
    s = torch.einsum("bihgd,bjhd->bhgij", q.float().view(B, K, Hkv, Hq // Hkv, D), k_block.float()) * scale
    s = s.masked_fill(~allowed, float("-inf"))
    m = s.amax(dim=-1, keepdim=True)
    p = torch.exp(s - m)  # BUG: no m_safe
    l = p.sum(dim=-1, keepdim=True)
    o = torch.einsum("bhgij,bjhd->bhgid", p, v_block.float()) / l
    lse = (m + torch.log(l)).squeeze(-1)
    return o.permute(0, 3, 1, 2, 4).reshape(B, K, Hq, D), lse.permute(0, 3, 1, 2).reshape(B, K, Hq)


class MergeNanLastQuery(_WindowedMutant):
    """BUGS 6 (and 9): part B of the last query (`i = K-1`) is empty and computed as `exp(-inf - -inf)`:
    NaN, which the merge's zero weight does not remove (0 * NaN = NaN)."""

    mutant_name = "mutant:merge_nan_last_query"
    bugs_row = 6

    def merge(self, inputs, o_a, lse_a, right):
        out, lse, pb = _eager_merge_parts(inputs, o_a, lse_a.float() * LN2, right, part_b_fn=_part_b_unguarded)
        return out, lse / LN2, pb


class MergeOnCausal(_WindowedMutant):
    """BUGS 6: the merge runs on causal layers too (`right == 0` is not tested): numerically harmless here
    (part B is empty, weight 0), but a kernel launched for nothing; only the call counters see it."""

    mutant_name = "mutant:merge_on_causal"
    bugs_row = 6

    def needs_merge(self, case):
        return case.block_size > 1  # BUG: ignores right == 0


class MergeSkippedUnbounded(_WindowedMutant):
    """BUGS 6: the no-merge test is written `K == 1 or right <= 0`, so the unbounded right edge
    (`right == -1`, a non-causal unwindowed layer) skips the merge: later block keys are never seen."""

    mutant_name = "mutant:merge_skipped_unbounded"
    bugs_row = 6

    def needs_merge(self, case):
        return case.block_size > 1 and case.window[1] > 0  # BUG: -1 means unbounded, not "none"


# ---- BUGS 10 / 11 / 12: pages ------------------------------------------------------------------------------

class ContextReadToPageEnd(_ContextMutant):
    """BUGS 10: the context read length `L + K` is rounded up to the end of the last page: the kernel
    reads the unused tail slots of the last page (canaries) as keys."""

    name = "mutant:context_read_to_page_end"
    bugs_row = 10

    def read(self, inputs):
        ps, K = inputs.case.page_size, inputs.case.block_size
        return _context_read(inputs, kv_lens=[-(-(L + K) // ps) * ps for L in inputs.context_lens_host])  # BUG


class LastPageFromTableEnd(_ContextMutant):
    """BUGS 10: the read takes the last (partial) page from `page_table[b, -1]`, assuming each row ends at
    its last used page: a request with fewer pages than the row is wide reads a page it does not use."""

    name = "mutant:last_page_from_table_end"
    bugs_row = 10

    def read(self, inputs):
        c = inputs.case
        table = inputs.page_table.clone()
        for b, L in enumerate(inputs.context_lens_host):
            table[b, pages_needed(L, c.block_size, c.page_size) - 1] = inputs.page_table[b, -1]  # BUG
        return _context_read(inputs, table=table)


class AppendClampedPage0(_ContextMutant):
    """BUGS 11: the append looks up the block's pages among those the context already used; a page only
    the block needs (L ends on a page boundary, or the block spills over) has no id yet, clamped to 0:
    the block is written into page 0, which the request usually does not own."""

    name = "mutant:append_clamped_page0"
    bugs_row = 11

    def run(self, inputs):
        c = inputs.case
        if c.block_storage == "dense":
            counters.record("torch.append_paged_kv")
            for b, L in enumerate(inputs.context_lens_host):
                t = torch.arange(L, L + c.block_size)
                col = t // c.page_size
                pid = inputs.page_table[b].to(torch.long)[col]
                pid = torch.where(col < -(-L // c.page_size), pid, torch.zeros_like(pid))  # BUG: clamp to page 0
                for pool, blk, sc in ((inputs.k_pool, inputs.k_block[b], c.k_scale),
                                      (inputs.v_pool, inputs.v_block[b], c.v_scale)):
                    val = (blk.float() / sc).to(pool.dtype) if pool.dtype == _paged._FP8 else blk.to(pool.dtype)
                    if c.layout == "NHD":
                        pool[pid, t % c.page_size] = val
                    else:
                        pool[pid, :, t % c.page_size] = val
        counters.record("torch.paged_prefill", rows=c.batch_size * c.block_size)
        out, lse2 = self.read(inputs)
        return LoweringResult(out=out, lse=lse2)


class AppendPadsPageTail(_ContextMutant):
    """BUGS 11 (pool bytes outside the request's slots): the append writes whole page tiles and zero-fills
    the unused tail of each request's last page. Every read stays in bounds, so the numbers are right;
    only the untouched-pool check sees the slots it may not write."""

    name = "mutant:append_pads_page_tail"
    bugs_row = 11

    def run(self, inputs):
        c = inputs.case
        res = super().run(inputs)
        if c.block_storage == "dense":
            for b, L in enumerate(inputs.context_lens_host):
                end, ps = L + c.block_size, c.page_size
                page, tail = int(inputs.page_table[b, (end - 1) // ps]), end % ps
                if tail:
                    for pool in (inputs.k_pool, inputs.v_pool):  # BUG: slots tail .. ps-1 are not ours
                        (pool[page, tail:] if c.layout == "NHD" else pool[page, :, tail:]).zero_()
        return res


class PageTableRowStride(_ContextMutant):
    """BUGS 12: the kernel indexes the page table as a contiguous `[B, max_pages]` buffer (row stride =
    width), ignoring the real row stride of a strided row view: rows b >= 1 read padding as page ids."""

    name = "mutant:page_table_row_stride"
    bugs_row = 12

    def run(self, inputs):
        pt = inputs.page_table
        flat = torch.as_strided(pt, pt.shape, (pt.shape[1], 1), pt.storage_offset())  # BUG: assumes contiguous
        return super().run(Inputs(**{**vars(inputs), "page_table": flat}))


class PageTableAssumesInt32(_ContextMutant):
    """BUGS 12: the read kernel takes the page table as int32 whatever its dtype: with int64 ids, column c
    reads the c-th 32-bit word (column 1 reads the high half of id 0, i.e. page 0)."""

    name = "mutant:page_table_assumes_int32"
    bugs_row = 12

    def read(self, inputs):
        pt = inputs.page_table
        return _context_read(inputs, table=pt.view(torch.int32)[:, : pt.shape[1]])  # BUG: int64 read as int32


# ---- BUGS 16, 15, 14: heads, scale, fp8 ----------------------------------------------------------------------

class GqaHeadModulo(DecodeRows):
    """BUGS 16: query head h reads KV head `h % Hkv` instead of `h // G` (the interleaved packing)."""

    name = "mutant:gqa_head_modulo"
    bugs_row = 16

    def run(self, inputs):
        Hq, Hkv = inputs.case.num_q_heads, inputs.case.num_kv_heads
        order = sorted(range(Hq), key=lambda h: (h % Hkv, h))  # packed slot s holds query head order[s]
        res = super().run(Inputs(**{**vars(inputs), "q": inputs.q[:, :, order].contiguous()}))  # BUG
        back = [order.index(h) for h in range(Hq)]
        return LoweringResult(out=res.out[:, :, back].contiguous(), lse=res.lse[:, :, back].contiguous())


class ScaleHardcoded(_ContextMutant):
    """BUGS 15: the softmax scale is hard-coded to `D ** -0.5` (the case's `scale` is ignored)."""

    name = "mutant:scale_hardcoded"
    bugs_row = 15

    def read(self, inputs):
        return _context_read(inputs, scale=inputs.case.head_dim ** -0.5)  # BUG


class Fp8ScaleIgnored(_ContextMutant):
    """BUGS 14: the fp8 KV dequant scales are not passed to the read kernel (taken as 1)."""

    name = "mutant:fp8_scale_ignored"
    bugs_row = 14

    def read(self, inputs):
        return _context_read(inputs, k_scale=1.0, v_scale=1.0)  # BUG


# ---- BUGS 17, 3: dispatch and workspaces ----------------------------------------------------------------------

class SilentFallbackContext(DecodeRows):
    """BUGS 17: decode rows silently run the context form at every batch size: right numbers, wrong
    kernel (`torch.paged_prefill` where `torch.paged_decode` is declared for B <= 32)."""

    name = "mutant:silent_fallback_context"
    bugs_row = 17

    def run(self, inputs):
        out, lse2 = decode_rows_attention(inputs, threshold=0)  # BUG: the fast path is never taken
        return LoweringResult(out=out, lse=lse2)


class DispatchThresholdOffByOne(DecodeRows):
    """BUGS 3/17: the dispatch tests `B <= 33` while the declared threshold is 32: B = 33 runs decode rows
    (and would need a workspace sized for 33*K rows)."""

    name = "mutant:dispatch_threshold_off_by_one"
    bugs_row = "3/17"

    def run(self, inputs):
        out, lse2 = decode_rows_attention(inputs, threshold=self.threshold + 1)  # BUG
        return LoweringResult(out=out, lse=lse2)


class StatsSlabBRows(DecodeRows):
    """BUGS 3: the decode stats slab (the LSE workspace) is sized for B rows, not B*K: row r's LSE lands in
    slot r % B, so every row reads back the LSE of the last row sharing its slot."""

    name = "mutant:stats_slab_b_rows"
    bugs_row = 3

    def run(self, inputs):
        res = super().run(inputs)
        B, K, Hq = res.lse.shape
        if B > self.threshold:
            return res
        rows = res.lse.reshape(B * K, Hq)
        slab = torch.empty((B, Hq), dtype=rows.dtype, device=rows.device)  # BUG: B rows
        for r in range(B * K):
            slab[r % B] = rows[r]
        return LoweringResult(out=res.out, lse=slab[torch.arange(B * K) % B].view(B, K, Hq))


# ---- BUGS 9, reached through values: softmax overflow ---------------------------------------------------------

def _attend_without_max(q, k, v, mask, scale):
    """`_paged.attend` with `exp(s)` where it has `exp(s - max s)`: any score past 88.7 overflows to inf
    (inf / inf = NaN), a row whose scores all lie below -103 sums to 0 (0 / 0)."""
    N, M, Hq, D = q.shape
    Hkv = k.shape[2]
    qf = q.float().view(N, M, Hkv, Hq // Hkv, D)
    s = torch.einsum("nmhgd,nthd->nhgmt", qf, k.float()) * scale
    s = s.masked_fill(~mask.view(N, 1, 1, M, -1), float("-inf"))
    p = torch.exp(s)  # BUG: no max subtraction
    l = p.sum(dim=-1, keepdim=True)
    o = torch.einsum("nhgmt,nthd->nhgmd", p.to(q.dtype).float(), v.float()) / l
    lse = torch.log(l) * _paged.LOG2E
    return (o.permute(0, 3, 1, 2, 4).reshape(N, M, Hq, D).to(q.dtype),
            lse.squeeze(-1).permute(0, 3, 1, 2).reshape(N, M, Hq))


class SoftmaxWithoutMax(_ContextMutant):
    """BUGS 9 (a non-finite from `exp`, reached through values; issue 13): a bf16-only context kernel
    computes its softmax as `exp(s) / sum exp(s)`, without subtracting the row maximum. Exact for the
    scores standard normal values give; scores past 88.7 overflow (NaN). Only the `large`/`huge` value
    regimes (and outliers or sinks at scale 1) reach it: shapes alone never did (500 of 500 passed)."""

    name = "mutant:softmax_without_max"
    bugs_row = 9

    def supports(self, case: Case) -> str | None:
        if case.dtype != "bfloat16" or case.kv_dtype != "bfloat16":
            return "bf16 only (q and the KV pool)"
        return super().supports(case)

    def read(self, inputs):
        with mock.patch.object(_paged, "attend", _attend_without_max):
            return _context_read(inputs)


# ---- BUGS 18, 19, 8: inputs, determinism, compiles ---------------------------------------------------------

class ScalesQInPlace(_ContextMutant):
    """BUGS 18: q is pre-scaled in place (`q *= scale`, kernel run with scale 1) and "restored" with
    `q /= scale`: in bf16/fp16 the round trip is exact only for power-of-two scales."""

    name = "mutant:scales_q_in_place"
    bugs_row = 18

    def read(self, inputs):
        sc = inputs.case.softmax_scale
        inputs.q.mul_(sc)  # BUG: the caller's tensor
        try:
            return _context_read(inputs, scale=1.0)
        finally:
            inputs.q.div_(sc)


_calls = itertools.count()


class RacyOutput(_ContextMutant):
    """BUGS 19: a race in the output write (split partials reduced in arrival order): which element loses
    the race changes from call to call, and that element is off by one bit. Each result alone is within
    tolerance; only running the same inputs again shows it."""

    name = "mutant:racy_output"
    bugs_row = 19

    def read(self, inputs):
        out, lse2 = _context_read(inputs)
        out = out.clone()
        bits = out.view({2: torch.int16, 4: torch.int32}[out.element_size()]).view(-1)
        bits[next(_calls) % bits.numel()] ^= 1  # BUG: depends on the call, not on the inputs
        return out, lse2


def _merge_unrolled_static(q, k_block, v_block, o_a, lse_a, scale, right, lse_a_base):
    return _merge_unrolled(q, k_block, v_block, o_a, lse_a, scale, right, lse_a_base)


class RecompilePerBatch(_WindowedMutant):
    """BUGS 8: the compiled merge uses `torch.compile(dynamic=False)`: one graph per batch size, caught
    by the compile budget (`max_compiles` per shape family) over a sweep where only B and L vary."""

    mutant_name = "mutant:recompile_per_batch"
    bugs_row = 8
    _fn = None

    def __init__(self) -> None:
        super().__init__(form="compiled")

    def merge(self, inputs, o_a, lse_a, right):
        if RecompilePerBatch._fn is None:
            RecompilePerBatch._fn = torch.compile(_merge_unrolled_static, backend=_counting_backend("eager"),
                                                  dynamic=False)  # BUG: static shapes
        counters.record("torch.compile[merge_unrolled]")
        c = inputs.case
        out, lse = RecompilePerBatch._fn(inputs.q, inputs.k_block, inputs.v_block, o_a, lse_a,
                                         c.softmax_scale, right, BASE_2)
        return out, lse, None


# ---- production scale: bugs past a few thousand keys, positions, dispatch, fp8 scales --------------------

def _paged_attention_hooked(q, k_pool, v_pool, page_table, kv_lens, *, layout, page_size, scale, window_left=-1,
                            causal=False, k_scale=1.0, v_scale=1.0, first_key=None, read_lens=None, pos_dtype=None):
    """`lowerings._paged.paged_attention`, copied, with three hooks (None: the original, bit for bit, which
    test_mutants checks): row `n` attends only to keys `t >= first_key[n]`; it reads `read_lens[n]` keys
    through its page table (the valid ones; its queries stay at the end of `kv_lens[n]`); the mask compares
    positions held in `pos_dtype`."""
    N, M, Hq, D = q.shape
    dev = q.device
    if N == 0:
        return q.new_zeros(q.shape), torch.zeros((0, M, Hq), device=dev)
    Hkv = k_pool.shape[2] if layout == "NHD" else k_pool.shape[1]
    lens = torch.tensor(kv_lens, device=dev, dtype=torch.long)
    reads = torch.tensor(read_lens if read_lens is not None else kv_lens, device=dev, dtype=torch.long)
    firsts = torch.tensor(first_key, device=dev, dtype=torch.long) if first_key is not None else None
    T = max(int(reads.max()), 1)
    rows_per = max(1, _paged._MAX_GATHER_ELEMS // max(1, T * Hkv * D))
    outs, lses = [], []
    for n0 in range(0, N, rows_per):
        n1 = min(N, n0 + rows_per)
        t = torch.arange(T, device=dev).view(1, -1)
        ln = lens[n0:n1].view(-1, 1)
        valid = t < reads[n0:n1].view(-1, 1)
        col = torch.clamp(t // page_size, max=page_table.shape[1] - 1).expand(n1 - n0, -1)
        pid = torch.gather(page_table[n0:n1].to(torch.long), 1, col)
        pid = torch.where(valid, pid, torch.zeros_like(pid))
        slot = (t % page_size).expand(n1 - n0, -1)
        k = _paged._read_pool(k_pool, pid, slot, layout, k_scale, q.dtype)
        v = _paged._read_pool(v_pool, pid, slot, layout, v_scale, q.dtype)
        z = torch.zeros((), dtype=q.dtype, device=dev)
        k = torch.where(valid.view(n1 - n0, T, 1, 1), k, z)
        v = torch.where(valid.view(n1 - n0, T, 1, 1), v, z)
        pos = ln - M + torch.arange(M, device=dev).view(1, -1)  # [n, M]
        tt, pp = (t, pos) if pos_dtype is None else (t.to(pos_dtype), pos.to(pos_dtype))
        mask = valid.view(-1, 1, T) & torch.ones((1, M, 1), dtype=torch.bool, device=dev)
        if firsts is not None:
            mask = mask & (t.view(1, 1, T) >= firsts[n0:n1].view(-1, 1, 1))
        if window_left >= 0:
            mask = mask & (tt.view(1, 1, T) >= (pp - window_left).unsqueeze(-1))
        if causal:
            mask = mask & (tt.view(1, 1, T) <= pp.unsqueeze(-1))
        o, lse = _paged.attend(q[n0:n1], k, v, mask, scale)
        outs.append(o)
        lses.append(lse)
    return torch.cat(outs), torch.cat(lses)


def _context_read_hooked(inputs: Inputs, **hooks):
    """`_context_read` (Context's paged prefill read) through `_paged_attention_hooked`."""
    c = inputs.case
    return _paged_attention_hooked(
        inputs.q, inputs.k_pool, inputs.v_pool, inputs.page_table, [L + c.block_size for L in inputs.context_lens_host],
        layout=c.layout, page_size=c.page_size, scale=c.softmax_scale, window_left=c.window[0], causal=False,
        k_scale=c.k_scale, v_scale=c.v_scale, **hooks)


SPLIT_KEYS = 2048  # keys per split of the split-KV mutants
WORKSPACE_SPLITS = 2  # split partials the fixed workspace holds


class SplitWorkspaceWraps(_ContextMutant):
    """BUGS 3: a fixed-size split-KV workspace: room for 2 splits of 2048 keys (the longest context it was
    tested on), split `s` written at slot `s % 2`. Past 4096 keys a third split overwrites the first, and
    the merge sees keys from 2048 on only. Exact up to 4096 keys: shrinks to `L + K = 4097`."""

    name = "mutant:split_workspace_wraps"
    bugs_row = 3

    def read(self, inputs):
        K = inputs.case.block_size
        first = []
        for L in inputs.context_lens_host:
            splits = -(-(L + K) // SPLIT_KEYS)
            first.append(max(0, splits - WORKSPACE_SPLITS) * SPLIT_KEYS)  # BUG: the overwritten splits' keys
        return _context_read_hooked(inputs, first_key=first)


class LastSplitUnclamped(_ContextMutant):
    """BUGS 9/10: split-KV past 4096 keys (chunks of 4096); the last chunk's end is not clamped to the
    row's length: it reads on through the page table to the chunk's end (the tail of the last page,
    then the last page again). One chunk (up to 4096 keys) is exact: shrinks to `L + K = 4097`."""

    name = "mutant:last_split_unclamped"
    bugs_row = "9/10"

    def read(self, inputs):
        K = inputs.case.block_size
        chunk = 2 * SPLIT_KEYS
        reads = [-(-(L + K) // chunk) * chunk if L + K > chunk else L + K for L in inputs.context_lens_host]  # BUG
        return _context_read_hooked(inputs, read_lens=reads)


class _PositionsNarrow(_WindowedMutant):
    """Part A's window mask compares positions held in `pos_dtype` (a float type: exact only below
    2 ** (significand bits + 1))."""

    pos_dtype = torch.float32

    def part_a(self, inputs):
        c = inputs.case
        B, K, Hq, D = inputs.q.shape
        _ensure_block_in_pool(inputs)
        counters.record("torch.paged_decode", rows=B * K)
        table = inputs.page_table.repeat_interleave(K, dim=0)
        lens = [L + i + 1 for L in inputs.context_lens_host for i in range(K)]
        out, lse2 = _paged_attention_hooked(inputs.q.reshape(B * K, 1, Hq, D), inputs.k_pool, inputs.v_pool, table,
                                            lens, layout=c.layout, page_size=c.page_size, scale=c.softmax_scale,
                                            window_left=c.window[0], k_scale=c.k_scale, v_scale=c.v_scale,
                                            pos_dtype=self.pos_dtype)
        return out.view(B, K, Hq, D), lse2.view(B, K, Hq)


class PositionsFp16(_PositionsNarrow):
    """BUGS 4: part A's sliding-window mask compares positions in fp16, exact only up to 2048: from
    position 2049 on (rounded to 2048) a window edge moves by a key. Shrinks to `L = 2049`."""

    mutant_name = "mutant:positions_fp16"
    bugs_row = 4
    pos_dtype = torch.float16  # BUG


class PositionsBf16(_PositionsNarrow):
    """BUGS 4: part A's sliding-window mask compares positions in bf16, exact only up to 256: from position
    257 on a window edge moves. Shrinks to `L = 257`."""

    mutant_name = "mutant:positions_bf16"
    bugs_row = 4
    pos_dtype = torch.bfloat16  # BUG


class DispatchThresholdLow(DecodeRows):
    """BUGS 17: the dispatch tests `B < 32` while the declared threshold is `B <= 32`: B = 32 silently runs
    the context form (right numbers, the wrong kernel)."""

    name = "mutant:dispatch_threshold_low"
    bugs_row = 17

    def run(self, inputs):
        out, lse2 = decode_rows_attention(inputs, threshold=self.threshold - 1)  # BUG
        return LoweringResult(out=out, lse=lse2)


class Fp8ScalesSwapped(_ContextMutant):
    """BUGS 14: the fp8 pool's dequant scales passed in the wrong order (`k_scale` for V, `v_scale` for K):
    right whenever `k_scale == v_scale`, wrong otherwise."""

    name = "mutant:fp8_scales_swapped"
    bugs_row = 14

    def read(self, inputs):
        c = inputs.case
        return _context_read(inputs, k_scale=c.v_scale, v_scale=c.k_scale)  # BUG


MUTANTS = (
    LseBaseNatural, LseConvertedTwice, LseBaseDeclaredNatural, WindowLeftW, PartBRightExclusive,
    ContextRightUnclipped, PartABlockEndAnchor, MergeNanLastQuery, MergeOnCausal, MergeSkippedUnbounded,
    ContextReadToPageEnd, LastPageFromTableEnd, AppendClampedPage0, AppendPadsPageTail, PageTableRowStride,
    PageTableAssumesInt32, GqaHeadModulo, ScaleHardcoded, Fp8ScaleIgnored, SilentFallbackContext,
    DispatchThresholdOffByOne, StatsSlabBRows, ScalesQInPlace, RacyOutput, RecompilePerBatch, SoftmaxWithoutMax,
    SplitWorkspaceWraps, LastSplitUnclamped, PositionsFp16, PositionsBf16, DispatchThresholdLow, Fp8ScalesSwapped,
)
# The production-scale mutants (issue 13): caught by the default `ci` profile's draws and boundary cases
# (`strategies.check_cases`), tests/parity/test_production_mutants.py.
PRODUCTION_MUTANTS = (SplitWorkspaceWraps, LastSplitUnclamped, PositionsFp16, PositionsBf16, DispatchThresholdLow,
                      Fp8ScalesSwapped)


def catalogue() -> dict[str, object]:
    """A fresh instance of every mutant, by name."""
    out = {}
    for cls in MUTANTS:
        m = cls()
        assert m.name.startswith("mutant:") and m.name not in out, m.name
        out[m.name] = m
    return out
