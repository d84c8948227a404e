"""Boundary cases: both sides of every boundary the design names, run first in every check whatever the seed.

A random draw reaches a boundary in most runs, not all (the decode-rows threshold B = 32 was drawn in 17
of 20 seeded `ci` runs). These cases are given to hypothesis as explicit examples (`Phase.explicit`),
so they run before the first random case of every run:

- the lowering's declared dispatch boundaries (`dispatch_boundaries()`, optional): for each value `t`,
  `t` and `t + 1` of its field: `batch_size` (B), `context_len` (L of one request), `keys` (its `L + K`);
- the extremes (`strategies._extremes`): the most query rows per KV head, an fp8 pool across e4m3fn's
  range, the attention mass on the last context key of the longest contexts, on a page's edge, on the
  lowering's first declared split boundary, and each windowed model row's window edges;
- powers of two: contexts `L = 2^k - 1, 2^k, 2^k + 1` for k = 8 and 11..17 with K = 1 (so `L + K` runs
  `2^k .. 2^k + 2`), up to the limits' `max_production_context` (k < 11: or `max_context`), and
  `L = 2^k + 1` once more under the tightest window (`W = 1`: query `p` sees key `p` only): fixed-size
  buffers, split-KV chunks and positions held in bf16 (exact to 2^8) or fp16 (to 2^11) break there. The
  other side of each is the case one key shorter;
- page multiples: `L + K` ending one slot before, exactly on, and one slot after a page boundary, with
  `K = 1` (the first page) and `K = 4` (the block straddling the second);
- the right window against the block: non-causal sliding windows `W = K - 1, K, K + 1` (`right = W - 1`
  against `K - 1`, the exactness bound of context FMHA), with the context past the window.

Every other field is the simplest one (what shrinking lands on): one KV head, group 1, the limits' first
head dim and dtype, 16-token pages, NHD, dense block storage, pages in order, plain values but for the
extremes that are values (request `b` keyed `b`: the requests of a batch hold different values). A case the lowering
cannot express is repaired like a drawn one (`strategies._cases.repair`), or left out (a window case:
its window is what it tests).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lowerings import calls as hooks
from oracle.case import Case
from strategies import _extremes
from strategies._cases import build_case, declared_splits, is_supported, repair
from strategies._extremes import PAGE, POWER_EXPONENTS
from strategies._fields import BLOCK_SIZES, GROUPS

DISPATCH_FIELDS = ("batch_size", "context_len", "keys")
WINDOW_K = 4
# POWER_EXPONENTS: L = 2^k - 1, 2^k, 2^k + 1 up to the limits' longest context: 2^8 and 2^11 bound the integers
# bf16 and fp16 hold exactly (positions), 2^11..2^17 the production lengths (buffers, split-KV chunks).
NO_WINDOW = ("noncausal", None)
TIGHT = ("noncausal_swa", 1)  # each query sees its own position only: a position off by one shows


def declared_boundaries(lowering: Any) -> dict[str, tuple[int, ...]]:
    """A lowering's `dispatch_boundaries()` (`{field: (t, ...)}`: its dispatch changes between `t` and
    `t + 1`), validated; `{}` when it declares none. A malformed declaration is that lowering's failure
    (`HookFailure`, "dispatch_boundaries() returned X, expected Y"), as a hook that raises is."""
    got = hooks.call_optional(lowering, "dispatch_boundaries", default={}, expect=_boundaries_answer)
    return {field: tuple(v) if isinstance(v, (tuple, list)) else (v,) for field, v in got.items()}


def _boundaries_answer(got: Any) -> str | None:
    """What is wrong with a `dispatch_boundaries()` answer (None: nothing)."""
    if not isinstance(got, dict):
        return f"a dict {{field: (int, ...)}} with fields in {DISPATCH_FIELDS}"
    for field, values in got.items():
        if field not in DISPATCH_FIELDS:
            return f"fields in {', '.join(DISPATCH_FIELDS)}, not {field!r}"
        vals = tuple(values) if isinstance(values, (tuple, list)) else (values,)
        least = 1 if field != "context_len" else 0
        if not vals or any(not isinstance(v, int) or isinstance(v, bool) or v < least for v in vals):
            return f"for {field}: one or more integers >= {least}, got {values!r:.100}"
    return None


def _offset(d: int) -> str:
    return "" if d == 0 else f" {'+' if d > 0 else '-'} {abs(d)}"


def _base(limits: Any) -> dict[str, Any]:
    return dict(context_lens=[0], block_size=1, num_kv_heads=1, group=1, head_dim=limits.head_dims[0],
                page_size=PAGE, window=("noncausal", None), dtype=limits.dtypes[0], kv_dtype="same", k_scale=1.0,
                v_scale=1.0, scale=None, layout="NHD", block_storage="dense", page_table_dtype="int32",
                page_table_pad=0, spare_pages=1, extra_pages=0, perm_seed=0, seed=0, values="plain")


def _keyed(p: dict[str, Any] | None) -> dict[str, Any] | None:
    """`p` with one value-stream key per request (case format 2, `oracle/values.py`): request `b` gets key
    `b`, so that the requests of a boundary batch hold different values (equal keys would give them
    equal ones, and a mix-up of requests would not show)."""
    return None if p is None else dict(p, value_keys=list(range(len(p["context_lens"]))))


@dataclass(frozen=True)
class Boundary:
    """One boundary case: `case`, what it sits on (`label`), and for a declared dispatch boundary or a
    power of two the case on the other side of it (`other_side`, the same but for the boundary value):
    when `case` fails and `other_side` passes, the failure needs this side of the boundary and `case`,
    every other field at its simplest, is the minimal case (`parity.engine.runner.check_lowering` reports it
    without a draw)."""

    case: Case
    label: str
    other_side: Case | None = None


def _dispatch_params(field: str, v: int, base: dict[str, Any]) -> dict[str, Any] | None:
    if field == "batch_size":
        return dict(base, context_lens=[0] * v)
    if field == "context_len":
        return dict(base, context_lens=[v])
    return dict(base, context_lens=[v - 1]) if v >= 1 else None  # keys: L + K = v with K = 1


def boundary_params(lowering: Any, limits: Any) -> list[tuple[dict[str, Any], str, dict[str, Any] | None]]:
    """`(params, label, other side's params or None)` of the boundary cases (module docstring), in order."""
    return [(_keyed(p), label, _keyed(other)) for p, label, other in _boundary_params(lowering, limits)]


def _boundary_params(lowering: Any, limits: Any) -> list[tuple[dict[str, Any], str, dict[str, Any] | None]]:
    base = _base(limits)
    out: list[tuple[dict[str, Any], str, dict[str, Any] | None]] = []
    for field, values in declared_boundaries(lowering).items():
        for t in values:
            low, high = _dispatch_params(field, t, base), _dispatch_params(field, t + 1, base)
            what = f"the declared dispatch boundary {field} {t} | {t + 1}"
            if low is not None:
                out.append((low, f"{field} = {t}, {what}", high))
            out.append((high, f"{field} = {t + 1}, {what}", low))

    def splits_at(p: dict[str, Any]) -> tuple[int, ...]:  # the lowering's split boundaries of request 0
        case = build_case(_keyed(p))
        return (declared_splits(lowering, case) or ((),))[0]

    # The extremes before the plain boundaries: a bug at one of them is then reported on its own boundary
    # case, whose other side (short of the extreme) passes, instead of on a plain case it shows in by chance.
    out += _extremes.boundary_params(base, limits, BLOCK_SIZES, GROUPS, splits_at)
    for k in POWER_EXPONENTS:  # contexts around 2^k, where the production dimension reaches them
        for L, window in ((2**k - 1, NO_WINDOW), (2**k, NO_WINDOW), (2**k + 1, NO_WINDOW), (2**k + 1, TIGHT)):
            if L <= max(limits.max_context if k < 11 else 0, limits.max_production_context or 0):
                what = "" if window == NO_WINDOW else f", window {window[0]} W = {window[1]}"
                out.append((dict(base, context_lens=[L], window=window),
                            f"L = {L} = 2^{k}{_offset(L - 2**k)}, K = 1{what}",
                            dict(base, context_lens=[L - 1], window=window)))
    k2 = min(WINDOW_K, limits.max_block)
    for K, pages in ((1, 1), (k2, 2)):
        for keys in (pages * PAGE - 1, pages * PAGE, pages * PAGE + 1):
            out.append((dict(base, block_size=K, context_lens=[keys - K]),
                        f"L + K = {keys} keys, page boundary{_offset(keys - pages * PAGE) or ' exactly'} (page {PAGE})", None))
    if k2 >= 2:
        for W in (k2 - 1, k2, k2 + 1):
            out.append((dict(base, block_size=k2, window=("noncausal_swa", W), context_lens=[2 * (k2 + 1)]),
                        f"window W = {W} against K = {k2} (right = W - 1 vs K - 1)", None))
    return out


def boundary_cases(lowering: Any, limits: Any) -> list[Boundary]:
    """The boundary cases `lowering` supports (repaired like drawn cases), distinct, in order."""
    def make(p: dict[str, Any] | None) -> Case | None:
        if p is None:
            return None
        return repair(p, lowering) if lowering is not None else build_case(p)

    seen: dict[str, Boundary] = {}
    for p, label, other in boundary_params(lowering, limits):
        if p["window"][0] == "noncausal_swa" and (p["block_size"] > 1 or p["values"] != "plain"):  # the window is
            # the point (the right window against the block, a model row's window edge): never repaired
            case = build_case(p)
            if lowering is not None and not is_supported(lowering, case):
                continue
        else:
            case = make(p)
        if case is not None:
            seen.setdefault(case.to_json(indent=None), Boundary(case, label, make(other)))
    return list(seen.values())
