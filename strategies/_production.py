"""The production branch of the case draw: model rows, long ragged contexts, a per-case memory budget.

`cases()` draws a case either from the adversarial small shapes (`strategies._cases`) or, when the
limits turn the production dimension on (`Limits.max_production_context > 0`), from this branch:

- drawn after the small shape, whose fields it replaces: a model row of `lowerings.models` (heads,
  head dim, page size, layer kind, block size) among those the limits allow (`Limits.models`, head dims,
  block sizes), or, when none is allowed (CPU runs), one or two heads on the small shape's block, page
  size and window;
- a batch (`Limits.max_production_batch`) where one request is long and the others short, or all long;
  the long length is log-uniform up to `max_production_context`, mostly moved onto a boundary
  `2^k - 1, 2^k, 2^k + 1` (k = 11..17 at production lengths) of the context or of its keys `L + K`,
  optionally then so that `L + K` ends on a page boundary (+-1), or, for a windowed shape, onto the
  window's edge `W - 2 .. W + 1`; each request draws the key of its value streams with its length
  (`value_keys`, as in the small shapes);
- fp8 pools with `k_scale != v_scale`, and pools padded past 2**31 elements when
  `Limits.max_pool_elements` allows (the request's pages at the top of the pool: 64-bit offsets);
- then fitted to `Limits.max_case_bytes` (`oracle.footprint.run_bytes`): the long lengths shrink
  first, the pool padding next, the batch last.

Shrinking: the branch flag shrinks to the small shapes, a row to the first (smallest) one, the long
length to the shortest that fails (its boundary snap goes first, then its log-uniform integers: a bug
that starts at N keys shrinks to exactly N keys, boundary or not), `all long` to `one long`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from hypothesis import strategies as st

from lowerings.models import MODEL_NAMES, MODELS, ModelConfig
from oracle.case import pages_needed
from oracle.footprint import CPU_CASE_BYTES, CUDA_SHARE, CaseShape, device_case_bytes, run_bytes
from strategies._fields import KV_HEADS, VALUE_KEYS, batch_sizes, request_draws

LONG_FROM = 4097  # the second range of a long length: production contexts only
SNAPS = (None, 1, 0, -1)  # a long length moved to 2^k + snap (None: left where it was drawn)
PAGE_OFFSETS = (None, 0, -1, 1)  # then moved so that L + K ends on a page boundary + offset (None: not moved)
EDGE_OFFSETS = (None, 0, -1, 1, -2)  # a windowed shape's long length moved to W + offset (None: not moved)
FP8_SCALE_PAIRS = ((0.5, 2.0), (2.0, 0.25), (4.0, 0.5), (0.25, 4.0))  # k_scale != v_scale, powers of two
POOL_TARGETS = (2**31, 2**32)  # pool elements a padded pool passes (int32 offsets overflow past 2**31)
MAX_CASE_PAGES = 1 << 20  # pages a drawn case may list (its page lists are Python tuples)
# A draw is a production one unless `integers(0, PRODUCTION_ODDS)` gives 0: 2 in 3 nominally. hypothesis
# favours its simplest choices (0: the small shapes), so about half the cases come out production ones
# and a third to a half reach past 4096 keys (`scripts/draw_distribution.py`, docs/lab/production-scale.md).
PRODUCTION_ODDS = 2

# Defaults per device type, for limits fields left None (see `resolve`).
DEVICE_DEFAULTS: dict[str, dict[str, Any]] = {
    "cuda": dict(max_production_context=131072, max_production_batch=64, models=MODEL_NAMES, max_pool_elements=0),
    "cpu": dict(max_production_context=0, max_production_batch=2, models=(), max_pool_elements=0),
}
OFF = dict(max_production_context=0, max_production_batch=2, models=(), max_pool_elements=0)


def resolve(limits: Any, device: str | None, profile: Any = None) -> Any:
    """`limits` with every production field left None set: `profile.limits` first (a `Profile`'s
    defaults, e.g. `scale`'s), then `device`'s (`DEVICE_DEFAULTS`; `device=None`: the production
    dimension off), `max_case_bytes` the device's budget (`oracle.footprint.device_case_bytes`)."""
    dev = None if device is None else str(device).split(":")[0]
    defaults = dict(DEVICE_DEFAULTS.get(dev, OFF))
    share = getattr(profile, "case_share", None) or CUDA_SHARE
    defaults["max_case_bytes"] = device_case_bytes(dev, share) if dev else CPU_CASE_BYTES
    if dev == "cuda" and profile is not None:
        defaults.update(profile.limits)
    changes = {k: v for k, v in defaults.items() if getattr(limits, k) is None}
    return dataclasses.replace(limits, **changes) if changes else limits


def is_on(limits: Any) -> bool:
    return bool(limits.max_production_context)


def allowed_models(limits: Any) -> tuple[ModelConfig, ...]:
    """The rows the limits allow: named in `limits.models`, with a head dim and block size within them."""
    names = set(limits.models or ())
    return tuple(m for m in MODELS if m.name in names and m.head_dim in limits.head_dims
                 and m.block_size <= limits.max_block)


@st.composite
def long_length(draw: st.DrawFn, max_len: int, block_size: int, page_size: int, window: int | None = None) -> int:
    """The long request's context, in `[0, max_len]`: an integer drawn over the whole range or over its
    part past `LONG_FROM` keys (hypothesis draws a bounded integer's bit length first, so either is close
    to log-uniform: every octave about as likely); unless the snap drawn is None, moved onto the nearest
    power of two `2^k` as `2^k - 1, 2^k, 2^k + 1`, of the context or of its keys `L + K`; unless the page
    offset drawn is None, moved so that `L + K` ends on a page boundary (+-1); with a window of width
    `window`, unless the edge offset drawn (last) is None, moved to `W + offset` (`EDGE_OFFSETS`: the
    first query sees key 0 at `W - 1` and not at `W`), whatever the moves before.

    Shrinking: hypothesis shrinks towards the smallest choice sequence, so the snap and the page offset,
    drawn first, go first (None), then the range (the whole one), then the integer itself, by bisection:
    a bug that starts at N keys shrinks to exactly N, on a boundary or not; one that needs no long
    context, to the shortest context that fails."""
    snap = draw(st.sampled_from(SNAPS))
    of_keys = draw(st.booleans())
    page_offset = draw(st.sampled_from(PAGE_OFFSETS))
    L = draw(st.one_of(st.integers(0, max_len), st.integers(min(LONG_FROM, max_len), max_len)))
    if snap is not None:
        power = 1 << max(0, round(math.log2(max(L, 1))))
        L = power + snap - (block_size if of_keys else 0)
    L = max(0, min(max_len, align_to_page(max(0, L), block_size, page_size, page_offset)))
    edge = draw(st.sampled_from(EDGE_OFFSETS)) if window else None
    return L if edge is None else max(0, min(max_len, window + edge))


def align_to_page(L: int, block_size: int, page_size: int, offset: int | None) -> int:
    """`L` moved so that `L + K` ends on a page boundary plus `offset` (-1, 0, +1); None: unchanged."""
    if offset is None:
        return L
    keys = -(-(L + block_size) // page_size) * page_size + offset
    return max(0, keys - block_size)


@st.composite
def production_fields(draw: st.DrawFn, limits: Any, fixed: dict[str, Any], small: dict[str, Any]) -> dict[str, Any] | None:
    """None (the small shape `small` as drawn: a third of the cases nominally, and where shrinking goes), or
    the fields of a production draw that replace `small`'s (a field the caller fixed is never replaced).
    Besides the case's own fields: `pool_elements`, the size a padded pool must pass (0: no padding)."""
    if draw(st.integers(0, PRODUCTION_ODDS)) == 0:
        return None
    rows = allowed_models(limits)
    if rows:
        m = draw(st.sampled_from(rows))
        out = dict(num_kv_heads=m.num_kv_heads, group=m.group, head_dim=m.head_dim, page_size=m.page_size,
                   window=m.window, block_size=m.block_size)
    else:  # long contexts on one or two heads (a CPU run's oracle stays cheap); the small shape's K, page, window
        out = dict(num_kv_heads=draw(st.sampled_from([h for h in KV_HEADS[:2] if h <= limits.max_kv_heads])),
                   group=draw(st.sampled_from([g for g in (1, 2) if g <= limits.max_group])))
    out = {k: v for k, v in out.items() if k not in fixed}
    shape = {**small, **out}
    K, ps, window = shape["block_size"], shape["page_size"], shape["window"]
    if "batch_size" not in fixed:
        B = draw(batch_sizes(dataclasses.replace(limits, max_batch=limits.max_production_batch)))
    else:
        B = fixed["batch_size"]
    if "context_lens" not in fixed:
        top = limits.max_production_context
        L = draw(long_length(top, K, ps, window[1]))
        all_long = draw(st.booleans()) and B > 1
        at = draw(st.integers(0, B - 1))
        short = request_draws(ps, window[1], limits)
        # Each request draws the key of its value streams with its length, as the small shapes do
        # (strategies._cases): deleting a request leaves the others' values in place (oracle/values.py).
        reqs = [(L, draw(VALUE_KEYS)) if (all_long or b == at) else draw(short)
                for b in range(B)]
        out["context_lens"], out["value_keys"] = [n for n, _ in reqs], [k for _, k in reqs]
    if "k_scale" not in fixed and "v_scale" not in fixed:
        out["k_scale"], out["v_scale"] = draw(st.sampled_from(FP8_SCALE_PAIRS))
    targets = [0] + [t for t in POOL_TARGETS if t < (limits.max_pool_elements or 0)]
    out["pool_elements"] = draw(st.sampled_from(targets)) if len(targets) > 1 else 0
    return out


def _shape(p: dict[str, Any], lens: list[int], pad: int) -> CaseShape:
    """The page-less shape of the case `p` draws with contexts `lens` and `pad` leading spare pages (sized before
    it is built)."""
    K, ps = p["block_size"], p["page_size"]
    need = [pages_needed(L, K, ps) for L in lens]
    num_pages = sum(need) + p["extra_pages"] + p["spare_pages"] + pad
    return CaseShape(context_lens=tuple(lens), block_size=K, num_q_heads=p["num_kv_heads"] * p["group"],
                     num_kv_heads=p["num_kv_heads"], head_dim=p["head_dim"], page_size=ps, num_pages=num_pages,
                     max_pages_per_request=max(need) + p["extra_pages"],
                     dtype=p["dtype"], kv_dtype=p["kv_dtype"] if p["kv_dtype"] != "same" else p["dtype"],
                     page_table_dtype=p["page_table_dtype"], page_table_pad=p["page_table_pad"])


def pool_pad_pages(p: dict[str, Any], lens: list[int]) -> int:
    """Leading spare pages that take the pool just past `p['pool_elements']` elements (0: none)."""
    target = p.get("pool_elements") or 0
    if not target:
        return 0
    per_page = p["page_size"] * p["num_kv_heads"] * p["head_dim"]
    have = _shape(p, lens, 0).num_pages
    return max(0, target // per_page + 1 - have)


def fit_budget(p: dict[str, Any], limits: Any) -> dict[str, Any]:
    """`p` (a draw's parameters: a production one, or a small shape as wide as the limits allow) with its
    lengths, pool padding and batch cut until `oracle.footprint.run_bytes` fits `limits.max_case_bytes` and
    the case lists at most `MAX_CASE_PAGES` pages: the long requests shrink first (largest that fits), then
    the padding goes, then requests are dropped from the end (never the longest). Unchanged when it fits.
    Deterministic: shrinking still works."""
    budget = limits.max_case_bytes
    lens = list(p["context_lens"])
    keys = list(p.get("value_keys") or ())  # one per request (or none): dropped with its request

    def fits(ls: list[int], pad: int) -> bool:
        shape = _shape(p, ls, pad)
        return run_bytes(shape) <= budget and shape.num_pages - pad <= MAX_CASE_PAGES

    pad = pool_pad_pages(p, lens)
    if not fits(lens, pad):
        top = max(lens)
        longest = [b for b, L in enumerate(lens) if L == top]
        lo, hi = 0, top
        while lo < hi:  # the largest length of the long requests that fits
            mid = (lo + hi + 1) // 2
            trial = [mid if b in longest else min(L, mid) for b, L in enumerate(lens)]
            if fits(trial, pool_pad_pages(p, trial)):
                lo = mid
            else:
                hi = mid - 1
        lens = [lo if b in longest else min(L, lo) for b, L in enumerate(lens)]
        pad = pool_pad_pages(p, lens)
        if not fits(lens, pad):
            pad = 0
        keep = max(range(len(lens)), key=lambda b: lens[b])
        while len(lens) > 1 and not fits(lens, pad):
            drop = len(lens) - 1 if len(lens) - 1 != keep else len(lens) - 2
            lens.pop(drop)
            if keys:
                keys.pop(drop)
            keep = keep - 1 if drop < keep else keep
    return dict(p, context_lens=lens, value_keys=keys, pool_pad=pad)
