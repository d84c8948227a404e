"""The mutant catalogue: realistic buggy lowerings the framework must catch (docs/bugs.md, one bug each).

Each mutant subclasses (or wraps) the correct torch lowering it copies, keeps its declared attributes
(`devices`, `lse_base`, `deterministic`, `max_compiles`) unless the declaration *is* the bug, has a
distinct `name` ("mutant:..."), a `bugs_row` (the docs/bugs.md row it reproduces) and a docstring saying
what it gets wrong. `tests/parity/test_mutants.py` asserts that `check_lowering` fails on every one,
with the expected message, and shrinks the failing case small.

Not a test module (no `test_` prefix): import it as `tests.mutants`.
"""

from __future__ import annotations

import itertools
from unittest import mock

import torch

from lowerings import counters, paged
from lowerings.merges import LN2, _counting_backend, _merge_unrolled, merge_eager
from lowerings.protocol import BASE_2, BASE_E, LoweringResult, Partial
from lowerings.torch_emulation import Context, DecodeRows, decode_rows_attention
from oracle.case import Case, pages_needed
from oracle.inputs import Inputs
from tests.mutant_bases import ContextMutant, WindowedMutant, context_read, eager_merge_parts, part_a
from tests.extreme_mutants import EXTREME_MUTANTS
from tests.production_mutants import (DispatchThresholdLow, Fp8ScalesSwapped, LastSplitUnclamped,  # noqa: F401
                                      PositionsBf16, PositionsFp16, SplitWorkspaceWraps)


# ---- BUGS 2: LSE base ------------------------------------------------------------------------------------

class LseBaseNatural(WindowedMutant):
    """BUGS 2: part A's base-2 LSE (flashinfer) merged as if natural: the `* ln 2` is missing, so the
    sigmoid weight of part B is wrong wherever part B is not empty."""

    mutant_name = "mutant:lse_base_natural"
    bugs_row = 2

    def merge(self, inputs, o_a, lse_a, right):
        out, lse, pb = eager_merge_parts(inputs, o_a, lse_a.float(), right)  # BUG: no * LN2
        return out, lse / LN2, pb


class LseConvertedTwice(WindowedMutant):
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

class WindowLeftW(WindowedMutant):
    """BUGS 4: part A's decode rows use `window_left = W` instead of `W - 1`: one key too many on the left."""

    mutant_name = "mutant:window_left_W"
    bugs_row = 4

    def part_a(self, inputs):
        left = inputs.case.window[0]
        return part_a(inputs, window_left=left + 1 if left != -1 else -1)  # BUG: W, not W-1


class PartBRightExclusive(WindowedMutant):
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


class PartABlockEndAnchor(WindowedMutant):
    """BUGS 1: part A's decode rows all use `seq_len = L + K` (anchored at the block end, as plain decode
    rows are) instead of `L + i + 1`: early queries lose their left keys and see later ones twice."""

    mutant_name = "mutant:part_a_block_end_anchor"
    bugs_row = 1

    def part_a(self, inputs):
        K = inputs.case.block_size
        return part_a(inputs, lens=[L + K for L in inputs.context_lens_host for _ in range(K)])  # BUG


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


class MergeNanLastQuery(WindowedMutant):
    """BUGS 6 (and 9): part B of the last query (`i = K-1`) is empty and computed as `exp(-inf - -inf)`:
    NaN, which the merge's zero weight does not remove (0 * NaN = NaN)."""

    mutant_name = "mutant:merge_nan_last_query"
    bugs_row = 6

    def merge(self, inputs, o_a, lse_a, right):
        out, lse, pb = eager_merge_parts(inputs, o_a, lse_a.float() * LN2, right, part_b_fn=_part_b_unguarded)
        return out, lse / LN2, pb


class MergeOnCausal(WindowedMutant):
    """BUGS 6: the merge runs on causal layers too (`right == 0` is not tested): numerically harmless here
    (part B is empty, weight 0), but a kernel launched for nothing; only the call counters see it."""

    mutant_name = "mutant:merge_on_causal"
    bugs_row = 6

    def needs_merge(self, case):
        return case.block_size > 1  # BUG: ignores right == 0


class MergeSkippedUnbounded(WindowedMutant):
    """BUGS 6: the no-merge test is written `K == 1 or right <= 0`, so the unbounded right edge
    (`right == -1`, a non-causal unwindowed layer) skips the merge: later block keys are never seen."""

    mutant_name = "mutant:merge_skipped_unbounded"
    bugs_row = 6

    def needs_merge(self, case):
        return case.block_size > 1 and case.window[1] > 0  # BUG: -1 means unbounded, not "none"


# ---- BUGS 10 / 11 / 12: pages ------------------------------------------------------------------------------

class ContextReadToPageEnd(ContextMutant):
    """BUGS 10: the context read length `L + K` is rounded up to the end of the last page: the kernel
    reads the unused tail slots of the last page (canaries) as keys."""

    name = "mutant:context_read_to_page_end"
    bugs_row = 10

    def read(self, inputs):
        ps, K = inputs.case.page_size, inputs.case.block_size
        return context_read(inputs, kv_lens=[-(-(L + K) // ps) * ps for L in inputs.context_lens_host])  # BUG


class LastPageFromTableEnd(ContextMutant):
    """BUGS 10: the read takes the last (partial) page from `page_table[b, -1]`, assuming each row ends at
    its last used page: a request with fewer pages than the row is wide reads a page it does not use."""

    name = "mutant:last_page_from_table_end"
    bugs_row = 10

    def read(self, inputs):
        c = inputs.case
        table = inputs.page_table.clone()
        for b, L in enumerate(inputs.context_lens_host):
            table[b, pages_needed(L, c.block_size, c.page_size) - 1] = inputs.page_table[b, -1]  # BUG
        return context_read(inputs, table=table)


class AppendClampedPage0(ContextMutant):
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
                    val = (blk.float() / sc).to(pool.dtype) if pool.dtype == paged.FP8 else blk.to(pool.dtype)
                    if c.layout == "NHD":
                        pool[pid, t % c.page_size] = val
                    else:
                        pool[pid, :, t % c.page_size] = val
        counters.record("torch.paged_prefill", rows=c.batch_size * c.block_size)
        out, lse2 = self.read(inputs)
        return LoweringResult(out=out, lse=lse2)


class AppendPadsPageTail(ContextMutant):
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


class PageTableRowStride(ContextMutant):
    """BUGS 12: the kernel indexes the page table as a contiguous `[B, max_pages]` buffer (row stride =
    width), ignoring the real row stride of a strided row view: rows b >= 1 read padding as page ids."""

    name = "mutant:page_table_row_stride"
    bugs_row = 12

    def run(self, inputs):
        pt = inputs.page_table
        flat = torch.as_strided(pt, pt.shape, (pt.shape[1], 1), pt.storage_offset())  # BUG: assumes contiguous
        return super().run(Inputs(**{**vars(inputs), "page_table": flat}))


class PageTableAssumesInt32(ContextMutant):
    """BUGS 12: the read kernel takes the page table as int32 whatever its dtype: with int64 ids, column c
    reads the c-th 32-bit word (column 1 reads the high half of id 0, i.e. page 0)."""

    name = "mutant:page_table_assumes_int32"
    bugs_row = 12

    def read(self, inputs):
        pt = inputs.page_table
        return context_read(inputs, table=pt.view(torch.int32)[:, : pt.shape[1]])  # BUG: int64 read as int32


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


class ScaleHardcoded(ContextMutant):
    """BUGS 15: the softmax scale is hard-coded to `D ** -0.5` (the case's `scale` is ignored)."""

    name = "mutant:scale_hardcoded"
    bugs_row = 15

    def read(self, inputs):
        return context_read(inputs, scale=inputs.case.head_dim ** -0.5)  # BUG


class Fp8ScaleIgnored(ContextMutant):
    """BUGS 14: the fp8 KV dequant scales are not passed to the read kernel (taken as 1)."""

    name = "mutant:fp8_scale_ignored"
    bugs_row = 14

    def read(self, inputs):
        return context_read(inputs, k_scale=1.0, v_scale=1.0)  # BUG


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
    """`paged.attend` with `exp(s)` where it has `exp(s - max s)`: any score past 88.7 overflows to inf
    (inf / inf = NaN), a row whose scores all lie below -103 sums to 0 (0 / 0)."""
    N, M, Hq, D = q.shape
    Hkv = k.shape[2]
    qf = q.float().view(N, M, Hkv, Hq // Hkv, D)
    s = torch.einsum("nmhgd,nthd->nhgmt", qf, k.float()) * scale
    s = s.masked_fill(~mask.view(N, 1, 1, M, -1), float("-inf"))
    p = torch.exp(s)  # BUG: no max subtraction
    l = p.sum(dim=-1, keepdim=True)
    o = torch.einsum("nhgmt,nthd->nhgmd", p.to(q.dtype).float(), v.float()) / l
    lse = torch.log(l) * paged.LOG2E
    return (o.permute(0, 3, 1, 2, 4).reshape(N, M, Hq, D).to(q.dtype),
            lse.squeeze(-1).permute(0, 3, 1, 2).reshape(N, M, Hq))


class SoftmaxWithoutMax(ContextMutant):
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
        with mock.patch.object(paged, "attend", _attend_without_max):
            return context_read(inputs)


# ---- BUGS 18, 19, 8: inputs, determinism, compiles ---------------------------------------------------------

class ScalesQInPlace(ContextMutant):
    """BUGS 18: q is pre-scaled in place (`q *= scale`, kernel run with scale 1) and "restored" with
    `q /= scale`: in bf16/fp16 the round trip is exact only for power-of-two scales."""

    name = "mutant:scales_q_in_place"
    bugs_row = 18

    def read(self, inputs):
        sc = inputs.case.softmax_scale
        inputs.q.mul_(sc)  # BUG: the caller's tensor
        try:
            return context_read(inputs, scale=1.0)
        finally:
            inputs.q.div_(sc)


_calls = itertools.count()


class RacyOutput(ContextMutant):
    """BUGS 19: a race in the output write (split partials reduced in arrival order): which element loses
    the race changes from call to call, and that element is off by one bit. Each result alone is within
    tolerance; only running the same inputs again shows it."""

    name = "mutant:racy_output"
    bugs_row = 19

    def read(self, inputs):
        out, lse2 = context_read(inputs)
        out = out.clone()
        bits = out.view({2: torch.int16, 4: torch.int32}[out.element_size()]).view(-1)
        bits[next(_calls) % bits.numel()] ^= 1  # BUG: depends on the call, not on the inputs
        return out, lse2


def _merge_unrolled_static(q, k_block, v_block, o_a, lse_a, scale, right, lse_a_base):
    return _merge_unrolled(q, k_block, v_block, o_a, lse_a, scale, right, lse_a_base)


class RecompilePerBatch(WindowedMutant):
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


MUTANTS = (
    LseBaseNatural, LseConvertedTwice, LseBaseDeclaredNatural, WindowLeftW, PartBRightExclusive,
    ContextRightUnclipped, PartABlockEndAnchor, MergeNanLastQuery, MergeOnCausal, MergeSkippedUnbounded,
    ContextReadToPageEnd, LastPageFromTableEnd, AppendClampedPage0, AppendPadsPageTail, PageTableRowStride,
    PageTableAssumesInt32, GqaHeadModulo, ScaleHardcoded, Fp8ScaleIgnored, SilentFallbackContext,
    DispatchThresholdOffByOne, StatsSlabBRows, ScalesQInPlace, RacyOutput, RecompilePerBatch, SoftmaxWithoutMax,
    SplitWorkspaceWraps, LastSplitUnclamped, PositionsFp16, PositionsBf16, DispatchThresholdLow, Fp8ScalesSwapped,
    *EXTREME_MUTANTS,
)
# The production-scale mutants (issue 13, tests/production_mutants.py): caught by the default `ci` profile's
# draws and boundary cases (`strategies.check_cases`), tests/parity/test_production_mutants.py.
PRODUCTION_MUTANTS = (SplitWorkspaceWraps, LastSplitUnclamped, PositionsFp16, PositionsBf16, DispatchThresholdLow,
                      Fp8ScalesSwapped)


# The extremes' mutants (issue 47, tests/extreme_mutants.py): tests/parity/test_extreme_mutants.py.


def catalogue() -> dict[str, object]:
    """A fresh instance of every mutant, by name."""
    out = {}
    for cls in MUTANTS:
        m = cls()
        assert m.name.startswith("mutant:") and m.name not in out, m.name
        out[m.name] = m
    return out
