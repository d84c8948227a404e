"""Case builders and hypothesis strategies shared by the oracle tests (not a test module).

Pages are a random permutation of `range(num_pages)`, split into per-request lists of
`pages_needed(L, K, page_size)` (+ maybe one extra page); the rest of the pool is spare.
"""

from __future__ import annotations

import random

from hypothesis import strategies as st

from oracle import Case, pages_needed, window_for


def build_case(context_lens, block_size, num_kv_heads, group, head_dim, page_size, *, layout="NHD",
               window=(-1, -1), dtype="bfloat16", kv_dtype=None, k_scale=1.0, v_scale=1.0,
               block_storage="dense", scale=None, page_table_dtype="int32", page_table_pad=0, seed=0,
               page_seed=0, extra_pages=(), spare_pages=2) -> Case:
    """A valid case whose page assignment is a permutation of the pool drawn from `page_seed`.

    `extra_pages[b]` (default 0) extra pages for request `b` beyond what it needs; `spare_pages` pages
    no request owns.
    """
    context_lens = tuple(context_lens)
    B = len(context_lens)
    extra = tuple(extra_pages) + (0,) * (B - len(extra_pages))
    counts = [pages_needed(L, block_size, page_size) + extra[b] for b, L in enumerate(context_lens)]
    num_pages = sum(counts) + spare_pages
    perm = list(range(num_pages))
    random.Random(page_seed).shuffle(perm)
    pages, off = [], 0
    for n in counts:
        pages.append(tuple(perm[off:off + n]))
        off += n
    return Case(
        context_lens=context_lens, block_size=block_size, num_q_heads=num_kv_heads * group,
        num_kv_heads=num_kv_heads, head_dim=head_dim, page_size=page_size, pages=tuple(pages),
        num_pages=num_pages, layout=layout, window=tuple(window), scale=scale, dtype=dtype,
        kv_dtype=dtype if kv_dtype is None else kv_dtype, k_scale=k_scale, v_scale=v_scale,
        block_storage=block_storage, page_table_dtype=page_table_dtype, page_table_pad=page_table_pad,
        seed=seed,
    )


@st.composite
def windows(draw, K: int):
    """Windows of every kind of docs/semantics.md section 2 (W in 1..K+2) plus arbitrary (left, right)."""
    kind = draw(st.sampled_from(["noncausal", "causal", "noncausal_swa", "causal_swa", "raw"]))
    if kind in ("noncausal", "causal"):
        return window_for(kind)
    if kind == "raw":
        return (draw(st.integers(-1, K + 2)), draw(st.integers(-1, K + 2)))
    return window_for(kind, draw(st.integers(1, K + 2)))


@st.composite
def cases(draw, max_batch=4, max_ctx=40, max_block=8, head_dims=(8, 16, 64), max_group=5, max_kv_heads=3):
    B = draw(st.integers(1, max_batch))
    K = draw(st.integers(1, max_block))
    lens = tuple(draw(st.lists(st.one_of(st.just(0), st.integers(0, max_ctx)), min_size=B, max_size=B)))
    Hkv = draw(st.integers(1, max_kv_heads))
    G = draw(st.integers(1, max_group))
    D = draw(st.sampled_from(head_dims))
    ps = draw(st.sampled_from([1, 2, 4, 16]))
    dtype = draw(st.sampled_from(["bfloat16", "float16"]))
    fp8 = draw(st.booleans())
    if fp8:
        kv_dtype = "float8_e4m3fn"
        k_scale = draw(st.sampled_from([0.25, 0.5, 1.0, 2.0]))
        v_scale = draw(st.sampled_from([0.25, 0.5, 1.0, 2.0, 4.0]))
    else:
        kv_dtype, k_scale, v_scale = dtype, 1.0, 1.0
    return build_case(
        lens, K, Hkv, G, D, ps,
        layout=draw(st.sampled_from(["NHD", "HND"])),
        window=draw(windows(K)),
        dtype=dtype, kv_dtype=kv_dtype, k_scale=k_scale, v_scale=v_scale,
        block_storage=draw(st.sampled_from(["appended", "dense"])),
        scale=draw(st.one_of(st.none(), st.sampled_from([0.3, 0.125, 1.0]))),
        page_table_dtype=draw(st.sampled_from(["int32", "int64"])),
        page_table_pad=draw(st.sampled_from([0, 0, 3])),
        seed=draw(st.integers(0, 2**31 - 1)),
        page_seed=draw(st.integers(0, 2**31 - 1)),
        extra_pages=tuple(draw(st.lists(st.integers(0, 1), min_size=B, max_size=B))),
        spare_pages=draw(st.integers(0, 4)),
    )
