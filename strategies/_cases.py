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

import dataclasses
import functools
import random
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from oracle.rules import DECODE_ROWS_MAX_BATCH
from oracle.case import VALUE_REGIMES, Case, pages_needed, window_for
from lowerings import answers
from lowerings import calls as hooks
from strategies._extremes import PEAK_DRAWS, WIDE, WIDE_AT, validated_splits, widest_rows, with_peak
from strategies._production import fit_budget, is_on as production_is_on, production_fields, resolve

BLOCK_SIZES = (1, 2, 3, 4, 5, 6, 7, 8, 16)
GROUPS = (1, 2, 4, 3, 5, 6, 8)
KV_HEADS = (1, 2, 3)
HEAD_DIMS = (64, 128)
PAGE_SIZES = (16, 1, 4, 32, 64, 2, 3)  # 3: not a power of two (lowerings that need one must say so)
FP8_SCALES = (0.5, 2.0, 0.25, 4.0)
DISPATCH_THRESHOLD = DECODE_ROWS_MAX_BATCH  # both sides of seed 002's dispatch are special batch sizes
WINDOW_KINDS = ("noncausal", "noncausal_swa", "causal", "causal_swa")


@dataclass(frozen=True)
class Limits:
    """Bounds on the drawn shapes (a lowering may shrink them per device: interpreted Triton is slow). The
    `max_*`/`models` fields after `values` bound the production dimension (strategies._production);
    left None, `strategies.limits_for` sets them for the device (CUDA: contexts to 131072, every model
    row; CPU: off)."""

    max_batch: int = 33
    max_context: int = 300
    max_kv_heads: int = 3
    max_group: int = 8
    max_block: int = 16
    head_dims: tuple[int, ...] = HEAD_DIMS
    dtypes: tuple[str, ...] = ("bfloat16", "float16")
    kv_dtypes: tuple[str, ...] = ("same", "float8_e4m3fn")  # "same": the working dtype
    values: tuple[str, ...] = VALUE_REGIMES  # value regimes (oracle/values.py)
    # The production dimension (strategies._production); None: the device's default (`limits_for`).
    max_production_context: int | None = None  # the long requests' longest context; 0: no production draws
    max_production_batch: int | None = None
    models: tuple[str, ...] | None = None  # rows of strategies._models drawn; (): the small shapes' heads
    max_case_bytes: int | None = None  # oracle.footprint.run_bytes of a production draw stays under it
    max_pool_elements: int | None = None  # pools padded past 2**31 (2**32) elements when above it; 0: never

    def __post_init__(self) -> None:
        for name in ("max_batch", "max_kv_heads", "max_group", "max_block"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"Limits.{name}: a positive integer, got {v!r}")
        if not isinstance(self.max_context, int) or self.max_context < 0:
            raise ValueError(f"Limits.max_context: an integer >= 0, got {self.max_context!r}")
        for name, allowed in (("dtypes", LIMIT_DTYPES), ("kv_dtypes", LIMIT_KV_DTYPES), ("values", VALUE_REGIMES)):
            v = getattr(self, name)
            if not v or any(x not in allowed for x in v):
                raise ValueError(f"Limits.{name}: one or more of {', '.join(allowed)}, got {v!r}")
        if not self.head_dims or any(not isinstance(d, int) or d < 1 for d in self.head_dims):
            raise ValueError(f"Limits.head_dims: one or more positive integers, got {self.head_dims!r}")
        _validate_production(self)


def _validate_production(lim: "Limits") -> None:
    from strategies._models import MODEL_NAMES

    for name, least in (("max_production_context", 0), ("max_production_batch", 1), ("max_case_bytes", 1),
                        ("max_pool_elements", 0)):
        v = getattr(lim, name)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < least):
            raise ValueError(f"Limits.{name}: None (the device's default) or an integer >= {least}, got {v!r}")
    if lim.models is not None and (not isinstance(lim.models, tuple) or any(m not in MODEL_NAMES for m in lim.models)):
        raise ValueError(f"Limits.models: None (the device's default) or rows of strategies._models "
                         f"({', '.join(MODEL_NAMES)}), got {lim.models!r}")


LIMIT_DTYPES = ("bfloat16", "float16")
LIMIT_KV_DTYPES = ("same", "bfloat16", "float16", "float8_e4m3fn")


def limit_overrides(texts) -> dict[str, Any]:
    """`FIELD=VALUE[,VALUE...]` texts (the CLI's `--limit`, repeatable) -> `Limits` field overrides for
    `dataclasses.replace`, e.g. `dtypes=float16,bfloat16`, `head_dims=64`, `max_context=4096`,
    `max_production_context=16384`, `models=llama-3.1-8b-dflash` (`models=none`: no model rows). A bad one
    raises ValueError naming `--limit` and what is expected."""
    fields = {f.name: f.type for f in dataclasses.fields(Limits)}
    out: dict[str, Any] = {}
    for text in texts:
        name, sep, value = text.partition("=")
        if not sep or name not in fields:
            raise ValueError(f"--limit: expected FIELD=VALUE with FIELD one of {', '.join(fields)}, got {text!r}")
        parts = [x.strip() for x in value.split(",") if x.strip()]
        if not parts:
            raise ValueError(f"--limit {name}: no value given")
        if name.startswith("max_"):
            if len(parts) != 1 or not parts[0].isdigit():
                raise ValueError(f"--limit {name}: one non-negative integer, got {value!r}")
            out[name] = int(parts[0])
        elif name == "models":
            out[name] = () if parts == ["none"] else tuple(parts)
        elif name == "head_dims":
            if not all(x.isdigit() for x in parts):
                raise ValueError(f"--limit head_dims: positive integers separated by commas, got {value!r}")
            out[name] = tuple(int(x) for x in parts)
        else:
            out[name] = tuple(parts)
    try:
        dataclasses.replace(Limits(), **out)  # every value checked now, where the option is named
    except ValueError as err:
        raise ValueError(f"--limit: {err}") from None
    return out


def with_overrides(limits: "Limits | None", overrides: dict[str, Any]) -> "Limits | None":
    """`limits` (None: the defaults) with `limit_overrides`'s fields replaced; None if none given."""
    if not overrides:
        return limits
    return dataclasses.replace(limits or Limits(), **overrides)


# The strategy builders below are cached: `_case_params` asks for them per draw (per request, for the lengths),
# and building a hypothesis strategy costs more than drawing from it (its validation walks the whole tree:
# 63% of a `gpu`-profile draw was building these, scripts/bench_draw.py). A cached one draws the same choices.
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
    from lowerings.protocol import optional_attribute

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


@functools.lru_cache(maxsize=256)
def _field_strategies(limits: Limits) -> dict[str, st.SearchStrategy]:
    """The strategy of each field `_case_params` draws directly, built once per `limits` (as `batch_sizes`
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


@st.composite
def _case_params(draw: st.DrawFn, limits: Limits, fixed: dict[str, Any]) -> dict[str, Any]:
    strat = _field_strategies(limits)

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
