"""A bytecode cache for installed packages that have none and cannot take one (`cache_bytecode`).

Python writes a module's compiled bytecode next to its source (`__pycache__/NAME.cpython-312.pyc`) the first
time it imports it, and reads it from there afterwards. Where a package was installed without its bytecode
(`pip install --no-compile`, as container images often are) into a folder this user cannot write, nothing is
ever cached: every process compiles the package's sources again at each import. On the H200's image torch has
no `__pycache__` and `PYTHONDONTWRITEBYTECODE=1` is set (run 68): the profiler's first start alone compiled 959
modules, 3.99 s of its 5.8 s (run 65), the prefork's imports took 7.8 s (2.8-3.2 s from this cache, run 69), and a
`check --jobs` run pays that in its own process, in the prefork and in each child that imports more (flashinfer,
`torch._inductor`).

`cache_bytecode()` points Python's bytecode cache (`sys.pycache_prefix`; `PYTHONPYCACHEPREFIX` for the
processes this one starts) at a folder of ours there, so the first process writes it and the others read it.
It changes nothing where torch's bytecode is cached already or its folder is writable (Python caches it
itself), where the user chose a prefix (`PYTHONPYCACHEPREFIX`), or where `DFLASH_PARITY_PYCACHE=off`.
`DFLASH_PARITY_PYCACHE=DIR` names the folder (default: `$XDG_CACHE_HOME/dflash-parity/pycache`, else
`~/.cache/...`). Where no bytecode may be written (`PYTHONDONTWRITEBYTECODE`, `-B`: the H200's image sets it,
run 68) nothing is cached unless `DFLASH_PARITY_PYCACHE` names the folder, which is the opt-in; `check` says
so.

Public: `cache_bytecode`, `has_bytecode`, `can_take_bytecode`, `cache_dir`.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import Callable

ENV = "DFLASH_PARITY_PYCACHE"
PROBE = "torch"  # the package whose bytecode decides (the imports that cost: torch's)


def cache_dir(environ: dict[str, str] | None = None) -> Path:
    """Where the cache goes: `DFLASH_PARITY_PYCACHE`, else `$XDG_CACHE_HOME/dflash-parity/pycache`, else
    `~/.cache/dflash-parity/pycache`."""
    env = os.environ if environ is None else environ
    if env.get(ENV) and env[ENV] != "off":
        return Path(env[ENV]).expanduser()
    base = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "dflash-parity" / "pycache"


def has_bytecode(package_dir: str | os.PathLike) -> bool:
    """Whether the package at `package_dir` holds the bytecode of its `__init__` for this interpreter."""
    return (Path(package_dir) / "__pycache__" / f"__init__.{sys.implementation.cache_tag}.pyc").is_file()


def can_take_bytecode(package_dir: str | os.PathLike) -> bool:
    """Whether Python could write the package's bytecode next to its sources (its `__pycache__`, or the
    folder where there is none yet, is writable)."""
    cache = Path(package_dir) / "__pycache__"
    return os.access(cache if cache.is_dir() else package_dir, os.W_OK)


def cache_bytecode(environ: dict[str, str] | None = None, say: Callable[[str], None] | None = None,
                   probe: str = PROBE, hint: bool = False, chosen_only: bool = False) -> Path | None:
    """Point the bytecode cache at `cache_dir()` where the probe package (torch) needs one (see the module
    docstring; `probe`: the package that decides); the folder, or None where nothing was changed. Call it
    before torch is imported: a module already imported keeps the bytecode it had. `say` is told once, when
    the folder is created; with `hint`, also where the cache would help but `PYTHONDONTWRITEBYTECODE` (or
    `-B`) forbids it and `DFLASH_PARITY_PYCACHE` does not name a folder (naming one is the opt-in).
    `chosen_only`: only where `DFLASH_PARITY_PYCACHE` names the folder (the pytest plugin, which changes
    nothing in a test session it is not asked to)."""
    env = os.environ if environ is None else environ
    chosen = env.get(ENV, "")
    if chosen == "off" or env.get("PYTHONPYCACHEPREFIX") or sys.pycache_prefix or (chosen_only and not chosen):
        return None
    try:
        spec = importlib.util.find_spec(probe)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin or has_bytecode(os.path.dirname(spec.origin)):
        return None
    where, there = cache_dir(env), os.path.dirname(spec.origin)
    if sys.dont_write_bytecode:
        if not chosen:
            if hint and say is not None:
                say(f"dflash-parity: {probe} at {there} has no bytecode and none is written "
                    f"(PYTHONDONTWRITEBYTECODE), so each process compiles its sources again at import; "
                    f"{ENV}=DIR caches the bytecode in DIR")
            return None
    elif can_take_bytecode(there):
        return None  # Python writes it there itself, once
    new = not where.is_dir()
    try:
        where.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    if not os.access(where, os.W_OK):
        return None
    sys.pycache_prefix = str(where)
    env["PYTHONPYCACHEPREFIX"] = str(where)  # the prefork, the --jobs children, the isolated workers
    if chosen and sys.dont_write_bytecode:  # the user named the folder: that is the opt-in, for every process
        sys.dont_write_bytecode = False
        env.pop("PYTHONDONTWRITEBYTECODE", None)
    if new and say is not None:
        say(f"dflash-parity: {probe} at {there} has no bytecode, so each process compiled its sources again: "
            f"the bytecode is cached in {where} from now on ({ENV}=off: never)")
    return where
