"""Hypothesis strategies for cases. They return `Case` specs, never tensors, so shrinking works on a
small spec and a failure replays from its JSON alone.

Every field is drawn boundary-first (`sampled_from` lists the boundary values first, and hypothesis
shrinks towards the start of the list), so a shrunk failure lands on a meaningful minimal case: batch
1, K 1, context 0 or a page boundary, the smallest window that still fails. The batch size and the
lengths draw boundary values half the time but shrink as integers, and each request draws the key of
its value streams with its length, so that a failure on one request's values shrinks to that request
and its shortest failing context (oracle/values.py). The extremes are drawn on purpose (`strategies.
_extremes`: the widest rows, the heavy key's place). A lowering's `supports()` shapes the draw: fields
it cannot express are repaired to a supported alternative before the case is built.
"""

from __future__ import annotations

import functools
import random
from typing import Any

from hypothesis import strategies as st

from lowerings import answers
from lowerings import calls as hooks
from lowerings.limits import HEAD_DIMS, Limits
from lowerings.protocol import optional_attribute
from oracle.case import Case, pages_needed, window_for
from strategies._extremes import PEAK_DRAWS, WIDE, WIDE_AT, validated_splits, widest_rows, with_peak
from strategies._fields import (BLOCK_SIZES, GROUPS, VALUE_KEYS, batch_sizes, field_strategies, request_draws,
                                value_regimes, windows)
from strategies._production import fit_budget, is_on as production_is_on, production_fields, resolve

@functools.lru_cache(maxsize=64)
def _pool_order(num_pages: int, perm_seed: int) -> tuple[int, ...]:
    """The pool's page ids permuted by `perm_seed` (0: in order). Cached: `repair` builds up to a few
    dozen candidates of one draw, mostly with the same pool."""
    ids = list(range(num_pages))
    if perm_seed:
        random.Random(perm_seed).shuffle(ids)
    return tuple(ids)


@functools.lru_cache(maxsize=16)
def _page_lists(need: tuple[int, ...], extra: tuple[int, ...], num_pages: int, pad: int, perm_seed: int
                ) -> tuple[tuple[int, ...], ...]:
    """Each request's pages: its share of the permuted pool in batch order. Cached: one draw's repairs build
    up to a dozen cases over the same page lists (and `oracle.case` then checks the list once)."""
    ids = [i + pad for i in _pool_order(num_pages - pad, perm_seed)] if pad else _pool_order(num_pages, perm_seed)
    pages, at = [], 0
    for n, e in zip(need, extra):
        pages.append(tuple(ids[at: at + n + e]))
        at += n + e
    return tuple(pages)


def build_case(p: dict[str, Any]) -> Case:
    """A `Case` from drawn primitive parameters (pages permuted by `p['perm_seed']`)."""
    kind, width = p["window"]
    window = window_for(kind, width) if kind != "causal" else window_for("causal")
    ps, K = p["page_size"], p["block_size"]
    need = [pages_needed(L, K, ps) for L in p["context_lens"]]
    extra = [p["extra_pages"] if b == 0 else 0 for b in range(len(need))]
    pad = p.get("pool_pad", 0)  # leading spare pages (a production draw's pool past 2**31 elements)
    num_pages = sum(need) + sum(extra) + p["spare_pages"] + pad
    pages = _page_lists(tuple(need), tuple(extra), num_pages, pad, p["perm_seed"])
    fp8 = p["kv_dtype"] == "float8_e4m3fn"
    return Case(
        context_lens=tuple(p["context_lens"]), block_size=K, num_q_heads=p["num_kv_heads"] * p["group"],
        num_kv_heads=p["num_kv_heads"], head_dim=p["head_dim"], page_size=ps, pages=tuple(pages),
        num_pages=num_pages, layout=p["layout"], window=window, scale=p["scale"], dtype=p["dtype"],
        kv_dtype=p["kv_dtype"] if fp8 else p["dtype"], k_scale=p["k_scale"] if fp8 else 1.0,
        v_scale=p["v_scale"] if fp8 else 1.0, block_storage=p["block_storage"],
        page_table_dtype=p["page_table_dtype"], page_table_pad=p["page_table_pad"], seed=p["seed"],
        values=p.get("values", "plain"), value_keys=tuple(p.get("value_keys", ())),
        peak_keys=tuple(p.get("peak_keys", ())))


# Alternatives tried, in order, when a lowering does not support a drawn value.
_REPAIRS: tuple[tuple[str, tuple[Any, ...]], ...] = (
    ("window", (("noncausal", None), ("causal", None))),
    ("layout", ("NHD", "HND")),
    ("page_size", (16, 32, 1, 4, 64)),
    ("head_dim", HEAD_DIMS),
    ("kv_dtype", ("same",)),
    ("block_storage", ("dense", "appended")),
    ("dtype", ("bfloat16", "float16")),
)


def is_supported(lowering: Any, case: Case) -> bool:
    """Whether `lowering` supports `case`, asked under the hook watchdog (`lowerings.calls.call`): a supports()
    that raises, exits or loops, or answers anything but None or a reason (`lowerings.answers.supports_answer`),
    raises HookFailure, which ends the lowering's check (not the run)."""
    return hooks.call(lowering, "supports", case, case=case, expect=answers.supports_answer) is None


def declared_splits(lowering: Any, case: Case) -> tuple[tuple[int, ...], ...] | None:
    """`lowering.split_boundaries(case)` (under the hook watchdog), validated; None when it declares none."""
    got = None if lowering is None else hooks.call_optional(lowering, "split_boundaries", case, case=case)
    return None if got is None else validated_splits(got, case, getattr(lowering, "name", repr(lowering)))


def place_peak(case: Case | None, p: dict[str, Any], lowering: Any) -> Case | None:
    """A `peak` case with its heavy keys placed by the drawn anchor `p['peak_anchor']`
    (`strategies._extremes.with_peak`), on the case as repaired; any other case as it is."""
    if case is None or case.values != "peak" or "peak_anchor" not in p:
        return case
    anchor, u = p["peak_anchor"]
    return with_peak(case, anchor, u, declared_splits(lowering, case) if anchor.startswith("split") else None)


def _candidates(p: dict[str, Any]):
    """The distinct repairs of `p` in the order they are tried (`_every_candidate`), each once: a later one equal to
    an earlier one (a pair whose one value is the field's own, a single's repeat) was refused already, as `supports()`
    answers the same case the same way."""
    seen = set()
    for q in _every_candidate(p):
        key = tuple(repr(q[k]) for k, _ in _REPAIRS)
        if key not in seen:
            seen.add(key)
            yield q


def _every_candidate(p: dict[str, Any]):
    """The repairs of `p` in the order they are tried: one field at a time (`_REPAIRS`), then two at once
    (e.g. window and page size) as a last resort."""
    for key, alternatives in _REPAIRS:
        for alt in alternatives:
            yield dict(p, **{key: alt})
    for key1, alts1 in _REPAIRS:
        for key2, alts2 in _REPAIRS:
            if key2 <= key1:
                continue
            for a1 in alts1:
                for a2 in alts2:
                    yield dict(p, **{key1: a1, key2: a2})


def repair(p: dict[str, Any], lowering: Any, refit: Any = None) -> Case | None:
    """The case of `p`, or of the first repair of it (`_candidates`) `lowering` supports; `refit(q)` (a
    production draw's budget, `strategies._production.fit_budget`) applies to each repaired candidate.

    Where the lowering declares `supports_by_shape` (`lowerings.protocol.OptionalHooks`), each candidate is
    asked with its pages in pool order (no permutation to compute) and only the accepted one is built with
    `p`'s permutation: the same case, since such a `supports` cannot tell the two apart. If the accepted
    one is refused with its own pages after all, the draw is repaired again the full way."""
    make = build_case if refit is None else (lambda q: build_case(refit(q)))
    case = build_case(p)
    if lowering is None or is_supported(lowering, case):
        return case
    if p.get("perm_seed") and optional_attribute(lowering, "supports_by_shape"):
        for q in _candidates(p):
            if is_supported(lowering, make(dict(q, perm_seed=0))):
                cand = make(q)
                if is_supported(lowering, cand):
                    return cand
                break  # its supports() read the page ids: the full repair below decides
        else:
            return None
    for q in _candidates(p):
        cand = make(q)
        if is_supported(lowering, cand):
            return cand
    return None


@st.composite
def _case_params(draw: st.DrawFn, limits: Limits, fixed: dict[str, Any]) -> dict[str, Any]:
    strat = field_strategies(limits)

    def pick(name: str, strategy: st.SearchStrategy | None = None) -> Any:
        return fixed[name] if name in fixed else draw(strat[name] if strategy is None else strategy)

    B = pick("batch_size", batch_sizes(limits))
    wide = not {"block_size", "group"} & set(fixed) and draw(WIDE) == WIDE_AT  # before K, G: `strategies._extremes`
    K = pick("block_size")
    hkv = pick("num_kv_heads")
    g = pick("group")
    if wide:
        K, g = widest_rows(limits, BLOCK_SIZES, GROUPS)
    D = pick("head_dim")
    ps = pick("page_size")
    window = pick("window", windows(K))
    width = window[1]
    # Each request draws its length and the key of its value streams together (one span), so that
    # shrinking can delete any request and keep every other one's values (oracle/values.py).
    reqs = ([(L, draw(VALUE_KEYS)) for L in fixed["context_lens"]] if fixed.get("context_lens") else
            [draw(request_draws(ps, width, limits)) for _ in range(B)])
    dtype = pick("dtype")
    kv = pick("kv_dtype")
    p = {
        "context_lens": [L for L, _ in reqs], "value_keys": [k for _, k in reqs],
        "block_size": K, "num_kv_heads": hkv, "group": g, "head_dim": D,
        "page_size": ps, "window": window, "dtype": dtype, "kv_dtype": kv,
        "k_scale": pick("k_scale"), "v_scale": pick("v_scale"),
        "scale": pick("scale"),
        "layout": pick("layout"),
        "block_storage": pick("block_storage"),
        "page_table_dtype": pick("page_table_dtype"),
        "page_table_pad": pick("page_table_pad"),
        "spare_pages": pick("spare_pages"),
        "extra_pages": pick("extra_pages"),
        "perm_seed": pick("perm_seed"),
        "seed": pick("seed"),
        "values": pick("values", value_regimes(limits)),
    }
    if p["values"] == "peak":  # where its heavy key goes (placed once the case is repaired: `place_peak`)
        p["peak_anchor"] = draw(PEAK_DRAWS)
    # The production dimension, drawn last: its fields replace the small shape's (never a field the caller
    # fixed), so shrinking its flag to "small" keeps every choice above and lands on the small case.
    prod = draw(production_fields(limits, fixed, p)) if production_is_on(limits) else None
    # Every draw fits the budget: a production one, and a small shape whose widest rows fill a full batch.
    return fit_budget({**p, **prod} if prod else p, limits)


def cases(lowering: Any = None, *, limits: Limits | None = None, **fixed: Any) -> st.SearchStrategy[Case]:
    """Valid cases (that `lowering` supports, when given), boundary values first.

    `limits` bounds the shapes (default `Limits()`; `strategies.limits_for(lowering, device)` gives what
    `check` draws under, the device's production defaults included; production fields left None here
    mean no production draws); keyword arguments fix fields (`block_size=7`, `window=("causal", None)`,
    `context_lens=[0, 17]`, `batch_size=32`, ...).
    """
    lim = resolve(limits or Limits(), None)  # production fields left None: off (limits_for sets a device's)
    unknown = set(fixed) - {"batch_size", "block_size", "num_kv_heads", "group", "head_dim", "page_size", "window",
                            "context_lens", "dtype", "kv_dtype", "k_scale", "v_scale", "scale", "layout",
                            "block_storage", "page_table_dtype", "page_table_pad", "spare_pages", "extra_pages",
                            "perm_seed", "seed", "values"}
    if unknown:
        raise ValueError(f"cases(): unknown field(s) {sorted(unknown)}")

    def refit(q: dict[str, Any]) -> dict[str, Any]:  # a repair may grow a case (fp8 to bf16): fit it again
        return fit_budget(q, lim)

    return _case_params(lim, fixed).map(lambda p: _placed(p, lowering, refit)).filter(lambda c: c is not None)


def _placed(p: dict[str, Any], lowering: Any, refit: Any) -> Case | None:
    """The repaired case of `p` with its heavy keys placed (`place_peak`), when `lowering` supports that very case:
    its `supports()` is asked of what runs, never only of the case before the placing."""
    case = repair(p, lowering, refit)
    placed = place_peak(case, p, lowering)
    if placed is not case and lowering is not None and not is_supported(lowering, placed):
        return None
    return placed
