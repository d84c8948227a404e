"""Case format 3's device build: every request's streams in a handful of kernel launches.

Format 2's device build (`oracle.values`) draws each block of positions of each stream of each request with
its own generator call: about 1,300 launches for a mean `gpu`-profile case (B up to 64, contexts to 128K;
counted from the blocks of 338 drawn cases of `context[flashinfer-fa2]`, seed 3, on the CPU),
which made building a case's tensors the largest host cost of a GPU case (about 40% of it,
docs/gpu/2026-12-02-h200-session11.md). Format 3 keeps format 2's values in the host build (and
so on the CPU) and draws the device build counter-based: the standard normal of element `e` (`h * D + d`)
of position `t` of a stream is Philox keyed by the stream's seed (`oracle.values.stream_seed(seed,
request key, stream, 0)`) at counter `t * H * D + e` (`oracle._values_kernel`). So, as in format 2, a
request's values depend on its key and position only (shrinking deletes requests and shortens contexts
without moving the others' values), the pages, layout and block storage change where they sit, never what
they are, and the values are deterministic on their device type.

The regimes of `oracle.values` keep their meaning, each as an affine map of the normals per request:
`x = n * a[d] + c[h, d]` (and `+ s[h, d]` at one position per request: context position 0 for the sink, the
peak key for `peak`, in the context or the block), with the same gains, directions (their own streams: `dir`,
`sink`, `tie`, `peak`), signs, outlier channels and `full_range` layouts. An fp8 pool's k and v are
drawn in stored units (`value = stored * k_scale`), as in format 2; the dense block holds the values the
fp8 pool represents.

On a CPU (tests) the kernel runs under Triton's interpreter, whose fp32-to-fp8 conversion (triton 3.x) halves a
value that rounds up into the next binade (0.498 is stored as 0.25, not 0.5; 2.7% of standard normals): the
CPU's format 3 fp8 values differ from the GPU's there. Every consumer reads the same stored values, so no
check is affected; the tests compare builds with each other, never with fixed digests.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import torch

from oracle.case import Case
from oracle.dtypes import interpreting, page_table_int32
from oracle.errors import InvalidInput
from oracle.values import (FP8, OUTLIER_CHANNELS, OUTLIER_GAIN, SCORE_STD, TIE_SPREAD, TINY, range_layouts,
                           range_q_gain, regime_gains, request_keys, sink_gain, stream_seed)

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
BLOCK_T = 16
BLOCK_E = 256  # one tile shape for every row size (H * D): one compile per dtype and regime class
# On a CPU the kernel runs under Triton's interpreter, whose cost is per program, not per element: 128 positions a
# program there. A value depends on its seed, position and element only, never on the tile (`_values_kernel`).
BLOCK_T_INTERPRETED = 128
STREAMS = ("q", "k", "v", "kb", "vb")


def _on(device: torch.device, values: list, dtype: torch.dtype) -> torch.Tensor:
    """Host numbers on `device` without waiting for the kernels queued there (`oracle.values._to_device`)."""
    return torch.tensor(values, dtype=dtype).to(device, non_blocking=True)


_UNREAD: dict[torch.device, torch.Tensor] = {}


def _unread_fp32(device: torch.device) -> torch.Tensor:
    """One fp32 element on `device`, passed for an affine pointer the kernel does not read. Passing the seeds
    (int64) there made each combination of present and absent maps its own kernel signature, so its own
    Triton compile (20 variants of `stream_kernel` where one per dtype and regime class is due)."""
    z = _UNREAD.get(device)
    if z is None:
        z = _UNREAD[device] = torch.zeros(1, dtype=torch.float32, device=device)
    return z


class _Affine:
    """`a [B, D]` and `c [B, H, D]` fp32 of one stream (None: 1 and 0), `s [B, H, D]` (None: no sink) added at
    position `pos [B]` int32 of each request (-1: none)."""

    def __init__(self, a=None, c=None, s=None, pos=None) -> None:
        self.a, self.c, self.s, self.pos = a, c, s, pos


@dataclass(frozen=True)
class _Paged:
    """Where a launch writes a pool: through `table [B, pages]` int32, `page_size` slots a page, `layout` NHD
    (`[pages, page_size, H, D]`) or HND (`[pages, H, page_size, D]`)."""

    table: torch.Tensor
    page_size: int
    layout: str

    def strides(self, heads: int, D: int) -> tuple[int, int, int]:
        """Elements between pages, slots and heads of the pool."""
        HD = heads * D
        if self.layout == "NHD":
            return (self.page_size * HD, HD, D)
        return (HD * self.page_size, D, self.page_size * D)


def _launch(dst: torch.Tensor, seeds: torch.Tensor, lens: torch.Tensor, longest: int, heads: int, D: int,
            aff: _Affine, *, paged: _Paged | None = None, clamp: bool = False) -> None:
    """Fill `dst` (a pool through `paged`, or dense `[B, rows, H, D]`) with the streams of `seeds [B]`, `lens [B]`
    int32 positions each (`longest` the most); `clamp`: to fp8's range (an fp8 pool)."""
    from oracle import _values_kernel as vk  # imports triton: only where a format 3 device build runs

    if dst.device.type == "cpu" and not interpreting():
        raise InvalidInput("build", "format 3's device build runs a Triton kernel: on a CPU only under Triton's "
                                    "interpreter (TRITON_INTERPRET=1 set before the kernel's module is imported)")
    B = seeds.shape[0]
    HD = heads * D
    if B == 0 or longest == 0:
        return
    if longest * HD >= 2 ** 31:
        raise InvalidInput("context_lens", f"format 3's device build counts positions x H x D in 32 bits: "
                                           f"{longest} x {HD} is past 2**31; give a shorter context")
    block_t = BLOCK_T_INTERPRETED if dst.device.type == "cpu" else BLOCK_T
    grid = (math.ceil(longest / block_t), B, math.ceil(HD / BLOCK_E))
    z = _unread_fp32(dst.device)  # the a, c, s a launch does not read: fp32 like theirs, so one signature
    pos = aff.pos if aff.s is not None else lens  # int32 either way (`lens` unread without a sink)
    if paged is not None:
        vk.stream_kernel[grid](dst, seeds, lens, aff.a if aff.a is not None else z, aff.c if aff.c is not None else z,
                               aff.s if aff.s is not None else z, pos, paged.table, paged.table.stride(0),
                               paged.page_size, 0, *paged.strides(heads, D),
                               D, HD,
                               int(aff.a is not None), int(aff.s is not None), int(clamp),
                               PAGED=True, BLOCK_T=block_t, BLOCK_E=BLOCK_E)
    else:
        rows = dst.shape[1]
        vk.stream_kernel[grid](dst, seeds, lens, aff.a if aff.a is not None else z, aff.c if aff.c is not None else z,
                               aff.s if aff.s is not None else z, pos, seeds, 0, 1, rows, 0, 0, 0, D, HD,
                               int(aff.a is not None), int(aff.s is not None), int(clamp),
                               PAGED=False, BLOCK_T=block_t, BLOCK_E=BLOCK_E)


def _regimes(c: Case, device: torch.device, keys: tuple[str, ...], aux) -> dict[str, _Affine]:
    """Each stream's affine map in `c.values`'s regime (module docstring; `oracle.values.request_values`)."""
    B, Hkv, D, G = c.batch_size, c.num_kv_heads, c.head_dim, c.group_size
    fp8 = c.kv_dtype == FP8

    def full(value: float, *shape: int) -> torch.Tensor:
        return torch.full((B, *shape), value, dtype=torch.float32, device=device)

    r = c.values
    out = {s: _Affine() for s in STREAMS}
    if r in SCORE_STD:
        a, g = regime_gains(c)
        cq = ck = None
        if r == "huge":
            u = aux("dir")  # [B, Hkv, D]
            sign = _on(device, [[random.Random(stream_seed(c.seed, key, "sign", 0)).choice((-1.0, 1.0))
                                 for _ in range(Hkv)] for key in keys], torch.float32).view(B, Hkv, 1)
            cq = (u * sign * a).repeat_interleave(G, dim=1).contiguous()
            ck = (u * g).contiguous()
        out["q"] = _Affine(full(a, D), cq if cq is not None else full(0.0, c.num_q_heads, D))
        for s in ("k", "kb"):
            out[s] = _Affine(full(g, D), ck if ck is not None else full(0.0, Hkv, D))
    elif r in ("sink", "peak"):
        s = aux(r)
        s = s * (math.sqrt(D) / s.norm(dim=-1, keepdim=True))
        out["q"] = _Affine(full(1.0, D), s.repeat_interleave(G, dim=1).contiguous())
        at = [0 if r == "sink" else c.peak_key(b) for b in range(B)]  # the heavy key: context, else block
        heavy = (s * sink_gain(c)).contiguous()
        out["k"] = _Affine(s=heavy, pos=_on(device, at, torch.int32))
        if r == "peak":
            blk = [t - L if t >= L else -1 for t, L in zip(at, c.context_lens)]
            out["kb"] = _Affine(s=heavy, pos=_on(device, blk, torch.int32))
    elif r == "full_range":
        layouts = [range_layouts(c, key) for key in keys]  # per request: (k's, v's)
        for i, (st, sb) in enumerate((("k", "kb"), ("v", "vb"))):
            a = _on(device, [list(lay[i].gains) for lay in layouts], torch.float32)
            pin = _on(device, [[list(p) for p in lay[i].pinned] for lay in layouts], torch.float32)
            out[st] = out[sb] = _Affine(a, pin)
        out["q"] = _Affine(_on(device, [[range_q_gain(c, lay[0])] * D for lay in layouts], torch.float32),
                           full(0.0, c.num_q_heads, D))
    elif r == "ties":
        u = aux("tie")
        for st in ("k", "kb"):
            out[st] = _Affine(full(TIE_SPREAD, D), u)
    elif r == "tiny":
        tv = TINY["v_fp8"] if fp8 else TINY["v"]
        out["q"] = _Affine(full(TINY["q"], D), full(0.0, c.num_q_heads, D))
        for st in ("k", "kb"):
            out[st] = _Affine(full(TINY["k"], D), full(0.0, Hkv, D))
        for st in ("v", "vb"):
            out[st] = _Affine(full(tv, D), full(tv, Hkv, D))
    elif r == "outliers":
        gain = [[1.0] * D for _ in keys]
        for row, key in zip(gain, keys):
            for ch in random.Random(stream_seed(c.seed, key, "outliers", 0)).sample(range(D), min(OUTLIER_CHANNELS, D)):
                row[ch] = OUTLIER_GAIN
        a = _on(device, gain, torch.float32)
        for st, H in (("q", c.num_q_heads), ("k", Hkv), ("v", Hkv), ("kb", Hkv), ("vb", Hkv)):
            out[st] = _Affine(a, full(0.0, H, D))
    return out


def draw(c: Case, device: torch.device, table: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor):
    """Format 3's device build on `device` (module docstring): each request's context keys and values written
    into `k_pool`/`v_pool` (in the case's layout and pool dtype) through `table`, the case's page table on
    `device`; returns `(q, k_block, v_block)`, the block holding the values an fp8 pool represents."""
    dt, fp8 = _DTYPES[c.dtype], c.kv_dtype == FP8
    B, K, Hq, Hkv, D, ps = c.batch_size, c.block_size, c.num_q_heads, c.num_kv_heads, c.head_dim, c.page_size
    keys = request_keys(c)
    direction = {"huge": "dir", "sink": "sink", "ties": "tie", "peak": "peak"}.get(c.values)  # its own stream
    names = STREAMS + ((direction,) if direction else ())
    # One row per stream, padded to an even length: each row starts 16-byte aligned, as Triton specializes a
    # pointer on (else an odd batch size would compile another variant of the kernel).
    seeds = _on(device, [[stream_seed(c.seed, key, s, 0) for key in keys] + [0] * (B % 2) for s in names], torch.int64)
    seed_of = {s: row[:B] for s, row in zip(names, seeds)}
    ones = torch.full((B,), 1, dtype=torch.int32, device=device)

    def aux(stream: str) -> torch.Tensor:  # one position of normals per request: a direction [B, Hkv, D]
        x = torch.empty((B, 1, Hkv, D), dtype=torch.float32, device=device)
        _launch(x, seed_of[stream], ones, 1, Hkv, D, _Affine())
        return x.view(B, Hkv, D)

    aff = _regimes(c, device, keys, aux)
    lens = _on(device, list(c.context_lens), torch.int32)
    longest = max(c.context_lens, default=0)
    paged = _Paged(page_table_int32(table), ps, c.layout)  # one variant per pool dtype whatever the table's dtype
    for pool, s in ((k_pool, "k"), (v_pool, "v")):
        _launch(pool, seed_of[s], lens, longest, Hkv, D, aff[s], paged=paged, clamp=fp8)
    k_lens = torch.full((B,), K, dtype=torch.int32, device=device)
    q = torch.empty((B, K, Hq, D), dtype=dt, device=device)
    _launch(q, seed_of["q"], k_lens, K, Hq, D, aff["q"])
    blocks = []
    for s, scale in (("kb", c.k_scale), ("vb", c.v_scale)):
        x = torch.empty((B, K, Hkv, D), dtype=k_pool.dtype if fp8 else dt, device=device)
        _launch(x, seed_of[s], k_lens, K, Hkv, D, aff[s], clamp=fp8)
        blocks.append((x.float() * scale).to(dt) if fp8 else x)  # the values the fp8 pool represents
    return q, blocks[0], blocks[1]
