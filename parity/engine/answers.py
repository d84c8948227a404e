"""What a lowering's `run()` may give back, checked where it enters the framework (its hooks' answers:
`lowerings.answers`, re-exported here).

A hook's answer of the wrong type (`supports()` returning True, `expected_calls()` returning None, ...) and a
`run()` result with a tensor on the wrong device (`meta`), of the wrong shape or dtype, or of the wrong type are
that lowering's failure, with a message naming the hook or the field and what was expected; never a traceback
that ends the run, and never an answer read loosely (`supports()` returning False read as "supported").

- The hook checkers (`supports_answer`, `available_answer`, `expected_calls_answer`, `compile_family_answer`,
  `kernel_families_answer`, `jit_modules_answer`) take an answer and return None when it is of the right kind,
  else what was expected (one phrase); `parity.exec.hooks.call(..., expect=checker)` turns that into `HookFailure`:
  "`hook() returned X, expected Y`". `strategies` checks `case_limits` and `dispatch_boundaries` the same way
  (it owns their types).
- `result_problem(lowering, inputs, result)`: None for a `LoweringResult` the judge can read (`out` `[B, K, Hq,
  D]` in the case's dtype, `lse` `[B, K, Hq]` floating, both strided on the inputs' device; each partial the
  same, with a declared LSE base, a window, a right bound and a key mask of the kinds `Partial` documents),
  else the first problem, one line naming the field (`parity.engine.invocation.call_lowering` raises it as the
  lowering's failure).

Public: `supports_answer`, `available_answer`, `expected_calls_answer`, `compile_family_answer`,
`kernel_families_answer`, `jit_modules_answer`, `availability`, `result_problem`, `tensor_problem`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from lowerings.protocol import BASE_2, BASE_E, NO_LSE, LoweringResult, Partial, lse_name
from oracle.inputs import Inputs
from lowerings.answers import (  # noqa: F401  (the hook checkers, public here too)
    Checker, availability, available_answer, compile_family_answer, expected_calls_answer, jit_modules_answer,
    kernel_families_answer, supports_answer)

# ---- run()'s result ---------------------------------------------------------------------------------------

def _is_int(v: Any, least: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= least


def tensor_problem(field: str, t: Any, *, shape: tuple[int, ...], device: torch.device,
                   dtype: torch.dtype | None = None) -> str | None:
    """Why `t` cannot stand for `field` (a strided tensor of `shape` on `device`, of `dtype`, or floating when
    `dtype` is None); None when it can."""
    if not isinstance(t, torch.Tensor):
        return f"{field} is of type {type(t).__name__}, expected a torch.Tensor"
    if t.layout != torch.strided:
        return f"{field} has layout {t.layout}, expected a dense (strided) tensor"
    if t.device != device:
        return f"{field} is on device {t.device}, expected the inputs' device {device}"
    if dtype is None and not t.is_floating_point():
        return f"{field} has dtype {t.dtype}, expected a floating-point dtype"
    if tuple(t.shape) != shape:
        return f"{field} has shape {tuple(t.shape)}, expected {shape}"
    return None


def _partial_problem(key: Any, part: Any, inputs: Inputs) -> str | None:
    B, K, Hq, D = inputs.q.shape
    where = f"partials[{key!r}]"
    if not isinstance(key, str) or not key:
        return f"partials has the key {key!r}, expected non-empty strings"
    if not isinstance(part, Partial):
        return f"{where} is of type {type(part).__name__}, expected a lowerings.protocol.Partial"
    dev = inputs.q.device
    if part.lse_base is not NO_LSE and part.lse_base not in (BASE_E, BASE_2):
        return f"{where}.lse_base is {part.lse_base!r}, expected math.e or 2.0, or None (no LSE)"
    bad = (tensor_problem(f"{where}.out", part.out, shape=(B, K, Hq, D), device=dev)
           or lse_declared_problem(f"{where}: ", part.lse_base, part.lse)
           or (part.lse is not None and tensor_problem(f"{where}.lse", part.lse, shape=(B, K, Hq), device=dev)))
    if bad:
        return bad
    w = part.window
    if w is not None and not (isinstance(w, (tuple, list)) and len(w) == 2 and all(_is_int(x, -1) for x in w)):
        return f"{where}.window is {w!r:.100}, expected None or a pair (left, right) of integers >= -1"
    fbk = part.future_block_keys_right
    if fbk is not None and not _is_int(fbk, -1):
        return f"{where}.future_block_keys_right is {fbk!r:.100}, expected None or an integer >= -1"
    m = part.key_mask
    if m is not None:
        if not isinstance(m, torch.Tensor) or m.dtype != torch.bool or m.layout != torch.strided or m.device != dev:
            what = f"a {m.dtype} tensor on {m.device}" if isinstance(m, torch.Tensor) else f"of type {type(m).__name__}"
            return f"{where}.key_mask is {what}, expected a boolean tensor on the inputs' device {dev}"
        full = (B, K, Hq, inputs.case.max_keys)
        try:
            ok = torch.broadcast_shapes(tuple(m.shape), full) == full
        except RuntimeError:
            ok = False
        if not ok:
            return f"{where}.key_mask has shape {tuple(m.shape)}, expected one broadcastable to [B, K, Hq, T] = {full}"
    return None


def lse_declared_problem(what: str, base: Any, lse: Any) -> str | None:
    """An LSE that contradicts its declared base (None when none does): a base declared and no LSE returned (it would
    go unchecked), or `NO_LSE` declared and an LSE returned (it would be ignored, unchecked)."""
    if lse is None and base is not NO_LSE:
        return (f"{what}declared lse_base {lse_name(base)} but returned no LSE (lse=None): the LSE would go "
                f"unchecked; a kernel that computes no LSE declares lse_base = None (lowerings.NO_LSE)")
    if lse is not None and base is NO_LSE:
        return (f"{what}declared lse_base None (no LSE) but returned an LSE: it would go unchecked; declare "
                f"its base (math.e or 2.0) so that it is judged, or return lse=None")
    return None


def result_problem(lowering: Any, inputs: Inputs, result: Any) -> str | None:
    """Why `result` (what `lowering.run(inputs)` returned) cannot be judged, one line starting with the
    lowering's name; None when it can (see the module docstring)."""
    name = lowering.name
    if not isinstance(result, LoweringResult):
        return f"{name}.run returned {type(result).__name__}, expected LoweringResult"
    q = inputs.q
    B, K, Hq, D = q.shape
    out = result.out
    if isinstance(out, torch.Tensor) and out.dtype != q.dtype:
        return f"{name}: output dtype {out.dtype}, expected the case's {q.dtype}"
    bad = tensor_problem("out", out, shape=(B, K, Hq, D), device=q.device, dtype=q.dtype)
    if bad:
        return f"{name}: {bad}"
    bad = lse_declared_problem("", lowering.lse_base, result.lse)
    if bad:
        return f"{name}: {bad}"
    if result.lse is not None:
        bad = tensor_problem("lse", result.lse, shape=(B, K, Hq), device=q.device)
        if bad:
            return f"{name}: {bad}"
    if not isinstance(result.partials, Mapping):
        return f"{name}: partials is of type {type(result.partials).__name__}, expected a dict {{name: Partial}}"
    for key, part in result.partials.items():
        bad = _partial_problem(key, part, inputs)
        if bad:
            return f"{name}: {bad}"
    return None
