"""JIT warm-up: load every kernel module a set of lowerings will need, once, before the first case.

flashinfer compiles each kernel module at its first use (tens of seconds to minutes each on a GPU runner), keyed
by (kernel, dtype, kv dtype, head dim, sliding window on/off). Without a warm-up that
time lands inside the first case of each module: a case timeout, a skewed benchmark, a hang that is not
one. `warm_up` runs each lowering once per distinct module on a tiny case, times it, reports progress,
and reports a module that fails to load instead of skipping it.

Which modules: for each lowering, its case limits on the device (`case_limits(device)`, else
`strategies.Limits()`, or what the caller passes) give the dtypes, kv dtypes and head dims; the layer
kinds it supports give window off (`noncausal`, `causal`) and on (`noncausal_swa`, `causal_swa`). One
tiny case per (dtype, kv dtype, head dim, window on/off) and batch form (B=1, and B=33 above the
decode-rows dispatch threshold), kept when the lowering supports it. Its module keys are
`lowering.jit_modules(case)` when the lowering defines it (optional; the flashinfer adapters do: keys
shared across lowerings, e.g. context[flashinfer-fa2] and decode_rows[flashinfer-tc] load the same fa2
module), else one key per lowering and variant. A case whose keys were all warmed by an earlier one is
skipped (de-duplication); a lowering whose `jit_modules` names nothing for a case has nothing to warm.

Public: `warm_up(lowerings, cases_or_limits=None, device="cuda", progress=print) -> WarmupReport`,
`plan_warmup(...)` (the units, without running them), `WarmupReport`, `WarmupUnit`.
"""

from __future__ import annotations

import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

from oracle.case import Case, pages_needed, window_for
from parity.engine import answers
from parity.exec import hooks

# (layer kind, window width) tried in order for window off, then for window on.
WINDOW_OFF_KINDS = (("noncausal", None), ("causal", None))
WINDOW_ON_KINDS = (("noncausal_swa", 4), ("causal_swa", 4))
TINY_BATCHES = (1, 33)  # 33: above the decode-rows dispatch threshold (32), where the fa2 prefill takes over


@dataclass(frozen=True)
class Variant:
    """What selects a kernel module: dtype, kv dtype, head dim, sliding window on/off."""

    dtype: str
    kv_dtype: str  # a dtype name ("bfloat16", "float8_e4m3fn"), never "same"
    head_dim: int
    window: bool

    def describe(self) -> str:
        short = {"bfloat16": "bf16", "float16": "fp16", "float8_e4m3fn": "fp8"}
        dt = short.get(self.dtype, self.dtype)
        if self.kv_dtype != self.dtype:
            dt += "/" + short.get(self.kv_dtype, self.kv_dtype)
        return f"{dt} D={self.head_dim} {'window' if self.window else 'no-window'}"


@dataclass
class WarmupUnit:
    """One warm-up run: `lowering` on `case`, loading the modules `keys` (those no earlier unit loads)."""

    lowering: Any
    case: Case
    variant: Variant
    keys: tuple[str, ...]
    index: int = 0
    total: int = 0
    seconds: float | None = None
    error: str | None = None  # "<ExceptionType>: <first line of the message>"

    @property
    def name(self) -> str:
        return str(getattr(self.lowering, "name", self.lowering))

    @property
    def ok(self) -> bool:
        return self.error is None and self.seconds is not None

    def head(self) -> str:
        return f"warm-up {self.index}/{self.total}: {self.name} {self.variant.describe()}"

    def line(self) -> str:
        if self.error is not None:
            return f"{self.head()} ... could not load: {self.modules()}: {self.error} ({self.seconds:.1f} s)"
        return f"{self.head()} ... {self.seconds:.1f} s"

    def modules(self) -> str:
        return ", ".join(self.keys)

    def to_json(self) -> dict[str, Any]:
        return {"lowering": self.name, "variant": self.variant.describe(), "keys": list(self.keys),
                "index": self.index, "total": self.total, "seconds": self.seconds, "error": self.error,
                "line": self.line() if self.seconds is not None else self.head()}


@dataclass
class WarmupReport:
    """What `warm_up` did: the units run (with their time or error), the lowerings it could not warm
    and why, and the modules already warmed by an earlier unit (skipped)."""

    device: str
    units: list[WarmupUnit] = field(default_factory=list)
    not_warmed: list[tuple[str, str]] = field(default_factory=list)  # (lowering, why)
    deduplicated: int = 0
    seconds: float = 0.0

    @property
    def failures(self) -> list[WarmupUnit]:
        return [u for u in self.units if u.error is not None]

    @property
    def ok(self) -> bool:
        return not self.failures

    def failure_lines(self) -> list[str]:
        return [f"could not load: {u.modules()}: {u.error} (warming {u.name} {u.variant.describe()})"
                for u in self.failures]

    def lines(self) -> list[str]:
        """The report as terminal lines: one per unit, then what could not be warmed, then a total."""
        out = [u.line() for u in self.units]
        out += [f"not warmed: {name}: {why}" for name, why in self.not_warmed]
        n_mod = len({k for u in self.units if u.ok for k in u.keys})
        tail = f"warm-up on {self.device}: {len(self.units) - len(self.failures)}/{len(self.units)} runs, " \
               f"{n_mod} module(s) loaded in {self.seconds:.1f} s"
        if self.deduplicated:
            tail += f"; {self.deduplicated} run(s) skipped, their modules already warm"
        if self.failures:
            tail += f"; {len(self.failures)} FAILED to load"
        return out + self.failure_lines() + [tail]

    def to_json(self) -> dict[str, Any]:
        return {"device": self.device, "seconds": self.seconds, "deduplicated": self.deduplicated,
                "units": [u.to_json() for u in self.units], "not_warmed": [list(x) for x in self.not_warmed],
                "lines": self.lines()}


def tiny_case(variant: Variant, kind: str, width: int | None, batch: int = 1) -> Case:
    """A small case of `variant`: context 17 (two pages of 16), block 2, one KV head, GQA group 4."""
    K, ps, L = 2, 16, 17 if batch == 1 else 1
    need = pages_needed(L, K, ps)
    pages = tuple(tuple(range(b * need, (b + 1) * need)) for b in range(batch))
    return Case(context_lens=(L,) * batch, block_size=K, num_q_heads=4, num_kv_heads=1, head_dim=variant.head_dim,
                page_size=ps, pages=pages, num_pages=batch * need + 1, layout="NHD",
                window=window_for(kind, width), dtype=variant.dtype, kv_dtype=variant.kv_dtype,
                k_scale=1.0, v_scale=1.0, seed=1)


def _variants(limits: Any) -> list[Variant]:
    out = []
    for dt in limits.dtypes:
        for kv in limits.kv_dtypes:
            for d in limits.head_dims:
                for win in (False, True):
                    out.append(Variant(dt, dt if kv == "same" else kv, int(d), win))
    return out


def _variant_of(case: Case) -> Variant:
    return Variant(case.dtype, case.kv_dtype, case.head_dim, case.window[0] != -1)


def _candidates(lowering: Any, variant: Variant) -> list[Case]:
    """Tiny cases of `variant` the lowering supports: the first supported layer kind, per batch form."""
    kinds = WINDOW_ON_KINDS if variant.window else WINDOW_OFF_KINDS
    out = []
    for batch in TINY_BATCHES:
        for kind, width in kinds:
            try:
                case = tiny_case(variant, kind, width, batch)
            except Exception:  # a dtype this torch lacks, ...: nothing to warm for it
                continue
            if hooks.call(lowering, "supports", case, case=case, expect=answers.supports_answer) is None:  # bounded
                out.append(case)
                break
    return out


def _keys(lowering: Any, case: Case, variant: Variant) -> tuple[str, ...]:
    keys = hooks.call_optional(lowering, "jit_modules", case, case=case, expect=answers.jit_modules_answer)
    if keys is not None:
        return tuple(keys)
    return (f"{getattr(lowering, 'name', lowering)} {variant.describe()}",)


def _limits_for(lowering: Any, cases_or_limits: Any, device: str):
    if cases_or_limits is not None and not isinstance(cases_or_limits, (list, tuple)):
        if isinstance(cases_or_limits, dict):
            got = cases_or_limits.get(getattr(lowering, "name", None))
            if got is not None:
                return got
        else:
            return cases_or_limits
    from lowerings.protocol import optional_hook

    fn = optional_hook(lowering, "case_limits")
    lim = fn(device) if fn is not None else None
    if lim is None:
        from strategies import Limits
        lim = Limits()
    return lim


def plan_warmup(lowerings: Sequence[Any], cases_or_limits: Any = None, device: str = "cuda"
                ) -> tuple[list[WarmupUnit], list[tuple[str, str]], int]:
    """The warm-up units (in order, de-duplicated), the lowerings not warmed with the reason, and how
    many candidate runs were skipped because their modules were already covered.

    `cases_or_limits`: None (each lowering's `case_limits(device)`), one `strategies.Limits` for all, a
    dict `{lowering name: Limits}`, or a list of `Case`s (their dtype, kv dtype, head dim and window
    on/off are the variants to warm, for every lowering that supports them)."""
    units: list[WarmupUnit] = []
    not_warmed: list[tuple[str, str]] = []
    covered: set[str] = set()
    skipped = 0
    dev_type = str(device).split(":")[0]
    for lw in lowerings:
        name = str(getattr(lw, "name", lw))
        try:
            ok, why = lw.available(dev_type)
        except Exception as exc:  # an availability probe that raises is reported, not fatal
            ok, why = False, f"available() raised {type(exc).__name__}: {_first_line(exc)}"
        if not ok:
            not_warmed.append((name, f"cannot run on {dev_type}: {why}"))
            continue
        if isinstance(cases_or_limits, (list, tuple)):
            variants = list(dict.fromkeys(_variant_of(c) for c in cases_or_limits))
        else:
            variants = _variants(_limits_for(lw, cases_or_limits, dev_type))
        any_case = False
        for v in variants:
            for case in _candidates(lw, v):
                any_case = True
                keys = _keys(lw, case, v)
                new = tuple(k for k in dict.fromkeys(keys) if k not in covered)
                if not new:
                    skipped += 1 if keys else 0
                    continue
                covered.update(new)
                units.append(WarmupUnit(lw, case, v, new))
        if not any_case:
            not_warmed.append((name, "supports none of the warm-up variants (its limits' dtypes, kv dtypes, "
                                     "head dims, window on/off)"))
    for i, u in enumerate(units, 1):
        u.index, u.total = i, len(units)
    return units, not_warmed, skipped


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else "(no message)"


def _sync(device: str) -> None:
    if str(device).startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def run_unit(unit: WarmupUnit, device: str, clock: Callable[[], float] = time.perf_counter) -> WarmupUnit:
    """Run one unit: materialize its tiny case on `device`, call the lowering, wait for the device; the
    time goes into `unit.seconds`, an exception into `unit.error` (type and first line)."""
    from lowerings import counters
    from oracle.inputs import materialize

    t0 = clock()
    try:
        inputs = materialize(unit.case, device)
        with counters.KernelCounter():  # the warm-up's calls count nowhere
            unit.lowering.run(inputs)
        _sync(device)
    except Exception as exc:
        tb = traceback.extract_tb(exc.__traceback__)
        where = f" ({tb[-1].filename.rsplit('/', 1)[-1]}:{tb[-1].lineno})" if tb else ""
        unit.error = f"{type(exc).__name__}: {_first_line(exc)}{where}"
    unit.seconds = clock() - t0
    return unit


def warm_up(lowerings: Iterable[Any], cases_or_limits: Any = None, device: str = "cuda",
            progress: Callable[[str], None] | None = print, *,
            clock: Callable[[], float] = time.perf_counter) -> WarmupReport:
    """Load each distinct kernel module `lowerings` need on `device`, once, timing each (see the module
    docstring for how the modules are found). `progress(line)` is called before each run with
    `"warm-up 6/9: windowed_merge[flashinfer-compiled] bf16 D=128 no-window ..."` and after it with the
    same line ending in the time (`"... 10.9 s"`) or in `"could not load: <modules>: <error first line>"`. A run
    that raises is reported and the warm-up goes on; nothing raises out of here but KeyboardInterrupt."""
    lowerings = list(lowerings)
    report = WarmupReport(device=str(device))
    t0 = clock()
    units, report.not_warmed, report.deduplicated = plan_warmup(lowerings, cases_or_limits, device)
    say = progress or (lambda line: None)
    if str(device).startswith("cuda"):  # the case builder's own kernels (format 3's device build), once
        from oracle.inputs import warm_build

        t1 = clock()
        n = warm_build(device)
        say(f"warm-up: the case builder's kernels ({n} tiny cases) {clock() - t1:.1f} s")
    for unit in units:
        say(unit.head() + " ...")
        run_unit(unit, str(device), clock)
        report.units.append(unit)
        say(unit.line())
    for name, why in report.not_warmed:
        say(f"warm-up: not warmed: {name}: {why}")
    report.seconds = clock() - t0
    return report


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m parity.exec.warmup [LOWERING ...] [--jobs N]`: warm a GPU runner's JIT caches once.

    With `--jobs N` the units of the plan run in up to N processes at once (a module's compile is mostly
    one nvcc process, so compiles of different modules overlap); each writes to the same on-disk caches
    (flashinfer serializes builds of one module with a file lock). Exit 1 when a module could not load."""
    import argparse
    import subprocess
    import sys

    from parity.exec.shared_compiles import share_compiles

    share_compiles()  # the units' processes compile each Triton kernel once between them

    from parity.exec import pool

    ap = argparse.ArgumentParser(prog="python -m parity.exec.warmup", description=main.__doc__.splitlines()[0])
    ap.add_argument("lowerings", nargs="*", metavar="LOWERING", help="default: every lowering that can run here")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--jobs", type=int, default=1, metavar="N", help="units run at once, one process each (default 1)")
    ap.add_argument("--plugin", action="append", default=[], metavar="FILE.py")
    ap.add_argument("--limit", action="append", default=[], metavar="FIELD=V[,V...]",
                    help="as `dflash-parity check --limit`: warm the modules of the widened shapes")
    ap.add_argument("--unit", type=int, default=None, help=argparse.SUPPRESS)  # a --jobs child: run unit N only
    args = ap.parse_args(argv)
    if args.jobs < 1:
        ap.error(f"--jobs must be a positive integer, got {args.jobs}")
    import lowerings as registry
    from strategies import limit_overrides, with_overrides

    try:
        overrides = limit_overrides(args.limit)
    except ValueError as err:
        ap.error(str(err))
    for p in args.plugin:
        registry.load_plugin(p)
    chosen = [registry.get(n) for n in args.lowerings] if args.lowerings else registry.all_lowerings()
    limits = None
    if overrides:
        limits = {lw.name: with_overrides(_limits_for(lw, None, args.device), overrides) for lw in chosen}
    say = lambda line: print(line, flush=True)  # noqa: E731
    if args.unit is not None:
        units, _, _ = plan_warmup(chosen, limits, args.device)
        unit = units[args.unit]
        run_unit(unit, args.device)
        say(unit.line())
        return 0 if unit.ok else 1
    if args.jobs == 1:
        report = warm_up(chosen, limits, args.device, progress=say)
        say(report.lines()[-1])
        return 0 if report.ok else 1
    units, not_warmed, skipped = plan_warmup(chosen, limits, args.device)
    t0 = time.perf_counter()
    base = [sys.executable, "-m", "parity.exec.warmup", "--device", args.device, *[x for p in args.plugin for x in ("--plugin", p)],
            *[x for t in args.limit for x in ("--limit", t)], *[u for u in args.lowerings]]
    procs: dict[int, subprocess.Popen] = {}
    failed = 0

    def start(i: int) -> subprocess.Popen:
        say(units[i].head() + " ... (started)")
        procs[i] = subprocess.Popen([*base, "--unit", str(i)], stdout=subprocess.PIPE, text=True, **pool.child_kwargs())
        return procs[i]

    def done(i: int, code: int, seconds: float) -> None:
        nonlocal failed
        out = procs.pop(i).communicate()[0].strip()
        failed += code != 0
        say(out or f"{units[i].head()} ... could not load: the warm-up process exited with code {code}")

    pool.run_pool(list(range(len(units))), start, args.jobs, done)
    for name, why in not_warmed:
        say(f"warm-up: not warmed: {name}: {why}")
    say(f"warm-up on {args.device}: {len(units)} unit(s) in {args.jobs} processes, {time.perf_counter() - t0:.1f} s"
        + (f"; {failed} FAILED to load" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())


def warm_up_lowering(lowering, device: str, say: Callable[[str], None] | None, limits=None) -> None:
    """`--warm-up`: load the lowering's JIT modules now (on the GPU: in this process, so that an isolated
    worker finds them compiled in the on-disk cache and only loads them)."""
    show = (lambda line: None) if say is None else (lambda line: say(f"  {line}"))
    rep = warm_up([lowering], limits, device, progress=show)
    show(rep.lines()[-1])
