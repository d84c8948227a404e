"""The logical values of a case, one request at a time (case format 2; format 1 below).

Each request's values come from streams of its own, keyed by the case `seed` and the request's
identity: its `value_keys` entry (the strategies draw one per request, together with its length, so
that hypothesis deleting a request deletes its key and leaves the others' in place), or its index
when the case has no `value_keys`. Queries, context keys, context values, block keys and block values
are five streams per request; each is drawn by position (query index `i`, context position `t`, block
index `j`) in fixed blocks of positions (`position_blocks`: 16 positions each below 64, then four
blocks per octave), each block from a generator seeded by `(seed, request key, stream, block start)`.
So the values of a request never depend on the other requests, on its own context length (a shorter
context is a prefix of the longer one; in `peak`, but for the heavy key, which sits where the case's
`peak_keys` say), on the block size (a smaller block is a prefix), on pages, layout or block storage:
hypothesis shrinks a value-dependent failure like any other, deleting the other requests and shortening
this one down to its failing key. Requests with equal keys have equal values position by position
(hypothesis repeats drawn keys: 4.6 repeats per batch of 32 measured). A key derived from both key and
index would make requests always distinct, and removing one request would then move the others' values:
the shrink this module exists for.

The generators are torch's on the build device (mt19937 on the CPU, Philox on CUDA): a CPU build and
a CUDA device build draw different values, each deterministic; the blocks bound what one context
length wastes to a quarter of the positions (plus 15).

Regimes (`Case.values`) reshape the standard normals of a request, deterministically:
- `plain`: q, k, v standard normal.
- `large`: q scaled so that scores `scale * q.k` have standard deviation 2^7 (past 88, where a softmax
  without max subtraction overflows `exp` in fp32/bf16, in most rows).
- `huge`: q and k share a direction `u` (per request and KV head; q takes it with a random sign) and
  are scaled so that scores average +-2^14 (past 10^4), spread by `sqrt(3 / D)` of that. Scores
  this large are coherent, never a cancellation of larger terms: their fp32 error stays relative to
  the LSE (tolerances.toml `lse_rel`).
- `sink`: the key at position 0 (when `L >= 1`) shares a direction `s` (`|s|^2 = D`) with every
  query: its score exceeds the others' by 16 + 12 of their standard deviations, in every query, as
  attention sinks do.
- `ties`: every key is one shared vector `u` plus `2^-6` noise: near-tied scores, a flat softmax.
- `tiny`: q `2^-10 n`, k `2^-8 n` (the small ones fp16 subnormals), v `2^-12 (1 + n)` (`2^-8 (1 + n)`
  stored in an fp8 pool: e4m3 subnormals). v keeps a mean so that the output (the mean of a flat
  softmax) stays a normal fp16 number whatever the context length: an fp16 output below 2^-14 cannot
  hold the 1e-2 relative L2 bound (measured: 1.03e-2 at L = 58 with v at 2^-16).
- `outliers`: two channels (per request) of q, k and v multiplied by 8, as massive activations are.
- `full_range`: k and v across e4m3fn's whole range, as a calibrated fp8 KV cache holds them (per request and
  stream, `range_layout`): one channel pinned at +-448 (e4m3fn's largest value, a sign per KV head), the
  others a ladder of gains `2^-10 .. 2^7` over the channels in a random order (the lowest ones store e4m3
  subnormals, down to 2^-9, and zeros; the top one saturates at 448 past 3.5 standard deviations). q is
  scaled so that the scores (the pinned channel aside: the same for every key) have standard deviation
  `RANGE_SCORE_STD`. In a bf16/fp16 pool the same values (to 448: normal numbers there).
- `peak`: as `sink`, with the heavy key at `Case.peak_key(b)` (any position, a block key included) instead
  of position 0: the last key of a long context, a page or split boundary (the strategies choose it).
Every regime keeps q within fp16 range (multipliers <= 2^11) and every stored fp8 value within 448:
k and v are drawn in stored units and multiplied by `k_scale`/`v_scale` for an fp8 pool, as `plain`
always was, and the score targets divide by `k_scale` (`full_range` reaches 448 and saturates there).
"""

from __future__ import annotations

import hashlib
import math
import random
from dataclasses import dataclass
from typing import Iterator

import torch

from oracle.case import Case

FP8 = "float8_e4m3fn"
MIN_BLOCK = 16
SCORE_STD = {"large": 2.0 ** 7, "huge": 2.0 ** 14}  # huge: the mean score's magnitude (module docstring)
Q_MAX_GAIN = 2.0 ** 11   # q multipliers stay <= 2^11: |u + n| up to 16 stays below fp16's 65504
SINK_EXCESS, SINK_SIGMAS = 16.0, 12.0  # the sink's score over the others', plus 12 of their std devs
TIE_SPREAD = 2.0 ** -6
TINY = {"q": 2.0 ** -10, "k": 2.0 ** -8, "v": 2.0 ** -12, "v_fp8": 2.0 ** -8}
OUTLIER_GAIN, OUTLIER_CHANNELS = 8.0, 2
FP8_MAX = 448.0  # e4m3fn's largest finite value (its smallest subnormal: 2^-9, its smallest normal: 2^-6)
RANGE_EXPONENTS = (-10.0, 7.0)  # `full_range`: the ladder of channel gains, 2^lo .. 2^hi (stored units)
RANGE_SCORE_STD = 2.0


@dataclass
class RequestValues:
    """One request's logical values, fp32: `q [K, Hq, D]`, context `k, v [L, Hkv, D]`, block `kb, vb
    [K, Hkv, D]`; for an fp8 pool, k/kb and v/vb already carry `k_scale`/`v_scale` (value = stored * scale
    before rounding to fp8)."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    kb: torch.Tensor
    vb: torch.Tensor


def position_blocks(n: int) -> Iterator[tuple[int, int]]:
    """`(start, size)` of the blocks covering positions `[0, n)`: 16 positions each below 64, then
    `[2^k, 2^(k+1))` in four blocks of `2^(k-2)`. The last block may end past `n` (drawn whole, cut)."""
    start = 0
    while start < n:
        size = MIN_BLOCK if start < 64 else 1 << (start.bit_length() - 3)
        yield start, size
        start += size


def request_keys(case: Case) -> tuple[str, ...]:
    """The identity of each request's streams: `k<value key>`, or `i<index>` without `value_keys`."""
    if case.value_keys:
        return tuple(f"k{k}" for k in case.value_keys)
    return tuple(f"i{b}" for b in range(case.batch_size))


def stream_seed(seed: int, key: str, stream: str, start: int) -> int:
    """The 63-bit generator seed of one block of one stream of one request (platform independent)."""
    text = f"dflash-parity/values/2:{seed}:{key}:{stream}:{start}".encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little") >> 1


class _Streams:
    """The streams of one request on one device."""

    def __init__(self, seed: int, key: str, gen: torch.Generator, device: torch.device) -> None:
        self.seed, self.key, self.gen, self.device = seed, key, gen, device

    def normals(self, stream: str, n: int, tail: tuple[int, ...]) -> torch.Tensor:
        """Standard normals `[n, *tail]` fp32: row `t` depends on `(stream, t)` and `tail`, not on `n`."""
        out = torch.empty((n, *tail), device=self.device)
        for start, size in position_blocks(n):
            self.gen.manual_seed(stream_seed(self.seed, self.key, stream, start))
            if start + size <= n:
                out[start: start + size].normal_(generator=self.gen)
            else:
                out[start:] = torch.randn((size, *tail), generator=self.gen, device=self.device)[: n - start]
        return out

    def rng(self, stream: str) -> random.Random:
        return random.Random(stream_seed(self.seed, self.key, stream, 0))


def regime_gains(case: Case) -> tuple[float, float]:
    """`(q gain, k gain)` of the `large`/`huge` regimes ((1, 1) for the others): their product times
    `scale * k_scale` (fp8) times `sqrt(D)` (large: the standard deviation of `q.k`) or `D` (huge: `u.u`)
    is the target score; q's gain is capped, k takes the rest."""
    target = SCORE_STD.get(case.values)
    if target is None:
        return 1.0, 1.0
    k_eff = case.k_scale if case.kv_dtype == FP8 else 1.0
    D = case.head_dim
    need = target / (case.softmax_scale * (D if case.values == "huge" else math.sqrt(D)) * k_eff)
    a = min(Q_MAX_GAIN, need)
    return a, need / a


def sink_gain(case: Case) -> float:
    """The multiple of the sink direction added to key 0 (the queries get it once): an excess score of
    `SINK_EXCESS` plus `SINK_SIGMAS` standard deviations of the other keys' (`scale * k_scale * sqrt(2 D)`),
    enough to beat both their largest and the sink's own spread (`scale * k_scale * sqrt(D (2 + gain^2))`)."""
    k_eff = case.k_scale if case.kv_dtype == FP8 else 1.0
    D = case.head_dim
    return SINK_EXCESS / (case.softmax_scale * D * k_eff) + SINK_SIGMAS * math.sqrt(2.0 / D)


@dataclass(frozen=True)
class RangeLayout:
    """One stream's `full_range` layout: `gains[d]` (0 for the pinned channel) and `pinned[h][d]` (+-448 at
    the pinned channel of KV head `h`, else 0), in stored units: `stored = n * gains + pinned`."""

    gains: tuple[float, ...]
    pinned: tuple[tuple[float, ...], ...]


def range_layout(rng: random.Random, num_kv_heads: int, head_dim: int) -> RangeLayout:
    """A `full_range` stream's layout from `rng` (the request's `range` stream: k's layout, then v's): the
    channels in a random order, the first pinned at +-448 (a sign per KV head), the others on the ladder
    `RANGE_EXPONENTS` from the lowest gain to the highest."""
    D = head_dim
    order = rng.sample(range(D), D)
    lo, hi = RANGE_EXPONENTS
    gains = [0.0] * D
    for r, d in enumerate(order[1:]):
        gains[d] = 2.0 ** (lo + (hi - lo) * r / max(1, D - 2))
    signs = [rng.choice((-FP8_MAX, FP8_MAX)) for _ in range(num_kv_heads)]
    pinned = tuple(tuple(s if d == order[0] else 0.0 for d in range(D)) for s in signs)
    return RangeLayout(tuple(gains), pinned)


def range_layouts(case: Case, key: str) -> tuple[RangeLayout, RangeLayout]:
    """Request `key`'s `full_range` layouts of k and v (context and block alike)."""
    rng = random.Random(stream_seed(case.seed, key, "range", 0))
    return (range_layout(rng, case.num_kv_heads, case.head_dim), range_layout(rng, case.num_kv_heads, case.head_dim))


def range_q_gain(case: Case, layout: RangeLayout) -> float:
    """q's gain in `full_range`: the scores' standard deviation (the pinned channel aside) `RANGE_SCORE_STD`."""
    k_eff = case.k_scale if case.kv_dtype == FP8 else 1.0
    return RANGE_SCORE_STD / (case.softmax_scale * k_eff * math.sqrt(sum(g * g for g in layout.gains) or 1.0))


def stored_fp8_peak(case: Case) -> float | None:
    """The largest |stored| value an fp8 case's regime places in its pool by construction (`full_range`:
    448 in its pinned channels), None when that is a random draw's (a few units in the normal regimes) or
    the pool is not fp8."""
    return FP8_MAX if case.kv_dtype == FP8 and case.values == "full_range" else None


def _to_device(values: list, device: torch.device) -> torch.Tensor:
    """A few host numbers on `device` without waiting for the device (a blocking copy synchronizes with
    every kernel queued before it; the host list is read before the copy returns either way)."""
    return torch.tensor(values).to(device, non_blocking=True)


def request_values(case: Case, b: int, streams: _Streams) -> RequestValues:
    """Request `b`'s values in `case.values`'s regime (module docstring)."""
    c = case
    K, L, Hq, Hkv, D = c.block_size, c.context_lens[b], c.num_q_heads, c.num_kv_heads, c.head_dim
    q = streams.normals("q", K, (Hq, D))
    k, v = streams.normals("k", L, (Hkv, D)), streams.normals("v", L, (Hkv, D))
    kb, vb = streams.normals("kb", K, (Hkv, D)), streams.normals("vb", K, (Hkv, D))
    fp8 = c.kv_dtype == FP8
    r = c.values
    if r in SCORE_STD:
        a, g = regime_gains(c)
        if r == "huge":
            u = streams.normals("dir", 1, (Hkv, D))[0]
            sign = _to_device([streams.rng("sign").choice((-1.0, 1.0)) for _ in range(Hkv)], q.device)
            q.add_((u * sign.view(-1, 1)).repeat_interleave(c.group_size, dim=0))
            k.add_(u), kb.add_(u)
        q.mul_(a)
        k.mul_(g), kb.mul_(g)
    elif r in ("sink", "peak"):
        s = streams.normals(r, 1, (Hkv, D))[0]
        s.mul_(math.sqrt(D) / s.norm(dim=-1, keepdim=True))
        q.add_(s.repeat_interleave(c.group_size, dim=0))
        t = 0 if r == "sink" else c.peak_key(b)
        if t < L:
            k[t].add_(s * sink_gain(c))
        elif r == "peak":
            kb[t - L].add_(s * sink_gain(c))
    elif r == "full_range":
        layouts = range_layouts(c, streams.key)
        for x, xb, lay in zip((k, v), (kb, vb), layouts):
            a, pin = _to_device(list(lay.gains), q.device), _to_device([list(p) for p in lay.pinned], q.device)
            x.mul_(a).add_(pin), xb.mul_(a).add_(pin)
        q.mul_(range_q_gain(c, layouts[0]))
    elif r == "ties":
        u = streams.normals("tie", 1, (Hkv, D))[0]
        k.mul_(TIE_SPREAD).add_(u), kb.mul_(TIE_SPREAD).add_(u)
    elif r == "tiny":
        q.mul_(TINY["q"])
        k.mul_(TINY["k"]), kb.mul_(TINY["k"])
        tv = TINY["v_fp8"] if fp8 else TINY["v"]
        v.add_(1.0).mul_(tv), vb.add_(1.0).mul_(tv)
    elif r == "outliers":
        ch = _to_device(sorted(streams.rng("outliers").sample(range(D), min(OUTLIER_CHANNELS, D))), q.device)
        for x in (q, k, v, kb, vb):
            x[..., ch] *= OUTLIER_GAIN
    if fp8:
        k.mul_(c.k_scale), kb.mul_(c.k_scale)
        v.mul_(c.v_scale), vb.mul_(c.v_scale)
    return RequestValues(q, k, v, kb, vb)


def case_values(case: Case, device: torch.device, *, host_order: bool = True) -> Iterator[RequestValues]:
    """Every request's values in batch order, drawn on `device` (format 2; format 1 for a version 1 case,
    in the draw order of the host build or, `host_order=False`, of the device build)."""
    if case.version == 1:
        yield from _format1_values(case, device, host_order)
        return
    gen = torch.Generator(device=device)
    for b, key in enumerate(request_keys(case)):
        yield request_values(case, b, _Streams(case.seed, key, gen, device))


def _format1_values(case: Case, device: torch.device, host_order: bool) -> Iterator[RequestValues]:
    """Case format 1, kept so that its saved cases replay bit for bit: one generator seeded by `seed`
    for the whole batch. The host build's order: all queries, all context keys (in batch order), all
    context values, the block keys, the block values; the device build's: queries, block keys, block
    values, then per request its context keys and values."""
    c = case
    B, K, Hq, Hkv, D = c.batch_size, c.block_size, c.num_q_heads, c.num_kv_heads, c.head_dim
    fp8 = c.kv_dtype == FP8
    gen = torch.Generator(device=device).manual_seed(c.seed)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=gen, device=device)

    ks, vs = (c.k_scale, c.v_scale) if fp8 else (1.0, 1.0)
    if host_order:
        total = sum(c.context_lens)
        q, k_ctx, v_ctx, k_blk, v_blk = (randn(B, K, Hq, D), randn(total, Hkv, D), randn(total, Hkv, D),
                                         randn(B, K, Hkv, D), randn(B, K, Hkv, D))
        if fp8:
            k_ctx, v_ctx, k_blk, v_blk = k_ctx * ks, v_ctx * vs, k_blk * ks, v_blk * vs
        off = 0
        for b, L in enumerate(c.context_lens):
            yield RequestValues(q[b], k_ctx[off: off + L], v_ctx[off: off + L], k_blk[b], v_blk[b])
            off += L
        return
    q, k_blk, v_blk = randn(B, K, Hq, D), randn(B, K, Hkv, D), randn(B, K, Hkv, D)
    if fp8:
        k_blk, v_blk = k_blk * ks, v_blk * vs
    for b, L in enumerate(c.context_lens):
        if L:
            k = randn(L, Hkv, D)
            k = k * ks if fp8 else k
            v = randn(L, Hkv, D)
            v = v * vs if fp8 else v
        else:
            k = v = torch.empty((0, Hkv, D), device=device)
        yield RequestValues(q[b], k, v, k_blk[b], v_blk[b])
