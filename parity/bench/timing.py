"""Timing: CUDA-graph replays over rotating input sets on a GPU, plain `perf_counter` on a CPU.

On CUDA (`time_cuda_graphs`): every function is called `warmup` times on a side stream (JIT compiles,
lazy initialisation; never timed), one CUDA graph is captured per input set, the graphs are replayed
round-robin and each replay is timed with its own pair of CUDA events. The host first enqueues a GPU
sleep so that it runs ahead of the device: the events then time the device's work, not the host's
launch latency. Input sets rotate so that their bytes together exceed twice the L2 cache
(`rotation_sets`); where that would need more sets than `MAX_SETS`, an L2-sized buffer is also
overwritten before every timed replay (outside its events). The figures are the median, p10 and p90 of
the per-replay times; the number of replays is `replays`, cut down for slow shapes so that a
measurement's timed replays stay near `time_cap` seconds (never below `MIN_REPLAYS`).

A function that cannot be captured is timed eagerly (`time_cuda_eager`): wall time of each call
between two device synchronizations, host work included. On a CPU (`time_cpu`) every figure is
wall time and says so: "cpu (not a GPU figure)".
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

MAX_SETS = 8  # graphs per measurement; beyond this the L2 is flushed before each replay instead
MIN_REPLAYS = 10  # on CUDA, whatever the time cap (fewer only when --replays asks for fewer)
MIN_CPU_REPLAYS = 3
DEFAULT_L2_BYTES = 50 << 20  # Hopper's L2 when the device does not report it
MODE_GRAPH = "cuda graph"
MODE_EAGER = "eager (includes host work)"
MODE_CPU = "cpu (not a GPU figure)"


@dataclass
class Timing:
    """Figures of one measurement, in microseconds per call."""

    mode: str
    median_us: float
    p10_us: float
    p90_us: float
    samples: int
    sets: int = 1
    l2_flush: bool = False
    note: str = ""

    def describe(self) -> str:
        """One short phrase: `cuda graph, 6 sets`, `cuda graph, 8 sets + L2 flush`, `eager (...)`."""
        parts = [self.mode]
        if self.sets > 1 or self.l2_flush:
            parts.append(f"{self.sets} set{'s' if self.sets != 1 else ''}" + (" + L2 flush" if self.l2_flush else ""))
        if self.note:
            parts.append(self.note)
        return ", ".join(parts)

    def to_json(self) -> dict[str, Any]:
        return {"mode": self.mode, "median_us": round(self.median_us, 3), "p10_us": round(self.p10_us, 3),
                "p90_us": round(self.p90_us, 3), "samples": self.samples, "sets": self.sets,
                "l2_flush": self.l2_flush, "note": self.note}


class CaptureFailed(RuntimeError):
    """A function could not be captured in a CUDA graph (it synchronizes, allocates on the host, ...)."""


def join_notes(*notes: str) -> str:
    """The non-empty notes, joined by "; "."""
    return "; ".join(n for n in notes if n)


def percentile(values: Sequence[float], q: float) -> float:
    """The `q`-quantile (0..1) of `values`, linear between the two nearest ranks."""
    if not values:
        return math.nan
    s = sorted(values)
    pos = (len(s) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def summarize(times_us: Sequence[float], mode: str, *, sets: int = 1, l2_flush: bool = False, note: str = "") -> Timing:
    return Timing(mode=mode, median_us=percentile(times_us, 0.5), p10_us=percentile(times_us, 0.1),
                  p90_us=percentile(times_us, 0.9), samples=len(times_us), sets=sets, l2_flush=l2_flush, note=note)


def rotation_sets(set_bytes: int, l2_bytes: int, budget_bytes: int, max_sets: int = MAX_SETS) -> tuple[int, bool]:
    """How many input sets to rotate through, and whether the L2 must be flushed on top.

    One set when the set alone exceeds twice the L2 (or there is no L2 to beat, `l2_bytes <= 0`); else
    enough sets that together they exceed twice the L2, at most `max_sets` and at most what fits in
    `budget_bytes`. When those caps leave the sets short of twice the L2, flush (True).
    """
    if set_bytes <= 0:
        raise ValueError(f"set_bytes must be positive, got {set_bytes}")
    target = 2 * int(l2_bytes)
    if target <= 0 or set_bytes > target:
        return 1, False
    want = target // set_bytes + 1
    n = max(1, min(want, max_sets, budget_bytes // set_bytes))
    return n, n * set_bytes <= target


def l2_cache_bytes(device: str) -> int:
    """The L2 size of the current CUDA device (0 on a CPU: nothing to rotate against)."""
    if device != "cuda":
        return 0
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return int(getattr(props, "L2_cache_size", 0) or DEFAULT_L2_BYTES)


def _replay_count(replays: int, est_s: float, time_cap: float, minimum: int) -> int:
    if est_s <= 0 or not math.isfinite(est_s):
        return replays
    return max(min(replays, minimum), min(replays, int(time_cap / est_s)))


def time_cpu(fns: Sequence[Callable[[], Any]], *, replays: int, warmup: int, time_cap: float,
             mode: str = MODE_CPU, note: str = "") -> Timing:
    """Wall time of each call, round-robin over `fns`; stops past `time_cap` s (after MIN_CPU_REPLAYS)."""
    for _ in range(warmup):
        for fn in fns:
            fn()
    times: list[float] = []
    start = time.perf_counter()
    for i in range(replays):
        t0 = time.perf_counter()
        fns[i % len(fns)]()
        times.append((time.perf_counter() - t0) * 1e6)
        if time.perf_counter() - start > time_cap and len(times) >= min(replays, MIN_CPU_REPLAYS):
            break
    return summarize(times, mode, sets=len(fns), note=note)


def _flush_buffer(flush_bytes: int) -> torch.Tensor | None:
    return torch.empty(int(flush_bytes), dtype=torch.uint8, device="cuda") if flush_bytes > 0 else None


def time_cuda_eager(fns: Sequence[Callable[[], Any]], *, replays: int, warmup: int, time_cap: float,
                    flush_bytes: int = 0, note: str = "", mode: str = MODE_EAGER) -> Timing:
    """Wall time of each call between two device synchronizations (host work included)."""
    for _ in range(warmup):
        for fn in fns:
            fn()
    torch.cuda.synchronize()
    flush = _flush_buffer(flush_bytes)
    t0 = time.perf_counter()
    fns[0]()
    torch.cuda.synchronize()
    n = _replay_count(replays, time.perf_counter() - t0, time_cap, MIN_REPLAYS)
    times = []
    for i in range(n):
        if flush is not None:
            flush.zero_()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fns[i % len(fns)]()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e6)
    return summarize(times, mode, sets=len(fns), l2_flush=flush is not None, note=note)


def _sleep_ahead(n_replays: int) -> None:
    """Keep the GPU busy while the host enqueues `n_replays` timed replays (~30 us of host work each),
    so that every replay starts the moment the previous one ends, not when the host gets to it."""
    sleep = getattr(torch.cuda, "_sleep", None)
    if sleep is None:
        return
    ms = min(50.0, 0.5 + 0.03 * n_replays)
    sleep(int(ms * 2.0e6))  # cycles at ~2 GHz; sleeping longer than needed costs nothing but time


def time_cuda_graphs(fns: Sequence[Callable[[], Any]], *, replays: int, warmup: int, time_cap: float,
                     flush_bytes: int = 0, note: str = "") -> tuple[Timing, Any]:
    """Capture one CUDA graph per function (one per input set), replay them round-robin, time each replay.

    Returns the timing and what the first function returned during its capture, valid after a last
    replay of its graph (the output the timed graphs actually computed, to be judged).
    Raises CaptureFailed when a function cannot be captured.
    """
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(max(1, warmup)):
            for fn in fns:
                fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graphs, first = [], None
    for n, fn in enumerate(fns):
        g = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(g):
                res = fn()
        except Exception as err:
            try:
                torch.cuda.synchronize()
            except Exception:
                pass
            raise CaptureFailed(f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"[:200]) from err
        graphs.append(g)
        if n == 0:
            first = res
    for g in graphs:  # warm replays
        g.replay()
    torch.cuda.synchronize()
    flush = _flush_buffer(flush_bytes)
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for g in graphs:
        g.replay()
    e1.record()
    torch.cuda.synchronize()
    est_s = e0.elapsed_time(e1) / 1e3 / len(graphs)
    n = _replay_count(replays, est_s, time_cap, MIN_REPLAYS)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    _sleep_ahead(n)
    for i in range(n):
        if flush is not None:
            flush.zero_()
        starts[i].record()
        graphs[i % len(graphs)].replay()
        ends[i].record()
    torch.cuda.synchronize()
    times = [s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends)]
    graphs[0].replay()  # the first set's outputs, as its graph computes them
    torch.cuda.synchronize()
    timing = summarize(times, MODE_GRAPH, sets=len(graphs), l2_flush=flush is not None, note=note)
    del graphs
    return timing, first
