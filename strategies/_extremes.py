"""The extremes of the case space, drawn and run first: the most query rows per KV head, fp8 values across
e4m3fn's whole range, the attention mass on any one key, every window's edge.

A random draw reaches the corners of a space it samples field by field rarely (K x G = 16 x 8 was 1 draw
in 63); a bug that lives there is then found by luck. So each extreme is drawn on purpose in some cases and
is a boundary case of every check (`boundary_params`, run before the first random case whatever the seed;
`strategies._boundaries` adds them):

- rows: `widest_rows`, the largest block size and group the limits allow, drawn in about one small-shape
  case in six (`WIDE`: a flag drawn before K and G, which are drawn all the same, so that the choices stay
  aligned and the shrinker lowers the flag before it reaches theirs: a failure that needs K >= 2 still
  shrinks to K = 2; a flag drawn after them left it at 16 x 8, their unused choices gone to K = 1);
  boundary: those rows, the other side half the group;
- fp8 range: the `full_range` value regime (oracle/values.py: a pinned channel at +-448, a ladder of
  channel gains down to e4m3 subnormals), one of the regimes every case draws from; boundary: an fp8
  pool in `full_range`, the other side the same pool in `plain`;
- one heavy key: the `peak` regime, its key chosen per case by an anchor (`PEAK_ANCHORS`: the last
  context key, the last key, the first block key, a page's first or last key, a declared split
  boundary's either side, either side of the window's left edge, anywhere) and placed per request
  (`peak_keys`); boundaries: the last context key of the longest context the small shapes allow and of
  `L = 2^k, 2^k + 1` at production lengths (the other side one key shorter), both sides of the second
  page's first key, both sides of the lowering's first declared split (`split_boundaries`);
- window edges: a window of width `W` cuts a context at `L = W - 1 | W` (its first query sees key 0 or
  not) and `L = W - K | W - K + 1` (its last query). Boundaries: for each model row with a window, both
  pairs with the mass on key 0 (the `sink` regime), where one key more or less is the whole output;
  drawn: the production lengths snap to `W + (-2 .. 1)` (`strategies._production.long_length`), the small
  contexts to `W - 1, W, W + 1` (`strategies.context_length`).

Every other field of a boundary case is the simplest, as in `strategies._boundaries`.
"""

from __future__ import annotations

from typing import Any, Sequence

from hypothesis import strategies as st

from oracle.case import Case
from oracle.errors import InvalidInput
from strategies._production import allowed_models

PAGE = 16
POWER_EXPONENTS = (8, *range(11, 18))
# A draw's anchor for its heavy key, first the one shrinking lands on: the last context key.
PEAK_ANCHORS = ("context_end", "block_end", "block_start", "page_start", "page_end", "split_start", "split_end",
                "window_out", "window_in", "anywhere")
PEAK_DRAWS = st.tuples(st.sampled_from(PEAK_ANCHORS), st.integers(0, 2**16))
WIDE = st.integers(0, 5)  # == WIDE_AT: the widest rows (`widest_rows`)
WIDE_AT = 5


def widest_rows(limits: Any, block_sizes: Sequence[int], groups: Sequence[int]) -> tuple[int, int]:
    """`(K, G)`: the largest block size and group of `block_sizes`/`groups` within the limits."""
    return (max(k for k in block_sizes if k <= limits.max_block), max(g for g in groups if g <= limits.max_group))


def validated_splits(got: Any, case: Case, name: str) -> tuple[tuple[int, ...], ...]:
    """A lowering's `split_boundaries(case)` answer checked: one tuple of key positions per request, each
    in `(0, L_b + K)`; an `InvalidInput` naming the lowering otherwise."""
    where = f"lowering {name!r}: split_boundaries()"
    if not isinstance(got, (tuple, list)) or len(got) != case.batch_size:
        raise InvalidInput(where, f"one tuple of key positions per request ({case.batch_size}), got {got!r}")
    out = []
    for b, row in enumerate(got):
        keys = case.context_lens[b] + case.block_size
        if not isinstance(row, (tuple, list)) or any(not isinstance(t, int) or isinstance(t, bool) or not 0 < t < keys
                                                      for t in row):
            raise InvalidInput(where, f"request {b}: key positions t with 0 < t < L + K = {keys}, got {row!r}")
        out.append(tuple(row))
    return tuple(out)


def peak_position(anchor: str, case: Case, b: int, splits: Sequence[int] | None, u: int) -> int:
    """Request `b`'s heavy key under `anchor` (`PEAK_ANCHORS`), within its keys `0 .. L_b + K - 1`:
    `splits` are its declared split boundaries (None or none: a page's instead), `u` picks among several
    (`anywhere`: any key)."""
    L, K, ps = case.context_lens[b], case.block_size, case.page_size
    last = L + K - 1
    page = (max(L - 1, 0) // ps) * ps  # the first key of its last context page
    if anchor == "context_end":
        t = L - 1
    elif anchor == "block_end":
        t = last
    elif anchor == "block_start":
        t = L
    elif anchor in ("page_start", "page_end"):
        t = page - (anchor == "page_end")
    elif anchor in ("split_start", "split_end"):
        inner = [s for s in (splits or ()) if 0 < s <= last]
        t = (inner[u % len(inner)] if inner else page) - (anchor == "split_end")
    elif anchor in ("window_out", "window_in"):  # L - W: outside every query's window; + 1: inside the first's
        left = case.window[0]
        t = 0 if left < 0 else L - left - 1 + (anchor == "window_in")
    else:
        t = u % (last + 1)
    return min(max(t, 0), last)


def with_peak(case: Case, anchor: str, u: int, splits: tuple[tuple[int, ...], ...] | None) -> Case:
    """`case` with its `peak_keys` placed by `anchor` (`peak_position`), one per request."""
    keys = tuple(peak_position(anchor, case, b, splits[b] if splits else None, u) for b in range(case.batch_size))
    return case.replace(peak_keys=keys)


def _peak(p: dict[str, Any], L: int, t: int, **changes: Any) -> dict[str, Any]:
    return dict(p, context_lens=[L], values="peak", peak_keys=[t], **changes)


def boundary_params(base: dict[str, Any], limits: Any, block_sizes: Sequence[int], groups: Sequence[int],
                    splits_at: Any) -> list[tuple[dict[str, Any], str, dict[str, Any] | None]]:
    """`(params, label, other side's params)` of the extremes' boundary cases (module docstring), from the
    simplest `base`. `splits_at(params)`: the lowering's declared split boundaries of request 0 of that
    case (`()` when it declares none)."""
    out: list[tuple[dict[str, Any], str, dict[str, Any] | None]] = []
    K, G = widest_rows(limits, block_sizes, groups)
    rows = dict(base, block_size=K, group=G, context_lens=[PAGE + 1])
    out.append((rows, f"K x G = {K} x {G} = {K * G} query rows per KV head, the most the limits allow",
                dict(rows, group=max(1, G // 2)) if G > 1 else None))
    if "float8_e4m3fn" in limits.kv_dtypes and "full_range" in limits.values:
        fp8 = dict(base, kv_dtype="float8_e4m3fn", values="full_range", context_lens=[PAGE + 1])
        out.append((fp8, "fp8 stored values across e4m3fn's range: +-448 and subnormals (values full_range)",
                    dict(fp8, values="plain")))
    if "sink" in limits.values:
        out += _window_edges(base, limits)
    if "peak" not in limits.values:
        return out
    top = limits.max_context
    if top >= 1:
        out.append((_peak(base, top, top - 1), f"L = {top}, the longest small context, heaviest key at L - 1 (its "
                    f"last)", _peak(base, top - 1, top - 2) if top > 1 else None))
    for k in POWER_EXPONENTS:
        for L in (2**k, 2**k + 1):
            if L <= max(limits.max_context if k < 11 else 0, limits.max_production_context or 0) and L != top:
                out.append((_peak(base, L, L - 1), f"L = {L} = 2^{k}{' + 1' if L > 2**k else ''}, heaviest key "
                            f"at L - 1 (the last context key)", _peak(base, L - 1, L - 2)))
    if top >= 2 * PAGE:
        for t in (PAGE, PAGE - 1):
            out.append((_peak(base, 2 * PAGE, t), f"heaviest key {t}, the {'first' if t == PAGE else 'last'} slot of a "
                        f"page (page {PAGE}), L = {2 * PAGE}", _peak(base, 2 * PAGE, t - 1 if t == PAGE else t + 1)))
    longest = max(top, limits.max_production_context or 0)
    first = [t for t in splits_at(_peak(base, longest, 0)) if t < longest]
    if first:
        t = first[0]
        L = min(2 * t, longest) if t in splits_at(_peak(base, min(2 * t, longest), 0)) else longest
        out.append((_peak(base, L, t), f"heaviest key {t}, the first key of the second split the lowering "
                    f"declares (split_boundaries), L = {L}", _peak(base, L, t - 1)))
    return out


def _window_edges(base: dict[str, Any], limits: Any) -> list[tuple[dict[str, Any], str, dict[str, Any] | None]]:
    """Both edges of each windowed model row's window, the mass on key 0 (`sink`): at `L = W - K + 1` key 0
    is outside the last query's window only (at `W - K` inside every one); at `L = W` outside every query's
    (at `W - 1` inside the first's)."""
    out = []
    for m in allowed_models(limits):
        if m.window[1] is None:
            continue
        row = dict(base, num_kv_heads=m.num_kv_heads, group=m.group, head_dim=m.head_dim, page_size=m.page_size,
                   window=m.window, block_size=m.block_size, values="sink")
        W, K = m.window[1], m.block_size
        for L, who in ((W - K + 1, "the last query's window"), (W, "every query's window (the first's since L = W)")):
            if L >= 1:
                out.append((dict(row, context_lens=[L]), f"model row {m.name}: W = {W}, L = {L}, the heaviest key 0 "
                            f"just outside {who}", dict(row, context_lens=[L - 1])))
    return out
