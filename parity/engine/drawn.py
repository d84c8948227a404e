"""What a check drew, per lowering: histograms of the cases' context lengths, dtypes, KV dtypes, head
dims, how many pools passed 2**31 elements, and how far the draws reached the extremes of the case space.
`parity.json` keeps them under each lowering's `drawn`; `summary.md` shows them as two tables
(`parity.report.drawn_md`), so a run says whether it reached production scale and every extreme.

    "drawn": {"context": {BUCKET: n}, "dtype": {...}, "kv_dtype": {...}, "head_dim": {"64": n, ...},
              "pools_past_2^31": n, "extremes": {...}}

A case counts once, at its longest context `max_b L_b`, in the buckets `CONTEXT_BUCKETS`. `extremes`
(docs/report-schema.md), each figure read from the case specs alone (`extremes_of`):

- `fp8_stored_max`: the largest |stored| value an fp8 pool held by construction (`oracle.values.
  stored_fp8_peak`: 448 in a `full_range` case; 0 when no case placed one), and `fp8_subnormal_cases`: fp8
  cases whose regime stores e4m3 subnormals (`full_range`, `tiny`);
- `rows_per_kv_head_max`: the most query rows sharing a KV head (`K x G`), and `rows_per_kv_head_max_cases`:
  the cases that had that many;
- `heaviest_key`: the requests of `sink` and `peak` cases by the position of the key holding their
  attention mass, relative to their context length `L` (`heaviest_key_label`), and
  `heaviest_last_context_key_longest`: the longest context whose last key (`L - 1`) held it;
- `window_edges`: per window width `W` (`left + 1`), the cases with a request whose context ends just inside
  the window's edge (`W - K - 1 <= L <= W - 1`: its first query sees key 0, a later one may not) and just
  past it (`L` = `W` or `W + 1`: no query sees key 0).
"""

from __future__ import annotations

from typing import Any

from oracle.case import Case
from oracle.values import FP8, stored_fp8_peak

CONTEXT_BUCKETS = ((0, 0), (1, 127), (128, 2047), (2048, 4096), (4097, 32768), (32769, 131072))
LONG = 4096  # "long" in the summary: a context past this many keys
SHORT = {"bfloat16": "bf16", "float16": "fp16", "float8_e4m3fn": "fp8"}
POOL_KEY = "pools_past_2^31"
EXTREMES = "extremes"
SUBNORMAL_REGIMES = ("full_range", "tiny")
HEAVY_REGIMES = ("sink", "peak")
EDGE_SIDES = ("inside", "past")


def bucket(L: int) -> str:
    for lo, hi in CONTEXT_BUCKETS:
        if lo <= L <= hi:
            return str(lo) if lo == hi else f"{lo}-{hi}"
    return f">{CONTEXT_BUCKETS[-1][1]}"


def new_extremes() -> dict[str, Any]:
    return {"fp8_stored_max": 0.0, "fp8_subnormal_cases": 0, "rows_per_kv_head_max": 0, "rows_per_kv_head_max_cases": 0,
            "heaviest_key": {}, "heaviest_last_context_key_longest": 0, "window_edges": {}}


def new() -> dict[str, Any]:
    return {"context": {}, "dtype": {}, "kv_dtype": {}, "head_dim": {}, POOL_KEY: 0, EXTREMES: new_extremes()}


def heaviest_key_label(case: Case, b: int, t: int) -> str:
    """Where key `t` of request `b` sits: `0`, `L-2`, `L-1` (the last context key), `L` (the first block
    key), `L+K-1` (the last key), `block` (another block key), `page edge` (a page's first or last slot),
    `inside` (anywhere else in the context)."""
    L, K, ps = case.context_lens[b], case.block_size, case.page_size
    if t >= L:
        return "L" if t == L else "L+K-1" if t == L + K - 1 else "block"
    if t >= L - 2:
        return f"L-{L - t}"
    if t == 0:
        return "0"
    return "page edge" if ps > 1 and t % ps in (0, ps - 1) else "inside"


def extremes_of(case: Case) -> dict[str, Any]:
    """`case`'s own `extremes` entry (one case counted; merged with `add_into`)."""
    e = new_extremes()
    fp8 = case.kv_dtype == FP8
    e["fp8_stored_max"] = stored_fp8_peak(case) or 0.0
    e["fp8_subnormal_cases"] = int(fp8 and case.values in SUBNORMAL_REGIMES)
    e["rows_per_kv_head_max"], e["rows_per_kv_head_max_cases"] = case.block_size * case.group_size, 1
    if case.values in HEAVY_REGIMES:
        for b, L in enumerate(case.context_lens):
            if case.values == "sink" and not L:
                continue  # no context key: no sink
            t = 0 if case.values == "sink" else case.peak_key(b)
            label = heaviest_key_label(case, b, t)
            e["heaviest_key"][label] = e["heaviest_key"].get(label, 0) + 1
            if L and t == L - 1:
                e["heaviest_last_context_key_longest"] = max(e["heaviest_last_context_key_longest"], L)
    left = case.window[0]
    if left >= 0:
        W, K = left + 1, case.block_size
        sides = {"inside": int(any(W - K - 1 <= L <= W - 1 for L in case.context_lens)),
                 "past": int(any(W <= L <= W + 1 for L in case.context_lens))}
        if any(sides.values()):
            e["window_edges"][str(W)] = sides
    return e


def add_extremes(into: dict[str, Any], other: dict[str, Any]) -> None:
    """Fold one `extremes` entry into another (in place): maxima, counts, histograms."""
    for key in ("fp8_stored_max", "heaviest_last_context_key_longest"):
        into[key] = max(into.get(key, 0), other.get(key, 0))
    into["fp8_subnormal_cases"] = into.get("fp8_subnormal_cases", 0) + int(other.get("fp8_subnormal_cases", 0))
    mine, theirs = into.get("rows_per_kv_head_max", 0), other.get("rows_per_kv_head_max", 0)
    n = other.get("rows_per_kv_head_max_cases", 0)
    if theirs > mine:
        into["rows_per_kv_head_max"], into["rows_per_kv_head_max_cases"] = theirs, int(n)
    elif theirs == mine:
        into["rows_per_kv_head_max_cases"] = into.get("rows_per_kv_head_max_cases", 0) + int(n)
    hist = into.setdefault("heaviest_key", {})
    for label, k in (other.get("heaviest_key") or {}).items():
        hist[label] = hist.get(label, 0) + int(k)
    edges = into.setdefault("window_edges", {})
    for W, sides in (other.get("window_edges") or {}).items():
        mine_w = edges.setdefault(W, {side: 0 for side in EDGE_SIDES})
        for side, k in sides.items():
            mine_w[side] = mine_w.get(side, 0) + int(k)


def add(drawn: dict[str, Any], case: Case) -> None:
    """Count `case` into `drawn` (in place)."""
    for key, value in (("context", bucket(max(case.context_lens))), ("dtype", SHORT.get(case.dtype, case.dtype)),
                       ("kv_dtype", SHORT.get(case.kv_dtype, case.kv_dtype)), ("head_dim", str(case.head_dim))):
        drawn[key][value] = drawn[key].get(value, 0) + 1
    if case.num_pages * case.page_size * case.num_kv_heads * case.head_dim > 2**31:
        drawn[POOL_KEY] += 1
    add_extremes(drawn.setdefault(EXTREMES, new_extremes()), extremes_of(case))


def add_into(into: dict[str, Any], other: dict[str, Any]) -> None:
    """Fold one `drawn` entry into another (in place): histograms and counts add up, `extremes` merge
    (`add_extremes`)."""
    for key, counts in other.items():
        if key == POOL_KEY:
            into[key] = into.get(key, 0) + int(counts)
        elif key == EXTREMES:
            add_extremes(into.setdefault(EXTREMES, new_extremes()), counts)
        else:
            hist = into.setdefault(key, {})
            for value, n in counts.items():
                hist[value] = hist.get(value, 0) + int(n)


def merge(entries: list[dict[str, Any] | None]) -> dict[str, Any]:
    """The sum of several `drawn` entries (shards of one lowering); missing ones count as empty."""
    out = new()
    for d in entries:
        add_into(out, d or {})
    return out


def long_share(drawn: dict[str, Any]) -> tuple[int, int]:
    """`(cases with a context past LONG keys, cases)`."""
    ctx = drawn.get("context", {})
    total = sum(ctx.values())
    long = sum(n for b, n in ctx.items() if b.startswith(">") or int(b.split("-")[0]) > LONG)
    return long, total

