"""`parity.exec.shared_compiles`: processes that miss the same Triton kernel compile it once between them.

The first test compiles a real kernel for an SM90 target in three processes at once (Triton compiles without a
GPU; only running a kernel needs one) and counts the compiles: one with the shared cache, three with a mutant that
does not lock (`tests/unshared_compile_cache.py`, run 76's A side). No process stores the kernel before each has
missed it once (a probe around the manager), so a loaded machine cannot hide the mutant (it once counted 1). The others drive the cache's lock directly: a waiter gets the entry its owner stored, a dead owner or a
dropped manager frees the lock, a waiter gives up after `WAIT_S`, a process never waits for itself.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from parity.exec import shared_compiles

ROOT = Path(__file__).resolve().parents[2]

_COMPILER = textwrap.dedent('''
    import json, os, sys, time
    os.environ.pop("TRITON_INTERPRET", None)
    import triton, triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from parity.exec import shared_compile_cache as scc

    if sys.argv[2] == "mutant":  # run 76's A side: never waits, so every process that misses compiles
        from tests.unshared_compile_cache import UnsharedCompileCache as Base
    else:
        Base = scc.SharedCompileCache
    from triton.runtime.cache import FileCacheManager

    ready, n = sys.argv[1], int(sys.argv[3])

    class Probe(Base):
        """No process stores the kernel before every process has missed it once (a loaded machine could
        otherwise let one finish before another looks, and a lock-free mutant would count one compile)."""

        def get_group(self, filename):
            if FileCacheManager.get_group(self, filename) is None:
                open(os.path.join(ready, f"missed-{os.getpid()}"), "w").close()
            return super().get_group(filename)

        def put_group(self, filename, group):
            t = time.monotonic()
            while sum(x.startswith("missed-") for x in os.listdir(ready)) < n and time.monotonic() - t < 60:
                time.sleep(0.005)
            return super().put_group(filename, group)

    os.environ["TRITON_CACHE_MANAGER"] = "__main__:Probe"

    @triton.jit
    def copy(x, y, n, B: tl.constexpr):
        i = tl.program_id(0) * B + tl.arange(0, B)
        tl.store(y + i, tl.load(x + i, mask=i < n), mask=i < n)

    src = ASTSource(copy, signature={"x": "*fp32", "y": "*fp32", "n": "i32", "B": "constexpr"}, constexprs={"B": 64})
    open(os.path.join(ready, str(os.getpid())), "w").close()  # a barrier: all three start together
    while sum(not x.startswith("missed-") for x in os.listdir(ready)) < n:
        time.sleep(0.001)
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32))
    print(json.dumps({"compiled": [e for e in scc.compiled_here if e.endswith(".json")], "cubin": len(kernel.asm["cubin"])}))
''')


def _compile_side_by_side(tmp_path: Path, mode: str, n: int = 3) -> list[dict]:
    tmp_path.mkdir()
    env = dict(os.environ, TRITON_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=str(ROOT))
    env.pop("TRITON_CACHE_MANAGER", None)
    shared_compiles.share_compiles(env)
    script = tmp_path / "compile_one.py"
    script.write_text(_COMPILER)
    ready = tmp_path / "ready"
    ready.mkdir()
    procs = [subprocess.Popen([sys.executable, str(script), str(ready), mode, str(n)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(n)]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, outs):
        if p.returncode != 0:
            last = err.strip().splitlines()[-1]  # the error itself, not the traceback's paths (triton/backends/...)
            if "ptxas" in last or "GPUTarget" in last or "backend" in last.lower():
                pytest.skip(f"this triton cannot compile for an SM90 target here: {last}")
            raise AssertionError(err)
    return [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]


def test_three_processes_compile_a_kernel_once(tmp_path):
    shared = _compile_side_by_side(tmp_path / "shared", "shared")
    assert sum(len(r["compiled"]) for r in shared) == 1, shared
    assert all(r["cubin"] > 0 for r in shared)
    unlocked = _compile_side_by_side(tmp_path / "mutant", "mutant")
    assert sum(len(r["compiled"]) for r in unlocked) == 3, unlocked  # each missed before any stored: each compiles


# -- the lock, driven directly ------------------------------------------------------------------------------

_HOLDER = textwrap.dedent('''
    import os, sys, time
    from parity.exec.shared_compile_cache import SharedCompileCache
    m = SharedCompileCache("KEY")
    assert m.get_group("k.json") is None
    print("held", flush=True)
    if sys.argv[1] == "die":
        os._exit(0)
    time.sleep(float(sys.argv[2]))
    if sys.argv[1] == "store":
        m.put_group("k.json", {"k.json": m.put("{}", "k.json")})
    print("done", flush=True)
    time.sleep(30)
''')


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _holder(tmp_path: Path, how: str, seconds: float = 0.0) -> subprocess.Popen:
    script = tmp_path / "holder.py"
    script.write_text(_HOLDER)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, str(script), how, str(seconds)], env=env, stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_waiter_loads_what_the_owner_stored(tmp_path, cache_dir):
    from parity.exec.shared_compile_cache import SharedCompileCache

    holder = _holder(tmp_path, "store", 1.0)
    try:
        m = SharedCompileCache("KEY")
        got = m.get_group("k.json")
        assert got is not None and set(got) == {"k.json"}  # waited, then found it: no compile here
        assert m.waited >= 0.5
        assert m._fd is None
    finally:
        holder.kill()
        holder.wait()


def test_a_dead_owner_frees_the_lock(tmp_path, cache_dir):
    from parity.exec.shared_compile_cache import SharedCompileCache

    holder = _holder(tmp_path, "die")
    holder.wait()
    m = SharedCompileCache("KEY")
    assert m.get_group("k.json") is None and m._fd is not None  # this process compiles it now
    m.put_group("k.json", {"k.json": m.put("{}", "k.json")})
    assert m._fd is None


def test_a_waiter_gives_up_after_wait_s(tmp_path, cache_dir, monkeypatch):
    from parity.exec import shared_compile_cache as scc

    monkeypatch.setattr(scc, "WAIT_S", 0.3)
    holder = _holder(tmp_path, "hold", 30.0)
    try:
        m = scc.SharedCompileCache("KEY")
        t = time.monotonic()
        assert m.get_group("k.json") is None  # compiles itself, as Triton would have
        assert 0.3 <= time.monotonic() - t < 5.0
        assert m._fd is None
    finally:
        holder.kill()
        holder.wait()


def test_a_dropped_manager_frees_the_lock_and_a_process_never_waits_for_itself(cache_dir, monkeypatch):
    from parity.exec import shared_compile_cache as scc

    monkeypatch.setattr(scc, "WAIT_S", 5.0)
    first = scc.SharedCompileCache("KEY")
    assert first.get_group("k.json") is None
    t = time.monotonic()
    second = scc.SharedCompileCache("KEY")
    assert second.get_group("k.json") is None and second._fd is None  # held here: no wait
    assert time.monotonic() - t < 1.0
    del first  # a compile that raised: its manager goes, and the lock with it
    third = scc.SharedCompileCache("KEY")
    assert third.get_group("k.json") is None and third._fd is not None
    assert third.waited < 1.0
    third._release(None)


def test_the_launcher_module_path_holds_until_its_file_is_put(cache_dir):
    from parity.exec import shared_compile_cache as scc

    m = scc.SharedCompileCache("LAUNCH")
    assert m.get_file("launcher.so") is None and m._fd is not None
    m.put(b"x", "other.txt")
    assert m._fd is not None  # another file: still held
    path = m.put(b"\x7fELF", "launcher.so")
    assert m._fd is None and Path(path).read_bytes() == b"\x7fELF"
    assert scc.compiled_here[-1].endswith("/launcher.so")


def test_share_compiles_keeps_the_users_choice():
    env = {}
    assert shared_compiles.share_compiles(env) and env[shared_compiles.ENV] == shared_compiles.SPEC
    assert shared_compiles.share_compiles(env)  # again: still ours
    mine = {shared_compiles.ENV: "my.cache:Manager"}
    assert not shared_compiles.share_compiles(mine) and mine[shared_compiles.ENV] == "my.cache:Manager"


def test_triton_takes_the_spec():
    """The spec names a class Triton accepts as a cache manager (its `env_class` knob checks the type)."""
    import importlib

    module, name = shared_compiles.SPEC.split(":")
    cls = getattr(importlib.import_module(module), name)
    from triton.runtime.cache import CacheManager

    assert issubclass(cls, CacheManager)


def test_a_kernel_group_stays_locked_until_the_group_is_stored(cache_dir):
    """Triton puts a kernel's metadata under the group's own name (`k.json`) before `put_group`: the lock is kept
    across that put (released there, a process that missed in between found no group and compiled again)."""
    from parity.exec import shared_compile_cache as scc

    m = scc.SharedCompileCache("GROUP")
    assert m.get_group("k.json") is None and m._fd is not None
    m.put(b"ptx", "k.ptx")
    path = m.put("{}", "k.json")
    assert m._fd is not None  # the same name as the group: still held
    m.put_group("k.json", {"k.json": path})
    assert m._fd is None and scc.compiled_here[-1] == "GROUP/k.json"


def test_the_compile_log_says_who_what_how_long_and_when(tmp_path, monkeypatch):
    """`$DFLASH_PARITY_COMPILE_LOG`: one line per compile or wait, `pid what KEY/FILE seconds end` (the end in Unix
    seconds: a cold run's compiles laid on its time line, docs/gpu/runs/89-*)."""
    from parity.exec import shared_compile_cache as scc

    log = tmp_path / "compiles.log"
    monkeypatch.setenv(scc.LOG_ENV, str(log))
    before = time.time()
    scc._log("compiled", "KEY", "k.cubin", 1.25)
    pid, what, entry, seconds, end = log.read_text().split()
    assert (int(pid), what, entry, float(seconds)) == (os.getpid(), "compiled", "KEY/k.cubin", 1.25)
    assert before - 0.001 <= float(end) <= time.time() + 0.001  # written to the millisecond
