"""The framework's own Triton kernels compiled before a check's first case, side by side across a run's processes.

Every case runs the case builder's kernel (`oracle._values_kernel`) and the oracle's (`oracle._fast_kernel`). On a
cold Triton cache each process of a run compiled their variants as its cases first needed them, one at a time,
and a process that needed a variant another one was compiling waited for it (`parity.exec.shared_compile_cache`):
on a cold GPU runner these compiles and the waits for them were most of the time lines of the lowerings that built
no flashinfer module.

`precompile(limits, device)` goes over every variant a lowering's cases can launch under its limits, in the
limits' dtypes, KV dtypes and head dims (those of the production rows it draws too): a tiny case each
(`oracle.inputs.warm_build_cases`, `oracle.reference.triton_variant_cases`), built and, for the oracle's,
attended. Each process starts at its own place in that list (`start`: the lowering's name and shard) and,
under `SharedCompileCache.not_waiting`, compiles what no other process is compiling and leaves for later what
one is, going over what is left (`run_pending`). So N processes compile the variants N at a time. It changes no
compiled code and no case: the same kernels, compiled earlier.

A variant run here leaves a marker of its own (`variant-<digest>`), and a process skips the variants others have
marked: it no longer loads them (its cases load the few they launch; in an isolated check the worker, not this
process, runs the cases). It still goes over what is left until every variant is marked, so that no case waits
for a compile. Leaving the held ones to their holders instead was tried in the CPU simulation and rejected: an
oracle variant is held whenever the builder variant its case needs is, so half the processes left at once and
the other half compiled everything (`markers+leave` in the lab's schedule simulation). What each schedule did on a
GPU runner: docs/performance.md ("precompile").

Once every variant is in the cache a marker says so, next to Triton's entries (`<cache>/dflash-parity/`,
named by a digest of triton, torch, the GPU, the kernels' and launchers' sources and the variants): a later
run finds it and skips all this (one `stat`). A variant that fails to compile is reported, not raised: the
cases that launch it fail with the error, where it belongs.

Public: `precompile(limits, device, *, start="") -> Precompiled` (`Precompiled.line()` says what it did),
`precompile_for_check`, `variant_cases`, `run_pending`.
"""

from __future__ import annotations

import contextlib
import hashlib
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

POLL_S = (0.02, 0.2)  # the first and longest pause when every variant left is being compiled by another process
_done: set[str] = set()  # markers this process found or wrote (a later lowering of the same limits: nothing to do)
_SOURCES = ("oracle/_fast_kernel.py", "oracle/_stats_kernel.py", "oracle/_finish_kernel.py", "oracle/_paged_tile.py",
            "oracle/_fast.py", "oracle/_values_kernel.py", "oracle/_device_values.py",
            "oracle/inputs.py")  # the kernels and their launchers: what their specializations follow


@dataclass
class Precompiled:
    """What `precompile` did: `units` variants gone over, `ran` of them run here (`compiled`: the kernels this process
    compiled; the rest of those it ran, loaded), `left` still being compiled by other processes when it was done
    (the rest compiled by others: not loaded here), `seconds`, `skipped` (why nothing was done: the marker was
    there, not a GPU, ...) and `errors` ("case: ExceptionType: first line")."""

    units: int = 0
    compiled: int = 0
    ran: int = 0
    left: int = 0
    seconds: float = 0.0
    skipped: str | None = None
    errors: list[str] = field(default_factory=list)

    def charge(self, report: Any) -> Any:
        """Count these seconds in the lowering's `report` (a `LoweringReport`): its `precompile` phase and its wall,
        so that its cases per second include the compiles its cases no longer pay (returns the report)."""
        if self.seconds > 0:
            report.phases["precompile"] = report.phases.get("precompile", 0.0) + self.seconds
            report.seconds += self.seconds
        return report

    def line(self) -> str:
        if self.skipped:
            return f"the oracle's and the case builder's kernels: {self.skipped}"
        others = self.units - self.ran - self.left
        text = (f"the oracle's and the case builder's kernels: {self.units} variants gone over in {self.seconds:.1f} s "
                f"({self.ran} run here, {self.compiled} kernels compiled here; {others} compiled by other processes"
                + (f", {self.left} still compiling there" if self.left else "") + ")")
        if self.errors:
            text += f"; {len(self.errors)} could not be compiled (their cases will say why): {self.errors[0]}"
        return text


def variant_cases(limits: Any) -> list[tuple[str, Any]]:
    """`[("build" | "oracle" | "golden" | "yardstick", Case)]`: a tiny case per variant of the builder's and the
    oracle's kernels that cases drawn under `limits` (a resolved `strategies.Limits`) launch, the production rows it
    draws included (the golden reference's `F64` variants, `parity.engine.golden`; the yardstick's `ROUND_P` ones,
    `oracle.reference.working_dtype_output`)."""
    from oracle.inputs import warm_build_cases
    from oracle.reference import triton_variant_cases
    from strategies import MODELS

    rows = [m for m in MODELS if m.name in (limits.models or ())] if limits.max_production_context else []
    head_dims = tuple(dict.fromkeys([*limits.head_dims, *(m.head_dim for m in rows)]))
    max_block = max([limits.max_block, *(m.block_size for m in rows)])
    max_group = max([limits.max_group, *(m.group for m in rows)])
    build = [("build", c) for c in warm_build_cases() if c.dtype in limits.dtypes]
    oracle = triton_variant_cases(head_dims, limits.dtypes, limits.kv_dtypes, max_block, max_group)
    golden = triton_variant_cases(head_dims, limits.dtypes, limits.kv_dtypes, max_block, max_group, f64=True)
    return (build + [("oracle", c) for c in oracle] + [("golden", c) for c in golden]
            + [("yardstick", c) for c in oracle])


def precompile(limits: Any, device: str, *, start: str = "", clock: Callable[[], float] = time.perf_counter,
               sleep: Callable[[float], None] = time.sleep) -> Precompiled:
    """Compile (or load) every variant of `variant_cases(limits)` on `device` before the first case, starting at
    the place `start` hashes to (see the module docstring). Nothing to do but on CUDA, compiled Triton."""
    rep = Precompiled()
    if not str(device).startswith("cuda"):
        rep.skipped = "nothing to compile off the GPU"
        return rep
    try:
        import triton  # noqa: F401
    except ImportError:
        rep.skipped = "triton is not installed (the oracle runs its torch engine)"
        return rep
    import torch

    if not torch.cuda.is_available():
        rep.skipped = "no CUDA device here (the cases will say so)"
        return rep
    units = variant_cases(limits)
    try:
        base = _base_digest(device)
        marker = _marker(units, base)
    except Exception:  # noqa: BLE001  (no marker: the variants are gone over, loads only where compiled)
        base, marker = None, None
    if marker is not None and (str(marker) in _done or marker.exists()):
        _done.add(str(marker))
        rep.skipped = "every variant compiled already (an earlier run's marker)"
        return rep
    t0 = clock()
    i = zlib.crc32(start.encode()) % len(units) if units else 0
    order = units[i:] + units[:i]
    rep.units = len(order)
    before = _kernels_compiled_here()
    done = mark = None
    if marker is not None:
        def done(kind: str, case: Any) -> bool:
            return _unit_marker(marker, base, kind, case).exists()

        def mark(kind: str, case: Any) -> None:
            with contextlib.suppress(OSError):  # a read-only cache: others load it instead
                path = _unit_marker(marker, base, kind, case)
                path.parent.mkdir(parents=True, exist_ok=True)
                path.touch()

    ran = []

    def run_here(kind: str, case: Any) -> None:
        _run_unit(kind, case, device)
        ran.append(kind)

    rep.errors = run_pending(order, run_here, clock=clock, sleep=sleep, done=done, mark=mark)
    rep.compiled = _kernels_compiled_here() - before
    rep.ran = len(ran)
    rep.left = sum(1 for kind, case in order if not done(kind, case)) if done is not None else 0
    rep.seconds = clock() - t0
    if not rep.errors and not rep.left and marker is not None:
        try:
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.write_text(f"{len(order)} variants\n")
            _done.add(str(marker))
        except OSError:
            pass  # a read-only cache: the next run goes over the variants again (loads only)
    return rep


def precompile_for_check(limits: Any, device: str, start: str, say: Callable[[str], None],
                         warn: Callable[[str], None]) -> Precompiled:
    """`precompile` before a check's first case (`parity.front.session`): its line said, a variant that failed warned of."""
    try:
        rep = precompile(limits, device, start=start)
    except Exception as exc:  # noqa: BLE001  (a helper of speed only: the check goes on, its cases compile)
        warn(f"dflash-parity: warning: could not precompile the oracle's kernels: {type(exc).__name__}: {exc}")
        return Precompiled(skipped=f"failed: {type(exc).__name__}")
    if rep.errors:
        warn(f"dflash-parity: warning: {rep.line()}")
    elif rep.units:
        say(f"  {rep.line()}")
    return rep


def run_pending(units: list[tuple[str, Any]], run_unit: Callable[[str, Any], None], *,
                clock: Callable[[], float] = time.perf_counter, sleep: Callable[[float], None] = time.sleep,
                done: Callable[[str, Any], bool] | None = None, mark: Callable[[str, Any], None] | None = None,
                leave_held: bool = False) -> list[str]:
    """Run `run_unit(kind, case)` for each of `units` under `SharedCompileCache.not_waiting`, going over those that
    raised `Busy` (another process compiles one of their kernels) again and again until none is left: a process
    never waits while there is a variant it can compile. Returns the errors ("kind dtype/kv D= K= G=: Type: line").

    `done(kind, case)`: the unit was run by another process (its marker), so it is skipped, asked just before it
    would run; `mark(kind, case)`: called after a unit ran here. `leave_held`: once every unit left is held by
    another process, stop (they are left to their holders) instead of pausing for them (`precompile` does not:
    see the module docstring).

    Waiting on the held one instead (the first way) made the processes trail one another: the one ahead took each
    next variant first, one process compiling most entries and others none. Where every unit left is held, a pause (`POLL_S`, doubling); after
    `WAIT_S` with no progress, they are run waiting for their holders (the shared cache's own give-up then applies).
    Public for `lab/bench_precompile_schedule.py` and for a precompile of one's own kernels."""
    from parity.exec import shared_compile_cache as scc

    errors: list[str] = []
    pause, stuck_since = POLL_S[0], None
    while units:
        later = _run_all(units, run_unit, errors, skip_busy=True, done=done, mark=mark)
        if leave_held and later and len(later) == len(units):
            break  # every unit left is being compiled elsewhere: its holder finishes it, a case that needs it waits
        if len(later) < len(units):
            pause, stuck_since = POLL_S[0], None
        elif stuck_since is None:
            stuck_since = clock()
        elif clock() - stuck_since >= scc.WAIT_S:
            _run_all(later, run_unit, errors, skip_busy=False, done=done, mark=mark)
            break
        if later and len(later) == len(units):
            sleep(pause)
            pause = min(2 * pause, POLL_S[1])
        units = later
    return errors


def _run_all(units: list[tuple[str, Any]], run_unit: Callable[[str, Any], None], errors: list[str], *,
             skip_busy: bool, done: Callable[[str, Any], bool] | None = None,
             mark: Callable[[str, Any], None] | None = None) -> list[tuple[str, Any]]:
    """Run each unit but those `done` (run elsewhere), marking each run here (`mark`); those another process is
    compiling (`skip_busy`) are returned for later."""
    from parity.exec import shared_compile_cache as scc

    later = []
    for kind, case in units:
        if done is not None and done(kind, case):
            continue
        try:
            with scc.not_waiting() if skip_busy else contextlib.nullcontext():
                run_unit(kind, case)
            if mark is not None:
                mark(kind, case)
        except scc.Busy:
            later.append((kind, case))
        except Exception as exc:  # reported; the cases that launch this variant fail with it
            first = (str(exc).strip().splitlines() or ["(no message)"])[0]
            errors.append(f"{kind} {case.dtype}/{case.kv_dtype} D={case.head_dim} K={case.block_size} "
                          f"G={case.group_size}: {type(exc).__name__}: {first}")
    return later


def _run_unit(kind: str, case: Any, device: str) -> None:
    """A build unit: build `case` on `device` (the builder's kernel). An oracle unit: attend `case` (the oracle's
    kernel) on inputs of the host build (CPU values copied over: the same dtypes, shapes and layout, so the same
    variant), so that it never waits for a builder variant another process is compiling. With the device build
    here, every oracle unit was `Busy` until the builder's variants were compiled: two waves, one after the other.
    With the host build both start together."""
    import torch

    from oracle import attention, materialize

    if kind == "oracle":
        attention(materialize(case, device, build="host"), engine="triton")
    elif kind == "golden":  # where this Triton compiles the fp64 variant at all (else the torch engine serves)
        from oracle.reference import triton_f64_ready

        if triton_f64_ready(torch.device(device)):
            from oracle.precision import case_stats

            inputs = materialize(case, device, build="host")
            attention(inputs, engine="triton", precision=torch.float64)
            case_stats(inputs, "triton")  # the statistics kernel the golden reference launches beside it
    elif kind == "yardstick":
        attention(materialize(case, device, build="host"), engine="triton", kv_rounded=True, round_p=True)
    else:
        materialize(case, device)
    torch.cuda.synchronize(torch.device(device))


def _capability(device: str) -> str:
    import torch

    return str(torch.cuda.get_device_capability(torch.device(device)))


def _kernels_compiled_here() -> int:
    from parity.exec import shared_compile_cache as scc

    return sum(1 for e in scc.compiled_here if e.endswith(".json"))


def _cache_dir() -> Path | None:
    """Triton's cache folder (`TRITON_CACHE_DIR`, else its default), or None where it has none."""
    try:
        from triton import knobs

        d = knobs.cache.dir
    except Exception:  # an older triton
        try:
            from triton.runtime.cache import default_cache_dir

            d = default_cache_dir()
        except Exception:
            return None
    return Path(d) if d else None


def _base_digest(device: str) -> str:
    """A digest of what every compiled variant depends on: triton, torch, CUDA, the GPU, the kernels' sources."""
    import torch
    import triton

    root = Path(__file__).resolve().parents[2]
    h = hashlib.sha256()
    for part in (triton.__version__, torch.__version__, str(torch.version.cuda), _capability(device)):
        h.update(part.encode() + b"\0")
    for rel in _SOURCES:
        h.update((root / rel).read_bytes())
    return h.hexdigest()


def _marker(units: list[tuple[str, Any]], base: str) -> Path | None:
    """The run's marker: every variant of `units` compiled (see the module docstring); None without a cache."""
    cache = _cache_dir()
    if cache is None:
        return None
    h = hashlib.sha256(base.encode())
    for kind, case in units:
        h.update(f"{kind} {case.to_json(None)}\n".encode())
    return cache / "dflash-parity" / f"precompiled-{h.hexdigest()[:32]}"


def _unit_marker(run_marker: Path, base: str, kind: str, case: Any) -> Path:
    """One variant's marker, next to the run's: it was compiled (and run) by some process of this cache."""
    h = hashlib.sha256(f"{base}\n{kind} {case.to_json(None)}".encode())
    return run_marker.parent / f"variant-{h.hexdigest()[:32]}"
