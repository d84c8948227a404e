"""What a lowering's hooks may answer, checked where the answer enters the framework.

Each checker takes a hook's answer and returns None when it is of the right kind, else what was expected (one
phrase); `lowerings.calls.call(..., expect=checker)` turns that into `HookFailure`: "`hook() returned X, expected
Y`". A hook's answer of the wrong type (`supports()` returning True, `expected_calls()` returning None) is that
lowering's failure, never read loosely (`supports()` returning False read as "supported"). `strategies` checks
`case_limits` and `dispatch_boundaries` the same way (it owns their types); `parity.engine.answers` checks what
`run()` returns.

Public: `supports_answer`, `available_answer`, `expected_calls_answer`, `compile_family_answer`,
`kernel_families_answer`, `jit_modules_answer`, `availability`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Callable

from lowerings.calls import HookFailure, shown

Checker = Callable[[Any], "str | None"]


def _is_int(v: Any, least: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= least


def supports_answer(value: Any) -> str | None:
    """`supports(case)`: None (supported) or the reason it is not, a non-empty string."""
    if value is None or (isinstance(value, str) and value):
        return None
    return "None (supported) or the reason it is not (a non-empty string)"


def available_answer(value: Any) -> str | None:
    """`available(device)`: `(True, "")` or `(False, why)`: a bool and a string."""
    if isinstance(value, (tuple, list)) and len(value) == 2 and isinstance(value[0], bool) \
            and isinstance(value[1], str):
        return None
    return "(bool, str)"


def expected_calls_answer(value: Any) -> str | None:
    """`expected_calls(case)`: `{kernel call name: count}`, names non-empty strings, counts integers >= 0."""
    if isinstance(value, Mapping) and all(isinstance(k, str) and k and _is_int(v, 0) for k, v in value.items()):
        return None
    return "a dict {kernel call name (str): count (int >= 0)}"


def compile_family_answer(value: Any) -> str | None:
    """`compile_family(case)`: a tuple (or list) of hashable values: the key its compilations are counted by."""
    if not isinstance(value, (tuple, list)):
        return "a tuple of hashable values (the shape family)"
    try:
        hash(tuple(value))
    except Exception as err:  # noqa: BLE001  (unhashable, or a plugin's __hash__ raising)
        return f"a tuple of hashable values (the shape family; {err})"
    return None


def kernel_families_answer(value: Any) -> str | None:
    """`kernel_families(case)` / `forbidden_kernel_families(case)`: `{name: kernel-name substring}`, both
    non-empty strings (an empty substring would match every kernel: a check that cannot fail)."""
    if isinstance(value, Mapping) and all(isinstance(k, str) and k and isinstance(v, str) and v
                                          for k, v in value.items()):
        return None
    return "a dict {call (str): kernel-name substring (a non-empty str)}"


def jit_modules_answer(value: Any) -> str | None:
    """`jit_modules(case)`: a tuple (or list) of module keys, non-empty strings."""
    if isinstance(value, (tuple, list)) and all(isinstance(k, str) and k for k in value):
        return None
    return "a tuple of module keys (non-empty strings)"


def availability(lowering_name: str, answer: Any) -> tuple[bool, str]:
    """`available()`'s answer as `(ok, why)`; anything but a pair (bool, str) raises HookFailure."""
    wanted = available_answer(answer)
    if wanted is not None:
        raise HookFailure(lowering_name, "available", f"available() returned {shown(answer)}, expected {wanted}")
    return answer[0], answer[1]
