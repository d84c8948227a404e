"""The case model: a frozen, validated, JSON-round-tripping description of one drafter-attention problem.

A `Case` is a spec, not tensors: `oracle.inputs.materialize(case, device)` builds the tensors from it
deterministically (the `seed` field drives every random value), so a case file alone reproduces a
failure. Meaning of every field: docs/semantics.md section 1.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
from dataclasses import dataclass, field
from typing import Any

from oracle.case_json import JSON_BOUNDS, check_json_fields, is_int, shown  # noqa: F401  (JSON_BOUNDS: re-exported)
from oracle.errors import InvalidInput

# Format 2: each request's values from streams of its own (oracle/values.py), `values`, `value_keys`.
# Format 3: format 2's fields and host-build values; the device build on CUDA draws each stream counter-based,
# a few kernel launches for the whole case (oracle/_device_values.py) instead of one per block of positions.
# Formats 1 (one generator for the whole batch) and 2 are still read and replay bit for bit.
CASE_FORMAT_VERSION = 3
READ_FORMAT_VERSIONS = (1, 2, 3)

DTYPES = ("bfloat16", "float16")
KV_DTYPES = ("bfloat16", "float16", "float8_e4m3fn")
LAYOUTS = ("NHD", "HND")
BLOCK_STORAGES = ("appended", "dense")
PAGE_TABLE_DTYPES = ("int32", "int64")
# Value regimes (oracle/values.py), plain first: strategies shrink towards it. `full_range` and `peak` (with the
# optional field `peak_keys`, written only when set) came after format 3: no earlier case holds them, so every
# saved case reads and replays as it did.
VALUE_REGIMES = ("plain", "large", "huge", "sink", "ties", "tiny", "outliers", "full_range", "peak")
# Window kinds of docs/semantics.md section 2, by (left, right).
UNBOUNDED = -1


def pages_needed(context_len: int, block_size: int, page_size: int) -> int:
    """Pages a request needs to hold its context plus its appended block (`ceil((L + K) / page_size)`)."""
    return -(-(context_len + block_size) // page_size)


def window_for(kind: str, width: int | None = None) -> tuple[int, int]:
    """The `(left, right)` window of a layer kind (docs/semantics.md section 2): `noncausal`, `noncausal_swa`,
    `causal`, `causal_swa`; the sliding kinds take the window width `W >= 1`."""
    if kind == "noncausal":
        return (UNBOUNDED, UNBOUNDED)
    if kind == "causal":
        return (UNBOUNDED, 0)
    if width is None or width < 1:
        raise InvalidInput("width", f"a sliding window needs an integer width W >= 1, got {width!r}")
    if kind == "noncausal_swa":
        return (width - 1, width - 1)
    if kind == "causal_swa":
        return (width - 1, 0)
    raise InvalidInput("kind", f"one of noncausal, noncausal_swa, causal, causal_swa; got {kind!r}")


class BatchShape:
    """Shape figures derived from `context_lens`, `block_size`, `num_q_heads` and `num_kv_heads`: shared by
    `Case` and the page-less `oracle.footprint.CaseShape` that sizes a draw before it is built."""

    context_lens: tuple[int, ...]
    block_size: int
    num_q_heads: int
    num_kv_heads: int

    @property
    def batch_size(self) -> int:
        return len(self.context_lens)

    @property
    def group_size(self) -> int:
        return self.num_q_heads // self.num_kv_heads

    @property
    def max_keys(self) -> int:
        """Longest key set in the batch, `max_b (L_b + K)`."""
        return max(self.context_lens) + self.block_size


@dataclass(frozen=True)
class Case(BatchShape):
    """One batch of drafter block-attention problems.

    Shapes follow docs/semantics.md: `B = len(context_lens)` requests, block size `K`, `Hq` query heads,
    `Hkv` KV heads (`Hq % Hkv == 0`), head dim `D`. `pages[b]` lists, in position order, the pool pages
    request `b` owns (enough for `L_b + K` tokens: the block may be appended); every other page of the
    `num_pages` pool is a spare page no request owns. `window = (left, right)` in inclusive key counts,
    -1 unbounded. `scale=None` means `D ** -0.5`. `k_scale`/`v_scale` dequantize an fp8 pool
    (value = stored * scale). `block_storage="appended"` means the block's K/V already sit in the pool at
    positions `L_b .. L_b+K-1`; `"dense"` means the pool holds the context only and the block comes as a
    dense `[B, K, Hkv, D]` suffix (a lowering that needs it in the pool appends it). `page_table_pad`
    extra columns make the table a strided row view of a wider buffer. `values` is the value regime
    (`VALUE_REGIMES`) and `value_keys[b]` the key of request `b`'s value streams (`()`: keyed by the
    request's index), so that a request keeps its values when others are removed (oracle/values.py).
    `peak_keys[b]` (regime `peak` only) is the position of the key that holds request `b`'s attention mass,
    clipped to its last key `L_b + K - 1` (`()`: each request's last context key, `peak_key`).
    """

    context_lens: tuple[int, ...]
    block_size: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    page_size: int
    pages: tuple[tuple[int, ...], ...]
    num_pages: int
    layout: str = "NHD"
    window: tuple[int, int] = (UNBOUNDED, UNBOUNDED)
    scale: float | None = None
    dtype: str = "bfloat16"
    kv_dtype: str = "bfloat16"
    k_scale: float = 1.0
    v_scale: float = 1.0
    block_storage: str = "dense"
    page_table_dtype: str = "int32"
    page_table_pad: int = 0
    seed: int = 0
    values: str = "plain"
    value_keys: tuple[int, ...] = ()
    version: int = CASE_FORMAT_VERSION
    peak_keys: tuple[int, ...] = ()

    # ---- derived (and BatchShape's batch_size, group_size, max_keys) ----------------------------------
    @property
    def softmax_scale(self) -> float:
        return self.head_dim ** -0.5 if self.scale is None else float(self.scale)

    @property
    def max_pages_per_request(self) -> int:
        return max((len(p) for p in self.pages), default=0)

    @property
    def is_causal(self) -> bool:
        return self.window[1] == 0

    @property
    def merges_future_block_keys(self) -> bool:
        """Whether any block key follows a query it is visible to (docs/semantics.md 4.3): false for `K == 1`
        or `right == 0`, where the causal decode alone is exact."""
        return self.block_size > 1 and self.window[1] != 0

    def peak_key(self, b: int) -> int:
        """The position of request `b`'s heaviest key in the `peak` regime: `peak_keys[b]` clipped to its
        last key, or (no `peak_keys`) its last context key `L_b - 1` (its first block key when `L_b = 0`)."""
        last = self.context_lens[b] + self.block_size - 1
        return min(self.peak_keys[b], last) if self.peak_keys else max(self.context_lens[b] - 1, 0)

    def spare_pages(self) -> tuple[int, ...]:
        owned = {p for row in self.pages for p in row}
        return tuple(p for p in range(self.num_pages) if p not in owned)

    # ---- validation ----------------------------------------------------------------------------------
    def __post_init__(self) -> None:
        # Normalise JSON lists into tuples so that equality and hashing are structural.
        object.__setattr__(self, "context_lens", tuple(self.context_lens))
        if not (type(self.pages) is tuple and all(type(r) is tuple for r in self.pages)):  # else kept as given
            object.__setattr__(self, "pages", tuple(tuple(r) for r in self.pages))
        object.__setattr__(self, "window", tuple(self.window))
        object.__setattr__(self, "value_keys", tuple(self.value_keys))
        object.__setattr__(self, "peak_keys", tuple(self.peak_keys))
        _validate(self)

    # ---- JSON ----------------------------------------------------------------------------------------
    def to_json_dict(self) -> dict[str, Any]:
        # Field by field, not `dataclasses.asdict`: that deep-copies every page id one by one (56K of them at
        # B = 55, L = 65K), 0.2 s per call at production scale; every field here is a plain value or a tuple.
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d["context_lens"] = list(self.context_lens)
        d["pages"] = [list(r) for r in self.pages]
        d["window"] = list(self.window)
        d["value_keys"] = list(self.value_keys)
        if self.peak_keys:
            d["peak_keys"] = list(self.peak_keys)
        else:  # optional: a case without it writes the file it always did
            del d["peak_keys"]
        if self.version == 1:  # a format 1 case stays a format 1 file
            del d["values"], d["value_keys"]
        return {"version": d.pop("version"), "batch_size": self.batch_size, **d}

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_json_dict(), indent=indent)

    @classmethod
    def from_json_dict(cls, data: Any, *, source: str = "case") -> "Case":
        if not isinstance(data, dict):
            raise InvalidInput(source, f"a case is a JSON object, got {type(data).__name__}")
        data = dict(data)
        version = data.pop("version", None)
        if version not in READ_FORMAT_VERSIONS or isinstance(version, bool):
            raise InvalidInput(f"{source}: version", f"this dflash-parity reads case formats "
                               f"{', '.join(map(str, READ_FORMAT_VERSIONS))}, got {version!r}")
        data["version"] = version
        batch_size = data.pop("batch_size", None)
        if batch_size is not None and not is_int(batch_size):
            raise InvalidInput(f"{source}: batch_size", f"an integer, got {shown(batch_size)}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise InvalidInput(f"{source}: {unknown[0]}", f"unknown case field; known fields: {', '.join(sorted(known - {'version'}))}")
        if version == 1 and {"values", "value_keys"} & set(data):
            raise InvalidInput(f"{source}: {sorted({'values', 'value_keys'} & set(data))[0]}",
                               "not a field of case format 1 (a version 2 or 3 case has it)")
        missing = sorted(f.name for f in dataclasses.fields(cls)
                         if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING and f.name not in data)
        if missing:
            raise InvalidInput(f"{source}: {missing[0]}", "required case field is missing")
        check_json_fields(data, source)
        try:
            case = cls(**data)
        except InvalidInput as err:
            raise InvalidInput(f"{source}: {err.where}", err.rule) from None
        if batch_size is not None and batch_size != case.batch_size:
            raise InvalidInput(f"{source}: batch_size", f"must equal len(context_lens) = {case.batch_size}, got {batch_size!r}")
        return case

    @classmethod
    def from_json(cls, text: str, *, source: str = "case") -> "Case":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise InvalidInput(source, f"not valid JSON ({err.msg} at line {err.lineno} column {err.colno})") from None
        except RecursionError:
            raise InvalidInput(source, "JSON nested too deeply (a case is an object of numbers, strings and "
                                       "lists of lists at most)") from None
        # A failure file wraps the case with its verdict; accept both.
        if isinstance(data, dict) and "case" in data and isinstance(data["case"], dict):
            data = data["case"]
        return cls.from_json_dict(data, source=source)

    def replace(self, **changes: Any) -> "Case":
        return dataclasses.replace(self, **changes)

    def short(self) -> str:
        """One line a reviewer can read: the shape-defining fields."""
        w = "" if self.window == (UNBOUNDED, UNBOUNDED) else f" window={self.window[0]},{self.window[1]}"
        kv = "" if self.kv_dtype == self.dtype else f" kv={self.kv_dtype}"
        return (f"B={self.batch_size} L={list(self.context_lens)} K={self.block_size} "
                f"heads={self.num_q_heads}/{self.num_kv_heads} D={self.head_dim} page={self.page_size} "
                f"{self.layout} {self.dtype}{kv}{w} {self.block_storage}"
                + ("" if self.values == "plain" else f" values={self.values}")
                + (f" peak_keys={list(self.peak_keys)}" if self.peak_keys else "")
                + (" (case format 1)" if self.version == 1 else ""))


_CHECKED_PAGES: dict[int, tuple[tuple, int]] = {}  # id(pages) -> (pages, num_pages) found valid (pages kept alive)


def _distinct_ids_in_pool(pages: tuple[tuple[int, ...], ...], num_pages: int) -> bool:
    """Whether every page id is a distinct int in `[0, num_pages)`. Remembered for the last few page lists
    by identity: a draw's repairs build up to a dozen cases over one page list (`strategies.build_case`
    reuses it), each a pass over up to ~10^6 ids."""
    seen = _CHECKED_PAGES.get(id(pages))
    if seen is not None and seen[0] is pages and seen[1] == num_pages:
        return True
    flat = list(itertools.chain.from_iterable(pages))
    ok = (set(map(type, flat)) <= {int} and (not flat or (min(flat) >= 0 and max(flat) < num_pages))
          and len(set(flat)) == len(flat))
    if ok:
        if len(_CHECKED_PAGES) >= 8:
            _CHECKED_PAGES.pop(next(iter(_CHECKED_PAGES)))
        _CHECKED_PAGES[id(pages)] = (pages, num_pages)
    return ok


def _plain_ints_in(values: tuple, lo: int, hi: int | None = None) -> bool:
    """Whether every value is a plain `int` in `[lo, hi)` (`hi` None: unbounded). True implies what `_validate`'s
    per-element loop checks (`is_int` and the range), so the loop, which builds a message per element, runs only
    where this is False, and then decides as it always did."""
    if hi is None:
        return all(type(v) is int and v >= lo for v in values)
    return all(type(v) is int and lo <= v < hi for v in values)


def _validate(c: Case) -> None:
    def need(ok: bool, where: str, rule: str) -> None:
        if not ok:
            raise InvalidInput(where, rule)

    for name in ("block_size", "num_q_heads", "num_kv_heads", "head_dim", "page_size", "num_pages"):
        v = getattr(c, name)
        need(is_int(v) and v >= 1, name, f"a positive integer, got {v!r}")
    need(len(c.context_lens) >= 1, "context_lens", "at least one request (batch size >= 1)")
    if not _plain_ints_in(c.context_lens, 0):  # the common case in one pass; the loop names a culprit
        for b, L in enumerate(c.context_lens):
            need(is_int(L) and L >= 0, f"context_lens[{b}]", f"a context length >= 0, got {L!r}")
    need(c.num_q_heads % c.num_kv_heads == 0, "num_q_heads",
         f"must be a multiple of num_kv_heads={c.num_kv_heads}, got {c.num_q_heads}")
    need(c.layout in LAYOUTS, "layout", f"one of {LAYOUTS}, got {c.layout!r}")
    need(c.dtype in DTYPES, "dtype", f"one of {DTYPES}, got {c.dtype!r}")
    need(c.kv_dtype in KV_DTYPES, "kv_dtype", f"one of {KV_DTYPES}, got {c.kv_dtype!r}")
    if c.kv_dtype != "float8_e4m3fn":
        need(c.kv_dtype == c.dtype, "kv_dtype", f"must equal dtype={c.dtype!r} unless it is float8_e4m3fn, got {c.kv_dtype!r}")
    for name in ("k_scale", "v_scale"):
        v = getattr(c, name)
        need(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0,
             name, f"a finite positive number, got {v!r}")
        if c.kv_dtype != "float8_e4m3fn":
            need(v == 1.0, name, f"must be 1.0 unless kv_dtype is float8_e4m3fn, got {v!r}")
    if c.scale is not None:
        need(isinstance(c.scale, (int, float)) and not isinstance(c.scale, bool) and math.isfinite(c.scale) and c.scale > 0,
             "scale", f"None (meaning head_dim ** -0.5) or a finite positive number, got {c.scale!r}")
    need(c.block_storage in BLOCK_STORAGES, "block_storage", f"one of {BLOCK_STORAGES}, got {c.block_storage!r}")
    need(c.page_table_dtype in PAGE_TABLE_DTYPES, "page_table_dtype", f"one of {PAGE_TABLE_DTYPES}, got {c.page_table_dtype!r}")
    need(is_int(c.page_table_pad) and c.page_table_pad >= 0, "page_table_pad", f"an integer >= 0, got {c.page_table_pad!r}")
    need(is_int(c.seed) and 0 <= c.seed < 2**63, "seed", f"an integer in [0, 2**63), got {c.seed!r}")
    need(c.values in VALUE_REGIMES, "values", f"one of {VALUE_REGIMES}, got {c.values!r}")
    need(c.value_keys == () or len(c.value_keys) == len(c.context_lens), "value_keys",
         f"empty (keyed by index) or one key per request ({len(c.context_lens)}), got {len(c.value_keys)}")
    if not _plain_ints_in(c.value_keys, 0, 2**63):
        for b, k in enumerate(c.value_keys):
            need(is_int(k) and 0 <= k < 2**63, f"value_keys[{b}]", f"an integer in [0, 2**63), got {k!r}")
    need(not c.peak_keys or (c.values == "peak" and len(c.peak_keys) == len(c.context_lens)), "peak_keys",
         f"empty, or with values='peak' one key position per request ({len(c.context_lens)}), got "
         f"{len(c.peak_keys)} with values={c.values!r}")
    if not _plain_ints_in(c.peak_keys, 0, 2**31):
        for b, t in enumerate(c.peak_keys):
            need(is_int(t) and 0 <= t < 2**31, f"peak_keys[{b}]", f"a key position in [0, 2**31), got {t!r}")
    need(c.version in READ_FORMAT_VERSIONS and not isinstance(c.version, bool), "version",
         f"one of {READ_FORMAT_VERSIONS}, got {c.version!r}")
    if c.version == 1:
        need(c.values == "plain" and c.value_keys == (), "version",
             "case format 1 has plain values and no value_keys (they are format 2 fields)")
    need(len(c.window) == 2 and all(is_int(w) and w >= -1 for w in c.window), "window",
         f"a pair (left, right) of integers >= -1 (-1 = unbounded), got {c.window!r}")
    need(len(c.pages) == len(c.context_lens), "pages",
         f"one page list per request: {len(c.context_lens)} requests, got {len(c.pages)} lists")
    # The common case (distinct int ids inside the pool) is checked at C speed; otherwise the loop below
    # finds the first culprit page and names it.
    pages_ok = _distinct_ids_in_pool(c.pages, c.num_pages)
    if pages_ok and all(len(row) >= pages_needed(L, c.block_size, c.page_size)
                        for row, L in zip(c.pages, c.context_lens)):
        return  # every request holds its pages: the loop below would raise nothing
    owner: dict[int, int] = {}
    for b, row in enumerate(c.pages):
        want = pages_needed(c.context_lens[b], c.block_size, c.page_size)
        need(len(row) >= want, f"pages[{b}]",
             f"request {b} holds L+K = {c.context_lens[b] + c.block_size} tokens and needs {want} pages of "
             f"{c.page_size}, got {len(row)}")
        if pages_ok:
            continue
        for p in row:  # messages built only on failure
            if not (is_int(p) and 0 <= p < c.num_pages):
                need(False, f"pages[{b}]", f"page ids must lie in the pool [0, num_pages={c.num_pages}), got {p!r}")
            if p in owner:
                need(False, f"pages[{b}]", f"page {p} is already owned by request {owner[p]}; pages never alias")
            owner[p] = b
