"""The shared, faithful copies of the correct torch lowerings the mutants are made of, one hook each
(`tests/parity/test_mutants.py` checks them bit-identical to the lowerings they copy).

Not a test module (no `test_` prefix): import it as `tests.mutant_bases`.
"""

from __future__ import annotations

from lowerings import counters, paged
from lowerings.merges import MERGE_FORMS, merge_eager, merge_states, merges_future_block_keys, part_b
from lowerings.protocol import BASE_2, BASE_E, LoweringResult, Partial
from lowerings.torch_emulation import Context, WindowedMerge, causal_decode_part_a, ensure_block_in_pool
from oracle.case import Case
from oracle.inputs import Inputs


def context_read(inputs: Inputs, *, table=None, kv_lens=None, scale=None, k_scale=None, v_scale=None):
    """Context.run's paged prefill read (no append, no counter), any argument overridable."""
    c = inputs.case
    return paged.paged_attention(
        inputs.q, inputs.k_pool, inputs.v_pool, inputs.page_table if table is None else table,
        kv_lens or [L + c.block_size for L in inputs.context_lens_host], layout=c.layout, page_size=c.page_size,
        scale=c.softmax_scale if scale is None else scale, window_left=c.window[0], causal=False,
        k_scale=c.k_scale if k_scale is None else k_scale, v_scale=c.v_scale if v_scale is None else v_scale)


class ContextMutant(Context):
    """Context with the read step split out: `run` = append, count, `read`."""

    def read(self, inputs: Inputs):
        return context_read(inputs)

    def run(self, inputs: Inputs) -> LoweringResult:
        c = inputs.case
        ensure_block_in_pool(inputs)
        counters.record("torch.paged_prefill", rows=c.batch_size * c.block_size)
        out, lse2 = self.read(inputs)
        return LoweringResult(out=out, lse=lse2)


def part_a(inputs: Inputs, *, lens=None, window_left=None):
    """`causal_decode_part_a` with its row lengths and window overridable."""
    c = inputs.case
    B, K, Hq, D = inputs.q.shape
    ensure_block_in_pool(inputs)
    counters.record("torch.paged_decode", rows=B * K)
    table = inputs.page_table.repeat_interleave(K, dim=0)
    lens = lens or [L + i + 1 for L in inputs.context_lens_host for i in range(K)]
    out, lse2 = paged.paged_attention(inputs.q.reshape(B * K, 1, Hq, D), inputs.k_pool, inputs.v_pool, table, lens,
                                       layout=c.layout, page_size=c.page_size, scale=c.softmax_scale,
                                       window_left=c.window[0] if window_left is None else window_left,
                                       k_scale=c.k_scale, v_scale=c.v_scale)
    return out.view(B, K, Hq, D), lse2.view(B, K, Hq)


class WindowedMutant(WindowedMerge):
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


def eager_merge_parts(inputs: Inputs, o_a, lse_a_nat, right: int, *, part_b_fn=part_b):
    """The eager merge's body on an already-natural part A LSE: (out, natural lse, part B Partial)."""
    c = inputs.case
    counters.record("torch.merge_eager")
    o_b, lse_b = part_b_fn(inputs.q, inputs.k_block, inputs.v_block, scale=c.softmax_scale, right=right)
    o, lse = merge_states(o_a, lse_a_nat, o_b, lse_b)
    return o.to(o_a.dtype), lse, Partial(out=o_b, lse=lse_b, lse_base=BASE_E, window=(-1, -1),
                                         future_block_keys_right=right)


