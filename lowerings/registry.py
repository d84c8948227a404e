"""The registry of lowerings: the built-ins (`lowerings.builtins`) are registered on first use; a user's plugin
file calls `register`."""

from __future__ import annotations

import contextlib
import importlib.util
import sys
from pathlib import Path
from typing import Iterable, Iterator

from lowerings.protocol import Lowering, protocol_violations
from oracle.errors import InvalidInput

_REGISTRY: dict[str, Lowering] = {}


def register(lowering: Lowering, *, replace: bool = False) -> Lowering:
    """Add a lowering under its `name`; a duplicate name is an error unless `replace=True`."""
    problems = protocol_violations(lowering)
    if problems:
        raise InvalidInput(f"lowering {getattr(lowering, 'name', lowering)!r}",
                           "does not satisfy lowerings.protocol.Lowering: " + "; ".join(problems))
    if lowering.name in _REGISTRY and not replace:
        raise InvalidInput(f"lowering {lowering.name!r}", "is already registered; pick another name or pass replace=True")
    _REGISTRY[lowering.name] = lowering
    return lowering


def unregister(name: str) -> None:
    _REGISTRY.pop(name, None)


def register_new(lowerings: Iterable[Lowering]) -> list[str]:
    """Register each of `lowerings` whose name is not registered yet (the others are kept); returns the
    names this call added."""
    _load_builtins()
    added = []
    for lowering in lowerings:
        if lowering.name not in _REGISTRY:
            register(lowering)
            added.append(lowering.name)
    return added


@contextlib.contextmanager
def restored() -> Iterator[None]:
    """The registry as it was before the block (lowerings registered or removed inside it are undone)."""
    _load_builtins()
    saved = dict(_REGISTRY)
    try:
        yield
    finally:
        _REGISTRY.clear()
        _REGISTRY.update(saved)


def get(name: str) -> Lowering:
    _load_builtins()
    if name not in _REGISTRY:
        raise InvalidInput("--lowering", f"unknown lowering {name!r}; known: {', '.join(names())}")
    return _REGISTRY[name]


def names() -> list[str]:
    _load_builtins()
    return sorted(_REGISTRY)


def all_lowerings() -> list[Lowering]:
    return [get(n) for n in names()]


def load_plugin(path: str | Path) -> list[str]:
    """Import a user's file that calls `register(...)`; returns the names it added."""
    p = Path(path)
    if not p.is_file():
        raise InvalidInput(f"--plugin {path}", "file not found")
    _load_builtins()
    before = set(_REGISTRY)
    mod_name = f"dflash_parity_plugin_{abs(hash(str(p.resolve())))}"
    spec = importlib.util.spec_from_file_location(mod_name, p)
    if spec is None or spec.loader is None:
        raise InvalidInput(f"--plugin {path}", "not an importable Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    try:
        spec.loader.exec_module(module)
    except InvalidInput as err:
        raise InvalidInput(f"--plugin {path}", str(err)) from None
    except Exception as err:  # the user's code: report it, do not crash
        raise InvalidInput(f"--plugin {path}", f"raised {type(err).__name__} on import: {err}") from None
    added = sorted(set(_REGISTRY) - before)
    if not added:
        raise InvalidInput(f"--plugin {path}", "registered no lowering (call lowerings.register(...) in it)")
    return added


_BUILTINS_LOADED = False
_BUILTINS: dict[str, Lowering] = {}  # the built-in instances as registered


def changed_here() -> list[str]:
    """The names whose registration differs from the built-ins alone (a plugin's or a test's lowering added, a
    built-in replaced or removed), sorted."""
    _load_builtins()
    names_ = set(_REGISTRY) | set(_BUILTINS)
    return sorted(n for n in names_ if _REGISTRY.get(n) is not _BUILTINS.get(n))


def _load_builtins() -> None:
    global _BUILTINS_LOADED
    if _BUILTINS_LOADED:
        return
    _BUILTINS_LOADED = True
    from lowerings.builtins import builtin_lowerings

    for lowering in builtin_lowerings():
        register(lowering)
        _BUILTINS[lowering.name] = lowering
