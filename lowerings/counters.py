"""Kernel-call and compile counters: catch a right answer computed by the wrong kernel.

Every lowering reports each kernel entry point it calls with `record(name)` (or wraps the function
with `counted(name)`); a `KernelCounter` context collects them. The framework compares the counts
with the lowering's `expected_calls(case)`: any other kernel, or another count, is a silent fallback.
Compilations (a Triton JIT specialization, a torch.compile graph) are reported with
`record_compile(name)` and bounded per lowering over a whole run.

Kernel identity for tolerances: `observe(name)` records a call seen from outside the lowering (flashinfer's
public wrappers, `lowerings.flashinfer_observer`) into a separate channel that the exact call comparison
never reads; `declare_kernel(call, kernel)` maps a call name to the kernel family it launches (the CUDA
kernel name torch.profiler lists); `kernel_keys` turns what a case ran into the keys that
`[kernel."<key>".<dtype>]` entries of `tolerances.toml` match.
"""

from __future__ import annotations

import functools
import threading
from collections import Counter
from typing import Any, Callable, TypeVar

_local = threading.local()
F = TypeVar("F", bound=Callable[..., Any])


class KernelCounter:
    """Context manager: `with KernelCounter() as kc: ...; kc.calls == {"decode": 1}`.

    Nested counters all see every call. `details[name]` keeps what each call reported (rows, ...).
    """

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.observed: Counter[str] = Counter()  # `observe`: for kernel identity only, never compared
        self.compiles: Counter[str] = Counter()
        self.details: dict[str, list[dict[str, Any]]] = {}

    def __enter__(self) -> "KernelCounter":
        _stack().append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        _stack().remove(self)


def _stack() -> list[KernelCounter]:
    if not hasattr(_local, "stack"):
        _local.stack = []
    return _local.stack


def record(name: str, count: int = 1, **detail: Any) -> None:
    """Report `count` calls of kernel entry point `name` (with optional detail such as `rows=`)."""
    for kc in _stack():
        kc.calls[name] += count
        if detail:
            kc.details.setdefault(name, []).append(detail)


def observe(name: str) -> None:
    """Report one call of `name` seen from outside the lowering (not an entry point it declares)."""
    for kc in _stack():
        kc.observed[name] += 1


_KERNEL_OF_CALL: dict[str, str] = {}


def declare_kernel(call: str, kernel: str) -> None:
    """Declare that call name `call` launches kernel family `kernel` (e.g. the fa2 prefill kernel for
    `flashinfer.BatchDecode[tc].run`): a tolerance entry keyed by the kernel then applies to the call."""
    if not call or not kernel:
        raise ValueError(f"declare_kernel: two non-empty names, got {call!r}, {kernel!r}")
    _KERNEL_OF_CALL[call] = kernel


def kernel_of_call(call: str) -> str | None:
    return _KERNEL_OF_CALL.get(call)


def kernel_keys(calls: dict[str, int], observed: dict[str, int] | None = None,
                families: dict[str, str] | None = None, accuracy: tuple[str, ...] = ()) -> dict[str, str]:
    """The kernel keys of one case, each with why: every call it recorded and every call observed, the
    kernel family each of those launches (`declare_kernel`, or the lowering's own `kernel_families(case)`
    passed as `families`), and the keys the lowering claims with its `accuracy` attribute."""
    keys: dict[str, str] = {}
    families = families or {}
    for how, names in (("called", calls), ("observed", observed or {})):
        for name in sorted(n for n, v in names.items() if v):
            keys.setdefault(name, f"{how} {name}")
            kernel = families.get(name) or _KERNEL_OF_CALL.get(name)
            if kernel:
                keys.setdefault(kernel, f"kernel {kernel} ran ({how} {name})")
    for key in accuracy:
        keys.setdefault(key, f"claimed by the lowering's accuracy attribute ({key})")
    return keys


def record_compile(name: str) -> None:
    """Report one compilation of kernel `name`."""
    for kc in _stack():
        kc.compiles[name] += 1


def counted(name: str) -> Callable[[F], F]:
    """Decorator: every call of the function records one call of `name`."""

    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def inner(*args: Any, **kwargs: Any) -> Any:
            record(name)
            return fn(*args, **kwargs)

        return inner  # type: ignore[return-value]

    return wrap


def triton_compiled_variants(*kernels: Any) -> int:
    """Compiled variants held by Triton `JITFunction`s (0 for interpreted kernels, which never compile)."""
    n = 0
    for k in kernels:
        caches = getattr(k, "device_caches", None)
        if caches is None:
            continue
        for entry in list(caches.values()):
            cache = entry[0] if isinstance(entry, tuple) else entry
            n += len(cache) if hasattr(cache, "__len__") else 0
    return n


class count_triton_compiles:
    """Context manager: every Triton variant the `kernels` compile inside it is a `record_compile(name)`."""

    def __init__(self, name: str, *kernels: Any) -> None:
        self.name, self.kernels = name, kernels

    def __enter__(self) -> "count_triton_compiles":
        self.before = triton_compiled_variants(*self.kernels)
        return self

    def __exit__(self, *exc: object) -> None:
        for _ in range(triton_compiled_variants(*self.kernels) - self.before):
            record_compile(self.name)


def kernel_name_failures(seen: list[str], expected: dict[str, str], forbidden: dict[str, str]) -> list[str]:
    """GPU kernel names seen by the profiler against what a lowering declares: every expected family
    (label -> name substring) must appear, no forbidden one may."""
    msgs = []
    for label, sub in expected.items():
        if not any(sub in k for k in seen):
            msgs.append(f"GPU kernels: expected {label} ({sub!r}) never ran")
    for label, sub in forbidden.items():
        hits = [k for k in seen if sub in k]
        if hits:
            msgs.append(f"GPU kernels: silent fallback, {label} ran: {hits[0][:120]}")
    if msgs:
        msgs.append("kernels seen: " + ", ".join(sorted({k[:60] for k in seen}))[:600])
    return msgs


def call_mismatch(expected: dict[str, int], actual: dict[str, int]) -> str | None:
    """None when the calls match, else a message naming the expected and the actual kernels."""
    exp = {k: v for k, v in expected.items() if v}
    act = {k: v for k, v in actual.items() if v}
    if exp == act:
        return None

    def fmt(d: dict[str, int]) -> str:
        return ", ".join(f"{k} x{v}" for k, v in sorted(d.items())) or "nothing"

    missing = sorted(set(exp) - set(act))
    extra = sorted(set(act) - set(exp))
    hint = ""
    if missing and extra:
        hint = f" (silent fallback: {', '.join(missing)} replaced by {', '.join(extra)})"
    elif missing:
        hint = f" (never called: {', '.join(missing)})"
    elif extra:
        hint = f" (unexpected: {', '.join(extra)})"
    return f"kernel calls: expected {fmt(exp)}, got {fmt(act)}{hint}"
