"""`parity.exec.precompile`: the oracle's and the case builder's Triton variants, compiled before a check's first case.

- The variants it goes over cover every launch of the oracle's kernel that drawn cases make (the `gpu` profile's
  limits, the production rows), and the check fails when they do not (a narrower list).
- The oracle's kernel is one variant across the block's storage, the window-B mask and the page table's dtype
  (they were constexprs and a pointer type: four to eight variants of each shape), and the check sees a
  constexpr again.
- The order: each process starts at its own place; a variant another process is compiling is left for later
  (`SharedCompileCache.not_waiting` raises `Busy`), then loaded; a marker skips it all the next time; an error
  is reported, never raised, and leaves no marker.
- A `--jobs` child precompiles before its first case; a plain check does not.
"""

from __future__ import annotations

import functools
import itertools
import time
import zlib

import pytest
from hypothesis import HealthCheck, given, settings

import lowerings
from oracle import materialize
from parity.exec import precompile as pc
from strategies import MODELS, cases, limits_for

PROD_OFF = dict(max_production_context=0, max_production_batch=2, models=())
SETTINGS = settings(max_examples=60, derandomize=True, deadline=None, database=None,
                    suppress_health_check=list(HealthCheck))


class LaunchKeys:
    """Stands in for the oracle's kernel: `kernel[grid](*args, **kw)` records what Triton compiles a variant for
    (constexprs, pointer dtypes, the class of each specialized integer) and launches nothing."""

    def __init__(self, kernel):
        from oracle import _fast_kernel as fk

        self.names, self.runtime, self.keys = kernel.arg_names, set(fk.RUNTIME_ARGS), set()
        self.aligned = False  # True: each pointer's 16-byte alignment is part of the key too

    def __getitem__(self, grid):
        import torch

        def launch(*args, **kw):
            key = []
            for n, a in zip(self.names, args):
                if isinstance(a, torch.Tensor):
                    key.append((n, str(a.dtype)) + ((a.data_ptr() % 16 == 0,) if self.aligned else ()))
                elif isinstance(a, int) and not isinstance(a, bool) and n not in self.runtime:
                    key.append((n, "1" if a == 1 else "16" if a % 16 == 0 else "n"))
            key += sorted((k, str(v.dtype) if isinstance(v, torch.Tensor) else v) for k, v in kw.items()
                          if k not in ("num_warps", "num_stages", "UPCAST"))
            self.keys.add(tuple(key))
        return launch


class _NoMerge:
    """Stands in for the split merge (`oracle/_finish_kernel.py`) beside `LaunchKeys`: launches nothing (its
    partials were never written; interpreting it over them cost these tests half a minute)."""

    def __getitem__(self, grid):
        return lambda *args, **kw: None


@pytest.fixture
def launch_keys(monkeypatch):
    from oracle import _fast_kernel as fk
    from oracle import _finish_kernel as fin

    rec = LaunchKeys(fk.ORACLE_KERNEL)
    monkeypatch.setattr(fk, "ORACLE_KERNEL", rec)
    monkeypatch.setattr(fin, "FINISH_KERNEL", _NoMerge())
    return rec


UNIT_ARGS = {"oracle": {}, "yardstick": {"kv_rounded": True, "round_p": True},
             "golden": {"precision": __import__("torch").float64}}


def _keys_of(case_list, rec, *, kind: str = "oracle") -> set:
    """The variants `case_list` launches as `kind`'s unit does: the oracle's (fp32), the golden reference's (`F64`),
    the yardstick's (`ROUND_P`, kv rounded)."""
    from oracle._fast import attention_triton

    rec.keys = set()
    for case in case_list:
        rec.case = case  # what a mutant launcher may read
        fbk = 1 if case.seed % 2 else None  # the window-B mask on for some: a run-time switch
        attention_triton(materialize(case, "cpu"), case.window, fbk if kind != "yardstick" else None, upcast=True,
                         **UNIT_ARGS[kind])
    return set(rec.keys)


def _small(lim):
    import dataclasses

    return dataclasses.replace(lim, max_context=40, max_batch=3)  # the lengths and batch choose no variant


def test_the_variants_cover_every_drawn_launch(launch_keys):
    lim = limits_for(lowerings.get("context"), "cuda", profile="gpu", overrides=PROD_OFF)
    drawn: list = []

    @SETTINGS
    @given(case=cases(limits=_small(lim)))
    def collect(case):
        drawn.append(case)

    collect()
    # The production rows' geometries (K, heads, D) at a short context: their variants, not their lengths.
    from tests.oracle.oracle_cases import build_case

    for m in MODELS:
        for dtype, kv in (("bfloat16", "bfloat16"), ("float16", "float8_e4m3fn")):
            drawn.append(build_case([5, 3], m.block_size, m.num_kv_heads, m.group, m.head_dim, m.page_size,
                                    dtype=dtype, kv_dtype=kv))
    seen = _keys_of(drawn, launch_keys)
    assert len(seen) >= 12, len(seen)  # the draw reaches most of the variants: the comparison below means something
    prod = limits_for(lowerings.get("context"), "cuda", profile="gpu")
    assert prod.max_production_context and prod.models, "the gpu profile draws production rows on CUDA"
    listed = _keys_of([c for kind, c in pc.variant_cases(prod) if kind == "oracle"], launch_keys)
    assert seen <= listed, f"drawn launches no precompiled variant covers: {sorted(seen - listed)[:2]}"
    assert len(listed) == len([1 for k, _ in pc.variant_cases(prod) if k == "oracle"])
    for kind, flag in (("yardstick", "ROUND_P"), ("golden", "F64")):
        units = _keys_of([c for k, c in pc.variant_cases(prod) if k == kind], launch_keys, kind=kind)
        assert _keys_of(drawn, launch_keys, kind=kind) <= units, f"a drawn {kind} launch no variant covers"
        assert not units & listed and all((flag, True) in k for k in units)
    # The check can fail: a list built for GQA groups of 1 misses the drawn row blocks of 32 and 64.
    from oracle.reference import triton_variant_cases

    narrow = _keys_of(triton_variant_cases(prod.head_dims, prod.dtypes, prod.kv_dtypes, prod.max_block, 1),
                      launch_keys)
    assert not seen <= narrow


def test_one_oracle_variant_across_storage_window_b_and_table_dtype(launch_keys, monkeypatch):
    import dataclasses

    import torch

    from oracle import _fast_kernel as fk
    from tests.oracle.oracle_cases import build_case

    base = build_case([7, 2], 3, 2, 4, 64, 16)
    variants = [dataclasses.replace(base, block_storage=s, page_table_dtype=t) for s in ("dense", "appended")
                for t in ("int32", "int64")]
    assert len({c.block_storage for c in variants}) == 2
    keys = _keys_of(variants + [dataclasses.replace(v, seed=v.seed | 1) for v in variants], launch_keys)
    assert len(keys) == 1, keys
    # The check can fail: a switch passed as a constexpr again, or the int64 table passed as it is, is a second key.
    rec, pt = launch_keys, launch_keys.names.index("PT")

    class Mutant:
        def __init__(self, change):
            self.change = change

        def __getitem__(self, grid):
            return lambda *args, **kw: rec[grid](*self.change(list(args), kw), **kw)

    def constexpr_again(args, kw):
        kw["APPENDED"] = args[rec.names.index("appended")]
        return args

    def table_as_drawn(args, kw):
        args[pt] = args[pt].to(getattr(torch, rec.case.page_table_dtype))  # the case's own table, unconverted
        return args

    for change in (constexpr_again, table_as_drawn):
        monkeypatch.setattr(fk, "ORACLE_KERNEL", Mutant(change))
        assert len(_keys_of(variants, rec)) == 2, change.__name__


# -- the order, the deferral, the marker ----------------------------------------------------------------------

@pytest.fixture
def fake_gpu(tmp_path, monkeypatch):
    import torch

    _limits()  # before CUDA is faked: the limits ask the device's memory where there is one
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    """`precompile` on "cuda" with the units faked: `runs` records them; a unit named in `busy` raises Busy the
    first time, one in `broken` raises an error."""
    from parity.exec import shared_compile_cache as scc

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(pc, "_capability", lambda device: "(9, 0)")
    monkeypatch.setattr(pc, "_done", set())
    state = {"runs": [], "busy": set(), "broken": set()}

    def run_unit(kind, case, device):
        key = (kind, case.to_json(None))
        state["runs"].append(key)
        if key in state["busy"]:  # busy once, or (a dict) that many times
            left = state["busy"][key] - 1 if isinstance(state["busy"], dict) else 0
            if left > 0:
                state["busy"][key] = left
            else:
                state["busy"].pop(key) if isinstance(state["busy"], dict) else state["busy"].discard(key)
            if not scc._no_wait:
                raise AssertionError("waited for a held kernel")  # only the WAIT_S fallback may
            raise scc.Busy("KEY")
        if key in state["broken"]:
            raise RuntimeError("ptxas died\nmore")

    monkeypatch.setattr(pc, "_run_unit", run_unit)
    return state


@functools.lru_cache(maxsize=None)
def _limits():
    return limits_for(lowerings.get("context"), "cuda", profile="gpu", overrides=PROD_OFF)


def test_busy_variants_come_last_and_the_marker_skips_the_next_run(fake_gpu, tmp_path):
    lim = _limits()
    units = [(k, c.to_json(None)) for k, c in pc.variant_cases(lim)]
    fake_gpu["busy"] = {units[1], units[5]}
    rep = pc.precompile(lim, "cuda", start="context None")
    runs = fake_gpu["runs"]
    assert sorted(set(runs)) == sorted(set(units)) and len(runs) == len(units) + 2
    assert runs[-2:] == [u for u in runs[:-2] if u in (units[1], units[5])]  # left for later, then loaded
    assert rep.units == len(units) and not rep.errors and rep.skipped is None
    assert list((tmp_path / "cache" / "dflash-parity").iterdir())
    fake_gpu["runs"].clear()
    pc._done.clear()  # a new process: the marker on disk is what it finds
    again = pc.precompile(lim, "cuda", start="sdpa None")
    assert fake_gpu["runs"] == [] and "already" in again.skipped


def test_a_process_compiles_what_is_free_before_it_pauses_and_never_blocks(fake_gpu):
    """Held for four rounds: every other variant is run meanwhile, then the pause doubles while only held ones
    are left (run 79's convoy: waiting on the held one let the process ahead take each next variant first)."""
    lim = _limits()
    units = [(k, c.to_json(None)) for k, c in pc.variant_cases(lim)]
    fake_gpu["busy"] = {units[0]: 4, units[7]: 1}
    sleeps = []
    rep = pc.precompile(lim, "cuda", start="context None", sleep=sleeps.append)
    runs = fake_gpu["runs"]
    assert set(runs) == set(units) and not rep.errors
    first_round = runs[:len(units)]
    assert sorted(first_round) == sorted(units)  # one pass over all before any retry
    retries = runs[len(units):]
    assert sorted(retries[:2]) == sorted([units[0], units[7]]) and retries[2:] == [units[0]] * 3
    assert sleeps == [pc.POLL_S[0], 2 * pc.POLL_S[0]]  # paused only where the held one alone was left
    assert rep.ran == len(units) and rep.left == 0


def test_run_pending_pauses_for_held_units_unless_told_to_leave_them():
    """`run_pending`'s own way (`leave_held=False`, the schedule simulation's): the pause doubles while only held
    units are left."""
    from parity.exec import shared_compile_cache as scc

    busy = {"a": 3}
    runs, sleeps = [], []

    def run_unit(kind, case):
        runs.append(kind)
        if busy.get(kind, 0) > 0:
            busy[kind] -= 1
            raise scc.Busy("KEY")

    units = [("a", None), ("b", None)]
    assert pc.run_pending(list(units), run_unit, sleep=sleeps.append) == []
    assert runs == ["a", "b", "a", "a", "a"] and sleeps == [pc.POLL_S[0], 2 * pc.POLL_S[0]]
    busy["a"], runs[:], sleeps[:] = 3, [], []
    pc.run_pending(list(units), run_unit, sleep=sleeps.append, leave_held=True)
    assert runs == ["a", "b", "a"] and sleeps == []


def test_variants_other_processes_compiled_are_not_loaded_here(fake_gpu, monkeypatch):
    """A variant with another process's marker is skipped, also one marked while this process is going over the
    list (asked just before it would run). The same run with the markers unread (the way before them: every
    process loaded every variant, 9-10 s per child on the H200's run 84) runs them all."""
    lim = _limits()
    cases = pc.variant_cases(lim)
    units = [(k, c.to_json(None)) for k, c in cases]
    base = pc._base_digest("cuda")
    marker = pc._marker(cases, base)

    def mark(i):
        path = pc._unit_marker(marker, base, *cases[i])
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()

    for i in range(0, len(cases), 2):
        mark(i)
    real = pc._run_unit
    at = zlib.crc32(b"context None") % len(units)  # where this process starts (`precompile`)
    late = [i for i in [*range(at, len(units)), *range(at)] if i % 2][-1]  # the last unmarked one it reaches

    def run_unit(kind, case, device):  # another process finishes that one meanwhile
        mark(late)
        return real(kind, case, device)

    monkeypatch.setattr(pc, "_run_unit", run_unit)
    rep = pc.precompile(lim, "cuda", start="context None")
    odd = [u for i, u in enumerate(units) if i % 2 and i != late]
    assert sorted(fake_gpu["runs"]) == sorted(odd) and rep.ran == len(odd) and rep.left == 0
    assert f"{len(units) - rep.ran} compiled by other processes" in rep.line()
    assert list(marker.parent.glob("precompiled-*"))  # every variant marked: the next run skips them all
    for path in marker.parent.iterdir():
        path.unlink()
    fake_gpu["runs"].clear()
    pc._done.clear()
    for i in range(0, len(cases), 2):
        mark(i)
    fresh = itertools.count()  # a mutant: each marker asked for is a new name, so none is ever found
    monkeypatch.setattr(pc, "_unit_marker", lambda *a: marker.parent / f"unread-{next(fresh)}")
    pc.precompile(lim, "cuda", start="context None")
    assert sorted(fake_gpu["runs"]) == sorted(units)


def test_no_progress_for_wait_s_falls_back_to_waiting(fake_gpu, monkeypatch):
    from parity.exec import shared_compile_cache as scc

    lim = _limits()
    units = [(k, c.to_json(None)) for k, c in pc.variant_cases(lim)]
    held = units[2]
    fake_gpu["busy"] = {held: 10**6}
    now = [0.0]
    monkeypatch.setattr(scc, "WAIT_S", 1.0)

    def sleep(s):
        now[0] += s
        if now[0] > 50:
            raise AssertionError("never fell back")

    seen = []
    real = pc._run_all
    monkeypatch.setattr(pc, "_run_all", lambda u, run, errors, *, skip_busy, **kw: seen.append(skip_busy) or
                        (fake_gpu["busy"].clear() if not skip_busy else None) or real(u, run, errors, skip_busy=skip_busy,
                                                                                     **kw))
    errors = pc.run_pending([(k, c) for k, c in pc.variant_cases(lim)], lambda k, c: pc._run_unit(k, c, "cuda"),
                            clock=lambda: now[0], sleep=sleep)  # run_pending's own way: precompile leaves held ones
    assert seen[-1] is False and seen.count(False) == 1 and 1.0 <= now[0] < 3.0
    assert fake_gpu["runs"][-1] == held and not errors


def test_each_process_starts_at_its_own_place(fake_gpu):
    lim = _limits()
    firsts = set()
    for start in ("context None", "sdpa None", "decode_rows None", "hybrid_paged None", "windowed_merge[eager] None"):
        fake_gpu["runs"].clear()
        pc._done.clear()
        pc.precompile(lim, "cuda", start=start, clock=time.perf_counter)
        firsts.add(fake_gpu["runs"][0])
        for marker in pc._cache_dir().joinpath("dflash-parity").iterdir():
            marker.unlink()
    assert len(firsts) >= 3


def test_an_error_is_reported_and_leaves_no_marker(fake_gpu, tmp_path):
    lim = _limits()
    bad = [(k, c.to_json(None)) for k, c in pc.variant_cases(lim) if k == "oracle"][3]
    fake_gpu["broken"] = {bad}
    rep = pc.precompile(lim, "cuda")
    assert len(rep.errors) == 1 and "RuntimeError: ptxas died" in rep.errors[0] and "more" not in rep.errors[0]
    assert "could not be compiled" in rep.line()
    markers = [p.name for p in (tmp_path / "cache" / "dflash-parity").iterdir()]
    assert len(markers) == rep.units - 1 and all(m.startswith("variant-") for m in markers)  # the broken one unmarked


def test_nothing_to_do_off_the_gpu(fake_gpu, monkeypatch):
    import torch

    rep = pc.precompile(_limits(), "cpu")
    assert fake_gpu["runs"] == [] and rep.skipped
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # `--device cuda` where there is none
    rep = pc.precompile(_limits(), "cuda")
    assert fake_gpu["runs"] == [] and "no CUDA device" in rep.skipped


def test_a_precompile_that_raises_never_stops_the_check(monkeypatch):
    def boom(*a, **k):
        raise RuntimeError("driver gone")

    monkeypatch.setattr(pc, "precompile", boom)
    warned, said = [], []
    rep = pc.precompile_for_check(_limits(), "cuda", "x", said.append, warned.append)
    assert rep.skipped and said == [] and "RuntimeError: driver gone" in warned[0]


def test_not_waiting_raises_busy_on_a_held_kernel_only(tmp_path, monkeypatch):
    from parity.exec import shared_compile_cache as scc
    from tests.parity.test_shared_compiles import _holder

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "cache"))
    holder = _holder(tmp_path, "store", 1.5)
    try:
        with scc.not_waiting():
            t = time.monotonic()
            with pytest.raises(scc.Busy):
                scc.SharedCompileCache("KEY").get_group("k.json")
            assert time.monotonic() - t < 0.5  # no wait
            free = scc.SharedCompileCache("OTHER")
            assert free.get_group("k.json") is None and free._fd is not None  # nobody holds it: compiled here
            free._release(None)
        got = scc.SharedCompileCache("KEY").get_group("k.json")  # outside: waits for the holder, then loads
        assert got is not None
    finally:
        holder.kill()
        holder.wait()


# -- who precompiles ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("part,workers", [(True, 1), (False, 1), (False, 3)])
def test_a_jobs_child_precompiles_before_its_first_case(part, workers, monkeypatch):
    """A `--jobs` child, or a pytest-xdist worker beside others (the plugin's sessions), precompiles; a lone check
    compiles as its cases need (it has no sibling to share the compiles with, and may draw few cases)."""
    from parity.front import session
    from parity.front.config import CheckConfig
    from parity.front.part import Part

    calls = []
    monkeypatch.setattr(pc, "precompile", lambda limits, device, start="", **kw: calls.append((device, start))
                        or pc.Precompiled(units=32, seconds=7.5))
    cfg = CheckConfig(lowerings=("context",), max_examples=2, isolate=False, hardening=(), quiet=True)
    monkeypatch.delenv("PYTEST_XDIST_WORKER_COUNT", raising=False)
    sess = session.CheckSession(cfg, part=Part("context") if part else None, workers=workers)
    rep = sess.check(lowerings.get("context"), asked=session.Asked(max_examples=2))
    assert calls == ([(sess.device, "context None")] if part or workers > 1 else [])
    if calls:  # its seconds are the lowering's: a phase of its time line, in its wall and so in its rate
        assert rep.phases["precompile"] == 7.5 and rep.seconds >= 7.5
    else:
        assert "precompile" not in rep.phases


def test_an_oracle_unit_attends_host_built_inputs_and_a_build_unit_runs_the_builder(monkeypatch):
    """An oracle unit's inputs come from the host build, so it never waits for a builder variant another process is
    compiling (H200 run 90: the oracle's compiles started only after the builder's); a build unit runs the device
    build (the builder's kernel), and nothing else."""
    import oracle
    import torch

    calls = []
    monkeypatch.setattr(oracle, "materialize", lambda case, device, **kw: calls.append(("build", kw)) or "inputs")
    monkeypatch.setattr(oracle, "attention", lambda inputs, engine: calls.append(("attend", inputs, engine)))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: calls.append(("sync",)))
    lim = limits_for(lowerings.get("context"), "cuda", profile="gpu", overrides=PROD_OFF)
    units = pc.variant_cases(lim)
    (okind, ocase), (bkind, bcase) = (next(u for u in units if u[0] == k) for k in ("oracle", "build"))
    pc._run_unit(okind, ocase, "cuda")
    assert calls == [("build", {"build": "host"}), ("attend", "inputs", "triton"), ("sync",)]
    calls.clear()
    pc._run_unit(bkind, bcase, "cuda")
    assert calls == [("build", {}), ("sync",)]


def test_host_built_inputs_launch_the_oracle_variant_device_built_ones_do(launch_keys):
    """The oracle unit's host build (above) compiles the variant the drawn cases' device build launches: the same
    constexprs, pointer dtypes, integer classes and 16-byte alignment of every pointer (Triton specializes on it).
    The device build here is format 3's counter build (under Triton's interpreter on a CPU, as on CUDA)."""
    from oracle._fast import attention_triton

    launch_keys.aligned = True
    units = [c for kind, c in pc.variant_cases(limits_for(lowerings.get("context"), "cuda", profile="gpu",
                                                          overrides=PROD_OFF)) if kind == "oracle"]
    def keys(build: str, shift=lambda inputs: inputs) -> set:
        launch_keys.keys = set()
        for case in units:
            attention_triton(shift(materialize(case, "cpu", build=build)), case.window, None, upcast=True)
        return set(launch_keys.keys)

    host = keys("host")
    assert len(host) >= 12 and host == keys("counter")

    # The check can fail: queries one element past a 16-byte boundary (a build that sliced them out of a larger
    # buffer) are another variant.
    def off_by_one_element(inputs):
        import dataclasses

        import torch

        buf = torch.empty(inputs.q.numel() + 1, dtype=inputs.q.dtype)
        return dataclasses.replace(inputs, q=buf[1:].view_as(inputs.q).copy_(inputs.q))
    assert keys("host", off_by_one_element) != host


def test_the_marker_follows_every_triton_kernel_of_the_oracle():
    """The run's marker is named by the kernels' sources: a kernel file left out of `_SOURCES` could change and a
    stale marker skip its precompile (the statistics and split-merge kernels were, when they came)."""
    from pathlib import Path

    root = Path(pc.__file__).resolve().parents[2]
    kernels = {f"oracle/{p.name}" for p in (root / "oracle").glob("*.py") if "@triton.jit" in p.read_text()}
    assert len(kernels) >= 4
    assert kernels <= set(pc._SOURCES), sorted(kernels - set(pc._SOURCES))
    assert kernels - set(pc._SOURCES[:1])  # the check sees a file left out
