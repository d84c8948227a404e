"""Observe flashinfer's public calls, whoever makes them: kernel identity for tolerances.

A user's lowering that calls flashinfer directly records nothing through `lowerings.counters`. So that a
`[kernel."<key>".<dtype>]` entry of `tolerances.toml` applies to it all the same, `ensure_observed()` wraps
flashinfer's public entry points (once per class or module) to `counters.observe(name)` on each call,
under the names the project's adapters record:

- `BatchPrefillWithPagedKVCacheWrapper.run` / `.run_return_lse`: `flashinfer.BatchPrefill[<backend>].run`,
  the backend the wrapper resolved at `plan()` (`fa2`, `fa3`; `auto` when it never planned);
- `BatchDecodeWithPagedKVCacheWrapper.run` / `.run_return_lse`: `flashinfer.BatchDecode.run` (CUDA cores),
  `flashinfer.BatchDecode[tc].run` (tensor cores: the fa2 prefill kernel), `flashinfer.BatchDecode[tc-fa3].run`
  when the tensor-core path resolved to fa3;
- `merge_state_in_place` (on `flashinfer` and `flashinfer.cascade`): `flashinfer.merge_state_in_place`.

Observed calls land in a channel of their own (`KernelCounter.observed`): the exact `expected_calls`
comparison never reads them, so the project's adapters, which record the same names, raise no false
silent-fallback alarm. `install_import_hook()` wraps them as soon as `import flashinfer` completes, so the
first call of a lowering that imports flashinfer inside `run` is seen too.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import sys
from typing import Any, Callable

from lowerings import counters
from lowerings.flashinfer.names import C_DECODE, C_DECODE_TC, C_MERGE_STATE, c_prefill

MARK = "_dflash_parity_observed"
PREFILL_CLASS, DECODE_CLASS = "BatchPrefillWithPagedKVCacheWrapper", "BatchDecodeWithPagedKVCacheWrapper"
METHODS = ("run", "run_return_lse")


def prefill_call_name(wrapper: Any) -> str:
    return c_prefill(getattr(wrapper, "_backend", None) or "auto")


def decode_call_name(wrapper: Any) -> str:
    if not getattr(wrapper, "_use_tensor_cores", False):
        return C_DECODE
    backend = getattr(wrapper, "_backend", None)
    return C_DECODE_TC if backend in (None, "auto", "fa2") else f"flashinfer.BatchDecode[tc-{backend}].run"


def _observed_method(cls: type, attr: str, namer: Callable[[Any], str]) -> None:
    fn = cls.__dict__.get(attr)
    if fn is None or getattr(fn, MARK, False):
        return

    def observed(self, *args: Any, **kwargs: Any) -> Any:
        counters.observe(namer(self))
        return fn.__get__(self, type(self))(*args, **kwargs)  # a function or a functools.partialmethod

    functools.update_wrapper(observed, fn)  # a partialmethod has no __name__: skipped, set below
    observed.__name__ = attr
    setattr(observed, MARK, True)
    setattr(cls, attr, observed)


def _observed_function(module: Any, attr: str, name: str) -> None:
    fn = getattr(module, attr, None)
    if fn is None or getattr(fn, MARK, False):
        return

    @functools.wraps(fn)
    def observed(*args: Any, **kwargs: Any) -> Any:
        counters.observe(name)
        return fn(*args, **kwargs)

    setattr(observed, MARK, True)
    setattr(module, attr, observed)


def ensure_observed() -> bool:
    """Wrap flashinfer's public entry points if flashinfer is imported (idempotent; a few dict lookups).
    Returns whether flashinfer is imported."""
    fi = sys.modules.get("flashinfer")
    if fi is None:
        return False
    for cls_name, namer in ((PREFILL_CLASS, prefill_call_name), (DECODE_CLASS, decode_call_name)):
        cls = getattr(fi, cls_name, None)
        if isinstance(cls, type):
            for attr in METHODS:
                _observed_method(cls, attr, namer)
    for module in (fi, sys.modules.get("flashinfer.cascade")):
        if module is not None:
            _observed_function(module, "merge_state_in_place", C_MERGE_STATE)
    return True


class _ObserveOnImport(importlib.abc.MetaPathFinder):
    """Finds `flashinfer` with the other finders, and calls `ensure_observed` once its import completes."""

    def __init__(self) -> None:
        self.busy = False

    def find_spec(self, fullname: str, path: Any = None, target: Any = None):
        if fullname != "flashinfer" or self.busy:
            return None
        self.busy = True
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self.busy = False
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return None
        exec_module = loader.exec_module

        def exec_and_observe(module: Any) -> None:
            exec_module(module)
            ensure_observed()

        loader.exec_module = exec_and_observe
        return spec


def install_import_hook() -> None:
    """Observe flashinfer from the moment it is imported (idempotent)."""
    if not any(isinstance(f, _ObserveOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _ObserveOnImport())
