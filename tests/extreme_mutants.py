"""The mutants of the case space's extremes (issue 47): each a context lowering right everywhere but at one
extreme the draws used to stop short of: fp8 stored values past 240, more than 64 query rows per KV head,
the last key of a long context, the key at a split boundary, the edge of a model row's 4096-key window.
Caught by the default `ci` check (its boundary cases run first; the window's with the model row on),
tests/parity/test_extreme_mutants.py. Part of the catalogue of `tests.mutants` (`EXTREME_MUTANTS`).

Not a test module (no `test_` prefix): import it as `tests.extreme_mutants`.
"""

from __future__ import annotations

from lowerings import paged
from lowerings.merges import LN2, merge_states
from oracle.case import Case
from oracle.inputs import Inputs
from tests.mutant_bases import ContextMutant, context_read
from tests.production_mutants import context_read_hooked

E4M3FNUZ_MAX = 240.0  # the largest value of AMD's fp8 (e4m3fnuz); e4m3fn's is 448
ROW_TILE = 64  # query rows per tile of the packed-GQA mutant
LONG_PATH = 4096  # contexts past this many keys take the long-context path of the last-key mutant
SPLIT = 2048  # keys per split of the split-KV mutant
WINDOW_PATH = 4096  # the window mutant's sliding-window path takes windows narrower than this


def _with(inputs: Inputs, **tensors) -> Inputs:
    return Inputs(**{**vars(inputs), **tensors})


class Fp8SaturatesAt240(ContextMutant):
    """BUGS 14: dequantizes the fp8 pool with e4m3fnuz's range (AMD's fp8, largest value 240) where the cache
    is e4m3fn's (448): a stored value past 240 saturates there. Right for every pool whose stored values stay
    within 240 (standard-normal ones reach a few units); a calibrated cache's largest ones come out short."""

    name = "mutant:fp8_saturates_at_240"
    bugs_row = 14

    def read(self, inputs):
        if inputs.k_pool.dtype != paged.FP8:
            return context_read(inputs)
        sat = lambda pool: pool.float().clamp(-E4M3FNUZ_MAX, E4M3FNUZ_MAX).to(pool.dtype)  # noqa: E731  BUG
        return context_read(_with(inputs, k_pool=sat(inputs.k_pool), v_pool=sat(inputs.v_pool)))


class RowsPast64(ContextMutant):
    """BUGS 7: packs the `K x G` query rows of a KV head (row `i * G + g`) into 64-row tiles and never advances
    the query pointer for the second tile: rows 64 and up are computed with the queries of rows 0 and up.
    Right up to 64 rows per KV head; wrong from 65 (K x G = 16 x 5 and more)."""

    name = "mutant:rows_past_64"
    bugs_row = 7

    def read(self, inputs):
        c = inputs.case
        B, K, Hq, D = inputs.q.shape
        Hkv, G = c.num_kv_heads, c.group_size
        R = K * G
        if R <= ROW_TILE:
            return context_read(inputs)
        rows = inputs.q.view(B, K, Hkv, G, D).permute(0, 2, 1, 3, 4).reshape(B, Hkv, R, D).clone()
        rows[:, :, ROW_TILE:] = rows[:, :, : R - ROW_TILE].clone()  # BUG: the second tile's queries
        q = rows.view(B, Hkv, K, G, D).permute(0, 2, 1, 3, 4).reshape(B, K, Hq, D).contiguous()
        return context_read(_with(inputs, q=q))


class DropsLastKeyPast4096(ContextMutant):
    """BUGS 10: the long-context path (contexts past 4096 keys) ends its last context tile one key early (an
    inclusive end read as exclusive): the last context key is never read. One key of thousands: invisible
    unless the attention mass sits on it. Right up to 4096 keys."""

    name = "mutant:drops_last_key_past_4096"
    bugs_row = 10

    def read(self, inputs):
        skip = [L - 1 if L > LONG_PATH else -1 for L in inputs.context_lens_host]  # BUG
        return context_read(inputs) if max(skip) < 0 else context_read_hooked(inputs, skip_key=skip)


class SplitEdgeKeyTwice(ContextMutant):
    """BUGS 9: split-KV over 2048-key splits (declared: `split_boundaries`), each split's partial in fp32 and
    merged in fp32; each split reads through the first key of the next (an inclusive end): the key at every
    split boundary is counted twice. The LSE moves by `log(1 + its share)`: nothing for one key of
    thousands, `ln 2` when it holds the mass. Right up to one split (2048 keys)."""

    name = "mutant:split_edge_key_twice"
    bugs_row = 9

    def split_boundaries(self, case: Case) -> tuple[tuple[int, ...], ...]:
        return tuple(tuple(range(SPLIT, L + case.block_size, SPLIT)) for L in case.context_lens)

    def read(self, inputs):
        keys = [L + inputs.case.block_size for L in inputs.context_lens_host]
        if max(keys) <= SPLIT:
            return context_read(inputs)
        B = len(keys)
        part = _with(inputs, q=inputs.q.float())  # partials in fp32
        o = lse = None
        for s in range(0, max(keys), SPLIT):
            o_s, lse2_s = context_read_hooked(part, first_key=[s] * B,
                                              read_lens=[min(s + SPLIT + 1, n) for n in keys])  # BUG: + 1
            o, lse = (o_s, lse2_s * LN2) if o is None else merge_states(o, lse, o_s, lse2_s * LN2)
        return o.to(inputs.q.dtype), lse / LN2


class WindowIgnoredFrom4096(ContextMutant):
    """BUGS 4: the sliding-window path takes windows narrower than 4096 keys (the longest context it was
    written for) and treats a wider one as no window: a model row's 4096-key window (MiniMax-M3.1 DSpark) is
    ignored. Right while every key is inside every query's window (`L <= W - K`); from `L = W - K + 1` the
    last query sees key 0, which it must not: one key of 4096, unless the mass sits on it."""

    name = "mutant:window_ignored_from_4096"
    bugs_row = 4

    def read(self, inputs):
        c = inputs.case
        if c.window[0] + 1 < WINDOW_PATH:
            return context_read(inputs)
        return paged.paged_attention(  # BUG: window_left=-1
            inputs.q, inputs.k_pool, inputs.v_pool, inputs.page_table,
            [L + c.block_size for L in inputs.context_lens_host], layout=c.layout, page_size=c.page_size,
            scale=c.softmax_scale, window_left=-1, causal=False, k_scale=c.k_scale, v_scale=c.v_scale)


EXTREME_MUTANTS = (Fp8SaturatesAt240, RowsPast64, DropsLastKeyPast4096, SplitEdgeKeyTwice, WindowIgnoredFrom4096)
