"""The draw of each field of a case, one strategy per field (`strategies._cases` draws a case from them,
`strategies._production` its production branch).

Boundary values come first in each list (`sampled_from`: hypothesis shrinks towards the start of the list);
the batch size and the lengths draw boundary values half the time but shrink as integers.
"""

from __future__ import annotations

import functools

from hypothesis import strategies as st

from lowerings.limits import HEAD_DIMS, Limits
from oracle.case import VALUE_REGIMES
from oracle.rules import DECODE_ROWS_MAX_BATCH

BLOCK_SIZES = (1, 2, 3, 4, 5, 6, 7, 8, 16)
GROUPS = (1, 2, 4, 3, 5, 6, 8)
KV_HEADS = (1, 2, 3)
PAGE_SIZES = (16, 1, 4, 32, 64, 2, 3)  # 3: not a power of two (lowerings that need one must say so)
FP8_SCALES = (0.5, 2.0, 0.25, 4.0)
DISPATCH_THRESHOLD = DECODE_ROWS_MAX_BATCH  # both sides of seed 002's dispatch are special batch sizes
WINDOW_KINDS = ("noncausal", "noncausal_swa", "causal", "causal_swa")


# The strategy builders below are cached: `strategies._cases` asks for them per draw (per request, for the
# lengths), and building a hypothesis strategy costs more than drawing from it (its validation walks the whole tree:
# 63% of a `gpu`-profile draw was building these, lab/bench_draw.py). A cached one draws the same choices.
@functools.lru_cache(maxsize=256)
def batch_sizes(limits: Limits = Limits()) -> st.SearchStrategy[int]:
    """Half the draws from 1, 2, the dispatch threshold and +1, the lowering's maximum, 3, 5; half any
    integer, listed first so that a batch size shrinks as an integer (one request at a time, to the
    smallest that still fails) rather than along the boundary list."""
    special = [b for b in (1, 2, DISPATCH_THRESHOLD, DISPATCH_THRESHOLD + 1, limits.max_batch, 3, 5) if b <= limits.max_batch]
    return st.one_of(st.integers(1, limits.max_batch), st.sampled_from(list(dict.fromkeys(special))))


@functools.lru_cache(maxsize=1024)
def context_length(page_size: int, window: int | None, limits: Limits = Limits()) -> st.SearchStrategy[int]:
    """Half the draws from 0, 1, page size +-1, page multiples, tile boundaries (64, 128, 2048 +-1), the
    window +-1; half any length (listed first: a length shrinks as an integer, to the shortest that still
    fails, not to the next boundary value above it)."""
    ps = page_size
    special = [0, 1, ps - 1, ps, ps + 1, 2 * ps, 63, 64, 65, 127, 128, 129, 2047, 2048, 2049]
    if window:
        special += [window - 1, window, window + 1]
    special = [x for x in dict.fromkeys(special) if 0 <= x <= limits.max_context]
    tail = st.integers(0, limits.max_context)
    return st.one_of(tail, st.sampled_from(special))


@functools.lru_cache(maxsize=64)
def windows(block_size: int) -> st.SearchStrategy[tuple[str, int | None]]:
    """(kind, W): W in {1, 2, K-1, K, K+1} first, then larger (beyond the context too)."""
    ws = [w for w in dict.fromkeys((1, 2, block_size - 1, block_size, block_size + 1)) if w >= 1]
    width = st.one_of(st.sampled_from(ws), st.integers(1, 64), st.integers(65, 4096))
    return st.one_of(st.just(("noncausal", None)),
                     st.tuples(st.sampled_from(("noncausal_swa", "causal", "causal_swa")), width))


VALUE_KEYS = st.integers(0, 2**16)


@functools.lru_cache(maxsize=1024)
def request_draws(page_size: int, window: int | None, limits: Limits) -> st.SearchStrategy[tuple[int, int]]:
    """One request's `(context length, value key)`, drawn together (one span: shrinking deletes both)."""
    return st.tuples(context_length(page_size, window, limits), VALUE_KEYS)


@functools.lru_cache(maxsize=256)
def value_regimes(limits: Limits = Limits()) -> st.SearchStrategy[str]:
    """The value regime: `plain` in half the cases (and first: shrinking moves towards it), else any other
    regime the limits allow, in `VALUE_REGIMES` order (plain left out there: with nine regimes, each other
    one kept a twelfth of the draws less than a plain second branch gives it)."""
    allowed = [r for r in VALUE_REGIMES if r in limits.values]
    if allowed[0] == "plain" and len(allowed) > 1:
        return st.one_of(st.just("plain"), st.sampled_from(allowed[1:]))
    return st.sampled_from(allowed)


@functools.lru_cache(maxsize=256)
def field_strategies(limits: Limits) -> dict[str, st.SearchStrategy]:
    """The strategy of each field `strategies._cases` draws directly, built once per `limits` (as `batch_sizes`
    above: a strategy built afresh in every draw is validated and labelled afresh; a cached one draws the
    same choices)."""
    return {
        "block_size": st.sampled_from([k for k in BLOCK_SIZES if k <= limits.max_block]),
        "num_kv_heads": st.sampled_from([h for h in KV_HEADS if h <= limits.max_kv_heads]),
        "group": st.sampled_from([x for x in GROUPS if x <= limits.max_group]),
        "head_dim": st.sampled_from(limits.head_dims),
        "page_size": st.sampled_from(PAGE_SIZES),
        "dtype": st.sampled_from(limits.dtypes),
        "kv_dtype": st.sampled_from(limits.kv_dtypes),
        "k_scale": st.sampled_from(FP8_SCALES),
        "v_scale": st.sampled_from(FP8_SCALES),
        "scale": st.one_of(st.none(), st.sampled_from((0.3, 0.05, 1.0))),
        "layout": st.sampled_from(("NHD", "HND")),
        "block_storage": st.sampled_from(("dense", "appended")),
        "page_table_dtype": st.sampled_from(("int32", "int64")),
        "page_table_pad": st.sampled_from((0, 3)),
        "spare_pages": st.integers(1, 3),
        "extra_pages": st.integers(0, 1),
        "perm_seed": st.integers(0, 2**16),
        "seed": st.integers(0, 2**16),
    }
