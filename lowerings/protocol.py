"""The interface every lowering implements, built-in or a user's plugin.

A lowering is a production call sequence (a kernel plus its glue) that computes the block attention
of a case. The framework materializes the case, calls `run`, converts the returned LSE from the
declared base to natural log at this boundary, and judges the result against the oracle.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, runtime_checkable

import torch

from oracle.rules import LN2
from oracle.case import Case
from oracle.inputs import Inputs

BASE_E = math.e
BASE_2 = 2.0
NO_LSE = None  # `lse_base = NO_LSE`: `run` returns no LSE (`lse=None`); its output is judged alone


@dataclass(frozen=True)
class Partial:
    """One partial result a lowering exposes before its merge (a split, part A, part B).

    `out [B, K, Hq, D]`, `lse [B, K, Hq]` in base `lse_base`, or `lse=None` with `lse_base=NO_LSE` (None)
    for a partial that has no LSE (its output is judged alone; one without the other fails the lowering);
    the keys it covers are the case's keys under `window` (default: the case's window), restricted, when
    `future_block_keys_right` is set, to the later block keys `j` with `i < j <= min(K-1, i + right)` (part B
    of a windowed merge), or to an explicit `key_mask` (boolean, broadcastable to `[B, K, Hq, T]` over
    absolute key positions).
    """

    out: torch.Tensor
    lse: torch.Tensor | None
    lse_base: float | None
    window: tuple[int, int] | None = None
    future_block_keys_right: int | None = None
    key_mask: torch.Tensor | None = None


@dataclass
class LoweringResult:
    """What `run` returns: `out [B, K, Hq, D]` in the case's dtype, `lse [B, K, Hq]` in the lowering's
    `lse_base` (None exactly when the lowering declares `lse_base = NO_LSE`), and named partials to check
    separately."""

    out: torch.Tensor
    lse: torch.Tensor | None
    partials: dict[str, Partial] = field(default_factory=dict)


@runtime_checkable
class Lowering(Protocol):
    """A lowering adapter.

    - `name`: stable, as users type it (`decode_rows`, `windowed_merge[eager]`, ...).
    - `devices`: device types it runs on (`("cpu", "cuda")`). Enforced before `available()` is asked:
      on a device not listed the lowering is unavailable (`device_refusal`), whatever `available()` says.
    - `lse_base`: base of the LSE `run` returns: `math.e` (torch, flash-attn) or `2.0` (flashinfer,
      trtllm-gen); or `NO_LSE` (None): `run` returns `lse=None` (an output-only kernel: torch SDPA, most
      decode kernels), its output is judged alone and every report says "LSE unchecked". Declared, never
      guessed: an LSE returned against `NO_LSE`, or none against a base, fails the lowering.
    - `deterministic`: whether the same inputs must give the same bits (checked by running twice).
    - `max_compiles`: compilations allowed per shape family over a run (None: nothing is compiled). The
      family is `compile_family(case)` when the lowering defines it, else every shape field except the
      batch size, the lengths, the pages and the seed: those must never trigger a compilation.
    - `available(device)`: `(True, "")` or `(False, why)`: can it run on this machine at all.
    - `supports(case)`: None, or the reason this case is outside what the lowering can express.
    - `expected_calls(case)`: the kernel entry points it must call for `case`, `{name: count}`; any
      other call, or a different count, is a silent fallback.
    - `run(inputs)`: the production call sequence.

    Optional attributes and methods: `OptionalHooks` below (read them with `optional_hook` /
    `optional_attribute`).
    """

    name: str
    devices: tuple[str, ...]
    lse_base: float | None
    deterministic: bool
    max_compiles: int | None

    def available(self, device: str) -> tuple[bool, str]: ...

    def supports(self, case: Case) -> str | None: ...

    def expected_calls(self, case: Case) -> dict[str, int]: ...

    def run(self, inputs: Inputs) -> LoweringResult: ...


class OptionalHooks(Protocol):
    """Every optional attribute the framework reads from a lowering, and who reads it. None is required:
    a lowering without one gets the default (`OPTIONAL_ATTRIBUTES`) or the framework's own rule. Read
    them with `optional_hook(lowering, name)` / `optional_attribute(lowering, name)`, never a bare
    `getattr`: the name is checked against this list. Hooks the framework calls are bounded by the hook
    port (`lowerings.calls.call` / `call_optional`, under the front ends' watchdog): one that raises, exits or hangs fails the lowering.

    - `case_limits(device) -> strategies.Limits | None` (`strategies.limits_for`, `parity.exec.warmup`): bounds
      on what is drawn for it on `device`; a field left None takes the device's default, the production
      dimension (contexts to 128K, model rows) included.
    - `dispatch_boundaries() -> {field: (t, ...)}` (`batch_size`, `context_len` or `keys`;
      `strategies._boundaries`): where its dispatch switches between `t` and `t + 1`; both sides are drawn
      before any random case of every check.
    - `split_boundaries(case) -> ((t, ...), ...)` (`strategies._extremes`): per request, the key positions
      `t` (`0 < t < L_b + K`) where its keys pass from one partial result to the next: the first key of
      each split of a split-KV kernel after the first, of a dense block folded in after the paged context.
      Drawn and boundary cases put the attention mass on the keys either side (`peak` values), where a
      split that drops or double-counts its edge key shows.
    - `compile_family(case) -> tuple` (`parity.engine.runner.compile_family`): the shape family `max_compiles`
      counts per; default: every shape field except the batch size, the lengths, the pages and the seed.
    - `kernel_families(case) -> {call: kernel-name substring}`: the CUDA kernels each counted call must
      launch (checked under torch.profiler on CUDA, one case in `--kernel-names-every`), and kernel keys
      for `tolerances.toml`'s `[kernel."<key>".<dtype>]` entries. Without it, kernel names go unchecked.
    - `forbidden_kernel_families(case) -> {what: kernel-name substring}`: kernels that must not appear
      (fa3 silently replaced by fa2, ...).
    - `jit_modules(case) -> tuple[str, ...]` (`parity.exec.warmup`): the JIT-compiled modules `run` loads for
      `case`, one readable key each; warm-up loads each once before the first case.
    - `writes_given_output` (default False): the lowering writes its result into `inputs.out` and
      `inputs.lse_out` (buffers the framework allocates) and returns them. The runner then gives it
      poisoned, guarded buffers and checks that the returned tensors are those buffers, that every
      element was written, and that nothing was written past either end.
    - `accuracy` (default None): the accuracy class the lowering claims, as kernel keys (a string or a
      tuple of strings, e.g. `"BatchPrefillWithPagedKVCacheKernel"`): the `[kernel."<key>".<dtype>]`
      entries of `tolerances.toml` apply to its cases as if that kernel had run. Kernels it runs apply
      without it (`lowerings.counters.kernel_keys`); the claim is for kernels the framework cannot see.
      Every verdict names the entry that set its bounds and why ("claimed by the lowering's accuracy
      attribute").
    - `prepare(inputs) -> Callable[[], LoweringResult]` (`dflash-parity bench`): does every host-side
      step of `run(inputs)` once (planning, index building, output allocation) and returns a
      zero-argument function that launches only the device work, on the same tensors and buffers every
      call, without host synchronization, so that it can be captured in a CUDA graph and replayed; each
      call returns what `run(inputs)` would (the same buffers every time). A later `prepare` may re-plan
      into the buffers of an earlier one of the same shapes (flashinfer's graph mode does): bench sees
      it (one output buffer, or the first function wrong once the others are prepared) and times one
      input set, the L2 flushed before each replay, instead of one graph per rotating set. Without
      `prepare`, bench times `run` eagerly.
    - `run_output(inputs) -> Tensor` (`parity.engine.case_run.run_yardstick`): the output alone, the same bits
      as `run(inputs).out`, for a lowering that serves as the yardstick (`sdpa`: no LSE computed).
    - `graph_safe` (default False): whether `prepare` is supported (the flashinfer adapters say so; no
      check reads it: `prepare` raising NotImplementedError is what bench acts on).
    - `threshold` (default None; `dflash-parity bench`'s decode-rows table): a dispatching lowering's
      batch threshold (rows when `B <= threshold`); bench forces the rows form on a copy by raising it.
    - `supports_by_shape` (default False; `strategies.repair`): `supports(case)` decides from the case's
      shape and dtype fields, never from which page ids it got. A drawn case the lowering refuses is
      repaired (another window, layout, page size, ...); with this declared, each candidate is asked with
      its pages in pool order and only the one accepted gets its drawn permutation of the pool: the same
      cases, drawn without shuffling a pool per refused candidate (hybrid_paged refuses most draws and
      tried 8-13 candidates a draw, each a shuffle). A `supports` that does read the page ids is caught (the
      accepted candidate is asked again with its own pages) and the draw falls back to the full repair.
    """

    writes_given_output: bool
    accuracy: str | tuple[str, ...] | None
    graph_safe: bool
    threshold: int | None
    supports_by_shape: bool

    def case_limits(self, device: str) -> Any: ...

    def dispatch_boundaries(self) -> dict[str, tuple[int, ...]]: ...

    def split_boundaries(self, case: Case) -> tuple[tuple[int, ...], ...]: ...

    def compile_family(self, case: Case) -> tuple: ...

    def kernel_families(self, case: Case) -> dict[str, str]: ...

    def forbidden_kernel_families(self, case: Case) -> dict[str, str]: ...

    def jit_modules(self, case: Case) -> tuple[str, ...]: ...

    def prepare(self, inputs: Inputs) -> Callable[[], LoweringResult]: ...

    def run_output(self, inputs: Inputs) -> Any: ...


REQUIRED_ATTRIBUTES = ("name", "devices", "lse_base", "deterministic", "max_compiles")
OPTIONAL_METHODS = ("case_limits", "dispatch_boundaries", "split_boundaries", "compile_family", "kernel_families",
                    "forbidden_kernel_families", "jit_modules", "prepare", "run_output")
OPTIONAL_ATTRIBUTES = {"writes_given_output": False, "accuracy": None, "graph_safe": False, "threshold": None,
                       "supports_by_shape": False}


def optional_hook(lowering: object, name: str) -> Callable[..., Any] | None:
    """The lowering's optional method `name` (one of `OPTIONAL_METHODS`), or None when it has none."""
    if name not in OPTIONAL_METHODS:
        raise KeyError(f"{name!r} is not an optional hook of lowerings.protocol.OptionalHooks: {OPTIONAL_METHODS}")
    fn = getattr(lowering, name, None)
    return fn if callable(fn) else None


def optional_attribute(lowering: object, name: str) -> Any:
    """The lowering's optional attribute `name` (a key of `OPTIONAL_ATTRIBUTES`), or its default."""
    if name not in OPTIONAL_ATTRIBUTES:
        raise KeyError(f"{name!r} is not an optional attribute of lowerings.protocol.OptionalHooks: "
                       f"{tuple(OPTIONAL_ATTRIBUTES)}")
    return getattr(lowering, name, OPTIONAL_ATTRIBUTES[name])


def device_refusal(lowering: Lowering, device: str) -> str | None:
    """Why `lowering` is not run on `device` by its own declaration (`devices`), before `available()` is
    asked; None when `device` is one of its `devices`."""
    if device in lowering.devices:
        return None
    return f"{lowering.name} runs on {' and '.join(lowering.devices)} only, not {device}"


def writes_given_output(lowering: object) -> bool:
    """Whether `lowering` declares that it writes into the `out`/`lse_out` buffers it is given."""
    return bool(optional_attribute(lowering, "writes_given_output"))


def accuracy_claims(lowering: object) -> tuple[str, ...]:
    """The kernel keys a lowering's `accuracy` attribute claims (empty when it has none)."""
    acc = optional_attribute(lowering, "accuracy")
    if acc is None:
        return ()
    return (acc,) if isinstance(acc, str) else tuple(acc)


def _accuracy_problem(acc: object) -> str | None:
    if acc is None or (isinstance(acc, str) and acc):
        return None
    if isinstance(acc, tuple) and acc and all(isinstance(k, str) and k for k in acc):
        return None
    return f"'accuracy' must be None, a kernel key (a non-empty string) or a tuple of them, got {acc!r}"


REQUIRED_METHODS = ("available", "supports", "expected_calls", "run")


def protocol_violations(obj: object) -> list[str]:
    """What `obj` lacks to be a `Lowering`, as readable phrases (empty when it is one)."""
    problems = [f"attribute '{a}' is missing" for a in REQUIRED_ATTRIBUTES if not hasattr(obj, a)]
    problems += [f"method '{m}' is missing or not callable" for m in REQUIRED_METHODS
                 if not callable(getattr(obj, m, None))]
    if not problems:
        if not isinstance(obj.name, str) or not obj.name:
            problems.append(f"'name' must be a non-empty string, got {obj.name!r}")
        base = lse_base_problem(obj.lse_base)
        if base:
            problems.append(base)
        if not isinstance(obj.devices, tuple) or not all(d in ("cpu", "cuda") for d in obj.devices):
            problems.append(f"'devices' must be a tuple of 'cpu'/'cuda', got {obj.devices!r}")
        for flag in ("deterministic", "writes_given_output", "graph_safe", "supports_by_shape"):
            v = obj.deterministic if flag == "deterministic" else optional_attribute(obj, flag)
            if not isinstance(v, bool):
                problems.append(f"'{flag}' must be True or False, got {v!r:.100}")
        for count in ("max_compiles", "threshold"):
            v = obj.max_compiles if count == "max_compiles" else optional_attribute(obj, count)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
                problems.append(f"'{count}' must be None or an integer >= 0, got {v!r:.100}")
        acc = _accuracy_problem(optional_attribute(obj, "accuracy"))
        if acc:
            problems.append(acc)
    return problems


def lse_base_problem(base: object, what: str = "'lse_base'") -> str | None:
    """Why `base` is no LSE base declaration (None when it is one: `BASE_E`, `BASE_2` or `NO_LSE`)."""
    if base is NO_LSE or (isinstance(base, (int, float)) and not isinstance(base, bool) and base in (BASE_E, BASE_2)):
        return None
    return (f"{what} must be math.e or 2.0 (the base of the LSE run returns), or None when run returns no LSE "
            f"(lse=None: the output is judged alone, the LSE reported unchecked), got {base!r}")


def returns_lse(lowering: object) -> bool:
    """Whether `lowering` declares an LSE (`lse_base` e or 2); False for `lse_base = NO_LSE`."""
    return getattr(lowering, "lse_base", NO_LSE) is not NO_LSE


def lse_name(base: float | None) -> str:
    """`"2"`, `"e"`, or `"none"` (`NO_LSE`): a declared base as users read it."""
    return "none" if base is NO_LSE else ("2" if base == BASE_2 else "e")


def lse_to_natural(lse: torch.Tensor, base: float) -> torch.Tensor:
    """Convert an LSE in `base` to natural log (`log2 x = ln x / ln 2`, so `ln x = log2 x * ln 2`)."""
    return lse * LN2 if base == BASE_2 else lse


def lse_from_natural(lse: torch.Tensor, base: float) -> torch.Tensor:
    return lse / LN2 if base == BASE_2 else lse
