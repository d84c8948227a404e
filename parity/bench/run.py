"""Drive `dflash-parity bench`: pick the shapes and lowerings, run the tables, print, write the files.

Tables run shortest first (merge, hybrid, decode rows) and the files are rewritten after every table
and every ~15 s inside one, so a run cut short keeps what it measured (a table marked INCOMPLETE).
"""

from __future__ import annotations

import datetime as _dt
import importlib.metadata as _md
import json
import platform
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

import torch

from parity.bench import SCHEMA, TABLES
from parity.bench import measure as ms
from parity.bench import render
from parity.bench import merge_table as mt
from parity.bench import tables as tb
from parity.bench import timing as tm
from parity.bench.shapes import Shape
from parity.engine.policy import Policy
from parity.report.files import atomic_write

RUN_ORDER = ("merge", "hybrid", "decode-rows")  # shortest first: a cut-short run keeps the most tables
FLUSH_EVERY_S = 15.0


@dataclass
class BenchOptions:
    device: str = "cpu"
    tables: tuple[str, ...] = TABLES
    quick: bool = False
    replays: int | None = None  # default: 50 on cuda, 5 on a cpu
    max_gib: float = 100.0
    time_cap: float | None = None  # seconds of timed replays per measurement (default: 1 on cuda, 0.5 on a cpu)
    out_dir: str | None = None
    extra_lowerings: tuple[str, ...] = ()
    l2_bytes: int | None = None  # default: the device's L2 (0 on a cpu: one input set)
    seed: int = 0
    quiet: bool = False


@dataclass
class BenchResult:
    data: dict[str, Any]
    tables: list[tb.Table] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return any(t.failed for t in self.tables)


# ---- environment -----------------------------------------------------------------------------------------
def make_env(opts: BenchOptions, policy: Policy) -> ms.BenchEnv:
    cuda = opts.device == "cuda"
    return ms.BenchEnv(device=opts.device, policy=policy, replays=opts.replays or (50 if cuda else 5),
                       warmup=2 if cuda else 1, time_cap=opts.time_cap or (1.0 if cuda else 0.5),
                       max_gib=opts.max_gib,
                       l2_bytes=tm.l2_cache_bytes(opts.device) if opts.l2_bytes is None else int(opts.l2_bytes),
                       seed=opts.seed)


def timing_phrase(env: ms.BenchEnv) -> str:
    if env.device != "cuda":
        return tm.MODE_CPU
    return (f"CUDA graphs, median of up to {env.replays} replays, warm-up excluded, input sets rotated "
            f"past 2x the {env.l2_bytes / 2**20:.0f} MiB L2")


def device_description(device: str) -> str:
    if device == "cuda":
        p = torch.cuda.get_device_properties(torch.cuda.current_device())
        l2 = getattr(p, "L2_cache_size", 0)
        return (f"{p.name} (sm_{p.major}{p.minor}, {p.multi_processor_count} SMs, {p.total_memory / 2**30:.0f} GiB, "
                f"L2 {l2 / 2**20:.0f} MiB)")
    return f"cpu ({platform.machine() or '?'}, {torch.get_num_threads()} threads): not a GPU"


def _version(dist: str) -> str | None:
    try:
        return _md.version(dist)
    except _md.PackageNotFoundError:
        return None


def versions() -> dict[str, str | None]:
    return {"python": platform.python_version(), "triton": _version("triton"),
            "flashinfer": _version("flashinfer-python") or _version("flashinfer")}


# ---- default specs -----------------------------------------------------------------------------------------
def flashinfer_context(device: str):
    """`context[flashinfer-fa3]`, or fa2 with a note saying why when fa3 cannot run here."""
    import lowerings

    fa3 = lowerings.get("context[flashinfer-fa3]")
    ok, why = fa3.available(device)
    if ok:
        return fa3, ""
    fa2 = lowerings.get("context[flashinfer-fa2]")
    if fa2.available(device)[0]:
        return fa2, f" -- fa2, NOT fa3: {why}"
    return fa3, ""


def default_specs(opts: BenchOptions) -> dict[str, Any]:
    """The tables' specs, by id: full shapes, or a tiny subset with `quick` (CPU tests, smoke runs).
    On a CPU the torch emulations stand in for the flashinfer kernels, which are listed unavailable."""
    import lowerings

    get = lowerings.get
    cuda, q = opts.device == "cuda", opts.quick
    qd = 128 if cuda else 64  # quick head dim: on a GPU the one flashinfer's modules are most likely built for
    fi_ctx, ctx_note = flashinfer_context(opts.device)
    specs: dict[str, Any] = {}
    if "decode-rows" in opts.tables:
        heads = [(8, 2), (12, 2)] if q else [(8, 2), (12, 2), (64, 16)]
        dims = [qd] if q else [64, 128]
        lens = [32] if q else [32768, 131072]
        batches = (1, 2, 33) if q else (1, 2, 4, 8, 16, 32, 64, 128)  # quick: 33 takes the forced rows past 32
        bases = [Shape(1, L, hq, hkv, D, block=7, page_size=32, layout="HND", storage="appended")
                 for hq, hkv in heads for D in dims for L in lens]
        fi_rows = [("cuda-core", get("decode_rows[flashinfer]")), ("tensor-core", get("decode_rows[flashinfer-tc]"))]
        if cuda:
            specs["decode-rows"] = tb.DecodeRowsSpec(bases, batches, fi_ctx, fi_rows, ctx_note)
        else:
            specs["decode-rows"] = tb.DecodeRowsSpec(bases, batches, get("context"), [("torch", get("decode_rows"))]
                                                     + fi_rows)
    if "merge" in opts.tables:
        specs["merge"] = mt.MergeSpec(batches=(1, 2) if q else (1, 8, 32, 64),
                                      heads=[(4, 1)] if q else [(16, 1), (64, 4)], forms=mt.default_merge_forms(),
                                      head_dim=qd if q else 128, verify_context=16 if q else 64)
    if "hybrid" in opts.tables:
        # seed 003: 16/4 heads, K=4 (R = K*G = 16 query rows); quick keeps G=4 (R=16) on 4/1 heads
        base = (Shape(1, 32, 4, 1, qd, block=4, page_size=16, layout="NHD", storage="dense") if q else
                Shape(1, 8192, 16, 4, 128, block=4, page_size=32, layout="NHD", storage="dense"))
        lws = [get("hybrid_paged")] + ([fi_ctx, get("decode_rows[flashinfer]")] if cuda else
                                       [get("context"), get("decode_rows"), fi_ctx, get("decode_rows[flashinfer]")])
        for name in opts.extra_lowerings:
            if name not in [lw.name for lw in lws]:
                lws.append(get(name))
        specs["hybrid"] = tb.HybridSpec(base, (1, 2) if q else (1, 2, 4, 8, 16, 32), lws,
                                        context_note=ctx_note if cuda else "")
    return specs


# ---- progress ---------------------------------------------------------------------------------------------
class Progress:
    """`[12/96] decode-rows 64/16 D=128 L=131072 B=8 decode_rows[flashinfer]: 123.4 us (...), pass (...)`"""

    def __init__(self, total: int, stream: TextIO, quiet: bool, on_measurement=None) -> None:
        self.total, self.stream, self.quiet, self.n = total, stream, quiet, 0
        self.on_measurement = on_measurement

    def __call__(self, m: ms.Measurement) -> None:
        if m.status != ms.UNAVAILABLE:
            self.n += 1
            if not self.quiet:
                print(f"[{self.n}/{self.total}] {m.table} {m.shape_label} {m.label}: {m.summary()} "
                      f"[{m.seconds:.1f} s]", file=self.stream, flush=True)
        if self.on_measurement is not None:
            self.on_measurement()


# ---- the run ----------------------------------------------------------------------------------------------
def run_bench(opts: BenchOptions, policy: Policy, *, specs: dict[str, Any] | None = None,
              stdout: TextIO | None = None, stderr: TextIO | None = None) -> BenchResult:
    """Run the selected tables (or `specs`, by table id), print them, write the files; never raises for
    a lowering's failure (it is a FAIL row; `BenchResult.failed`)."""
    stdout = stdout or sys.stdout
    stderr = stderr or sys.stderr
    env = make_env(opts, policy)
    specs = specs if specs is not None else default_specs(opts)
    timing = timing_phrase(env)
    order = [i for i in RUN_ORDER if i in specs] + [i for i in specs if i not in RUN_ORDER]
    canonical = [i for i in TABLES if i in specs] + [i for i in specs if i not in TABLES]
    tables = {i: specs[i].empty(timing) for i in specs}
    meta = {"schema": SCHEMA, "device": device_description(opts.device), "torch": torch.__version__,
            "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), "timing": timing,
            "versions": versions(),
            "settings": {**{k: v for k, v in asdict(opts).items() if k not in ("out_dir", "quiet")},
                         "replays": env.replays, "warmup": env.warmup, "time_cap": env.time_cap,
                         "l2_bytes": env.l2_bytes, "rotation_budget_bytes": env.rotation_budget,
                         "max_sets": tm.MAX_SETS, "tolerances": policy.source},
            "command": " ".join(sys.argv)}
    out_dir = Path(opts.out_dir) if opts.out_dir else None
    png: dict[str, str | None] = {i: None for i in canonical}
    png_note = ""
    last_flush = [time.perf_counter()]

    def plot(t: tb.Table) -> None:
        nonlocal png_note
        if out_dir is None:
            return
        out_dir.mkdir(parents=True, exist_ok=True)
        why = render.write_png(t, out_dir / f"{t.id}.png")
        if why is None:
            png[t.id] = f"{t.id}.png"
        elif why != png_note:
            png_note = why
            print(why, file=stderr, flush=True)

    def write() -> dict[str, Any]:
        listed = [tables[i] for i in canonical]
        data = {**meta, "failed": any(t.failed for t in listed), "png": dict(png), "png_note": png_note,
                "tables": [t.to_json() for t in listed]}
        if out_dir is not None:
            atomic_write(out_dir / "bench.json", json.dumps(render.jsonable(data), indent=1) + "\n")
            atomic_write(out_dir / "bench.md", render.markdown(meta, listed, png, png_note))
        last_flush[0] = time.perf_counter()
        return data

    def maybe_flush() -> None:
        if out_dir is not None and time.perf_counter() - last_flush[0] > FLUSH_EVERY_S:
            write()

    total = sum(specs[i].count(env) for i in order)
    env.progress = Progress(total, stderr, opts.quiet, maybe_flush)
    if opts.device == "cpu" and not opts.quick and not opts.quiet:
        print("bench: full shapes on a CPU take hours; --quick is the CPU subset", file=stderr, flush=True)
    t0 = time.perf_counter()
    try:
        for tid in order:
            specs[tid].run(env, timing, tables[tid])
            tables[tid].complete = True
            print(render.terminal(tables[tid]) + "\n", file=stdout, flush=True)
            plot(tables[tid])
            write()
    finally:
        data = write()
    listed = [tables[i] for i in canonical]
    n_fail = sum(m.failed for t in listed for m in t.measurements)
    where = f"; {out_dir}/ (bench.json, bench.md{', PNGs' if any(png.values()) else ''})" if out_dir else ""
    print(f"{sum(len(t.measurements) for t in listed)} measurements, {n_fail} failed or errored, "
          f"in {time.perf_counter() - t0:.1f} s{where}", file=stdout, flush=True)
    return BenchResult(data, listed)
