"""The options of a check, written once: `dflash-parity check` and the pytest plugin both register them from
`OPTIONS` and build a `parity.front.config.CheckConfig` from the values.

Each `Option` names the config field it sets, its CLI flag (`--max-examples`; pytest spells it
`--parity-max-examples`), its kind, its parser (text -> value, a `ValueError` naming the flag) and its help.
Kinds: `value` (`--flag VALUE`), `append` (repeatable), `flag` (on when given), `negated` (a setting on by
default that the CLI turns off with `--no-x`; pytest has `--parity-x` and `--parity-no-x`, its default
may differ). An option marked `common` is also an option of `list`, `repro` and `bench`; `cli` /
`pytest` say which front ends have it.

Public: `Option`, `OPTIONS`, `add_to_argparse`, `config_from_args`, `add_to_pytest`, `config_from_pytest`,
`pytest_flag`, `pytest_message`, `given_in_pytest`.
"""

from __future__ import annotations

import argparse
import os
import re
from dataclasses import dataclass
from typing import Any, Callable

from parity.engine import ranges
from parity.front.config import DEVICES, DRAW_AHEAD, JOBS_STARTS, CheckConfig, parse_shard

PYTEST_PREFIX = "--parity-"
_MISSING = object()


# ---- parsers: (text, flag) -> value, or ValueError naming the flag ---------------------------------------
def int_at_least(minimum: int, expected: str, maximum: int | None = None) -> Callable[[str, str], int]:
    """A parser of integers >= `minimum` (`expected` says so in words) and, given, <= `maximum`."""
    def parse(text: str, flag: str) -> int:
        try:
            v = int(text)
        except (TypeError, ValueError):
            v = None
        if v is None or v < minimum:
            raise ValueError(f"{flag} must be {expected}, got {text!r}")
        if maximum is not None and v > maximum:
            raise ValueError(f"{flag} must be at most {maximum}, got {text!r}")
        return v
    return parse


positive_int = int_at_least(1, "a positive integer")
nonneg_int = int_at_least(0, "an integer >= 0")


def positive_seconds(text: str, flag: str) -> float:
    """A number of seconds in `parity.engine.ranges`' range (more than 0, at most a day)."""
    try:
        v = float(text)
    except (TypeError, ValueError):
        v = float("nan")
    problem = ranges.seconds_problem(v)
    if problem is not None:
        raise ValueError(f"{flag} must be {problem}, got {text!r}")
    return v


def one_of(*choices: str) -> Callable[[str, str], str]:
    def parse(text: str, flag: str) -> str:
        if text not in choices:
            raise ValueError(f"{flag} must be one of {', '.join(choices)}, got {text!r}")
        return text
    return parse


def shard(text: str, flag: str) -> tuple[int, int]:
    try:
        return parse_shard(text, flag)
    except ValueError as err:  # InvalidInput: "FLAG: rule"
        raise ValueError(str(err)) from None


def _profiles() -> tuple[str, ...]:
    from strategies import PROFILES

    return tuple(sorted(PROFILES))


def profile(text: str, flag: str) -> str:
    return one_of(*_profiles())(text, flag)


# ---- the table --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Option:
    """One option of a check (see the module docstring)."""

    field: str
    flag: str
    help: str
    kind: str = "value"
    parse: Callable[[str, str], Any] | None = None
    metavar: str | None = None
    choices: Callable[[], tuple[str, ...]] | tuple[str, ...] | None = None
    default: Any = None
    pytest_default: Any = _MISSING
    cli: bool = True
    pytest: bool = True
    common: bool = False

    def __post_init__(self) -> None:
        if self.kind not in ("value", "append", "flag", "negated"):
            raise ValueError(f"Option {self.field}: kind {self.kind!r}")
        if self.kind == "negated" and not self.flag.startswith("--no-"):
            raise ValueError(f"Option {self.field}: a negated option's CLI flag is --no-X, got {self.flag!r}")

    @property
    def positive(self) -> str:
        """The option's name without `--no-` (`isolate` for `--no-isolate`)."""
        return self.flag[len("--no-"):] if self.kind == "negated" else self.flag[2:]

    def default_for(self, front_end: str) -> Any:
        if front_end == "pytest" and self.pytest_default is not _MISSING:
            return self.pytest_default() if callable(self.pytest_default) else self.pytest_default
        return self.default


OPTIONS: tuple[Option, ...] = (
    # common to every verb of the CLI
    Option("plugins", "--plugin", "a Python file that registers lowerings (repeatable)", kind="append",
           metavar="FILE.py", common=True),
    Option("device", "--device", "default: cuda if available, else cpu", choices=DEVICES, parse=one_of(*DEVICES),
           common=True),
    Option("tolerances", "--tolerances", "tolerance policy (default: the packaged tolerances.toml)", metavar="TOML",
           common=True),
    Option("hook_timeout", "--hook-timeout",
           "seconds a lowering's available()/supports()/expected_calls() or a plugin's import may take before it "
           "fails that lowering (default: $DFLASH_PARITY_HOOK_TIMEOUT or 60; at most 86400, a day)", parse=positive_seconds,
           metavar="SECONDS", common=True),
    Option("allow_loose_bounds", "--allow-loose-bounds",
           "accept bounds past the policy's sanity ceilings (parity.engine.policy.CEILINGS; recorded in the report, "
           "refused by the gate unless it accepts loose-bounds)", kind="flag", default=False, common=True),
    # check
    Option("lowerings", "--lowering", "lowering to check (repeatable; default: all)", kind="append", metavar="NAME"),
    Option("max_examples", "--max-examples", "cases per lowering (default: the profile's)",
           parse=int_at_least(1, "a positive integer", ranges.MAX_EXAMPLES)),
    Option("seed", "--seed", "hypothesis seed (default: derandomized profiles fix it)", parse=nonneg_int),
    Option("profile", "--profile", "hypothesis profile (default: ci; under pytest: ci when $CI is set, else dev)",
           choices=_profiles, parse=profile, default="ci",
           pytest_default=lambda: "ci" if os.environ.get("CI") else "dev"),
    Option("report", "--report", "report directory: parity.json, junit.xml, summary.md, failures/ (default: "
           "parity-report; under pytest: none, no files)", metavar="DIR", default="parity-report", pytest_default=None),
    Option("database", "--database", "hypothesis example database (default: none)", metavar="DIR"),
    Option("hardening", "--no-hardening", "skip the untouched-input, determinism, canary and output-buffer checks "
           "(timing runs only)", kind="negated", default=True),
    Option("isolate", "--no-isolate", "run the lowerings in this process (faster start, for debugging; a crash ends "
           "the run). Under pytest cases run in process unless --parity-isolate", kind="negated", default=True,
           pytest_default=False),
    Option("case_timeout", "--case-timeout", "isolated runs: seconds a case may take before its worker is killed and "
           "the case fails as hung (default: 120; at most 86400, a day)", parse=positive_seconds, metavar="SECONDS"),
    Option("kernel_names_every", "--kernel-names-every", "on CUDA, profile one case in N (by seed) and check its "
           "kernel names against the lowering's declaration (default 4; 0: never)",
           parse=int_at_least(0, "an integer >= 0"), metavar="N", default=4),
    Option("flaky_runs", "--flaky-runs", "times a failure is re-run to classify it, and runs per case when a flaky "
           "failure is shrunk (default: the profile's; 0: none)",
           parse=int_at_least(0, "an integer >= 0", ranges.MAX_FLAKY_RUNS), metavar="R"),
    Option("jobs", "--jobs", "check up to N lowerings at once, each in its own process on the same device, round-robin "
           "over the visible GPUs on cuda (default 1; each draws the cases a serial run draws)",
           parse=int_at_least(1, "a positive integer", ranges.MAX_JOBS), metavar="N", default=1, pytest=False),
    Option("jobs_start", "--jobs-start", "how --jobs children start: prefork (default: forked from one process that "
           "imported torch, the profiler's modules, triton, hypothesis and this project once, without touching CUDA; a "
           "fresh "
           "interpreter each, saying why, where that cannot be) or spawn (a fresh interpreter each, every import "
           "paid again; see parity.exec.prefork)", choices=JOBS_STARTS, parse=one_of(*JOBS_STARTS), default="prefork",
           pytest=False),
    Option("threads", "--threads", "torch CPU threads of each process that runs cases (this one, each --jobs child, "
           "each isolated worker; default: the cores over the processes running cases at once, at least 1: "
           "os.cpu_count() // (--jobs x pytest-xdist workers))",
           parse=int_at_least(1, "a positive integer", ranges.MAX_THREADS), metavar="N"),
    Option("draw_ahead", "--draw-ahead", "auto (default: on for 100 cases a lowering or more where a process has "
           "two cores of its own; a lowering's --shards share one drawer), on or off: a forked process draws the "
           "cases while this one judges them; the same cases, verdicts and shrunk failures (see parity.exec.draw_ahead)",
           choices=DRAW_AHEAD, parse=one_of(*DRAW_AHEAD), default="auto"),
    Option("warm_up", "--warm-up", "load each lowering's JIT kernel modules before its first case, timed apart from "
           "the cases (see parity.exec.warmup)", kind="flag", default=False),
    Option("mps", "--mps", "with --jobs on cuda (pytest: with -n N): run the processes sharing a GPU under CUDA MPS, "
           "one shared context instead of taking turns (a daemon already running is used; else one is started for "
           "the run and stopped at its end; without one the run goes on, saying why; see parity.exec.mps)", kind="flag",
           default=False),
    Option("limits", "--limit", "widen or narrow the drawn shapes of every lowering checked, over its own limits on "
           "the device: dtypes, kv_dtypes, head_dims, max_context, max_batch, ... (repeatable; e.g. --limit "
           "dtypes=bfloat16,float16 --limit head_dims=64,128; see strategies.Limits)", kind="append",
           metavar="FIELD=V[,V...]"),
    Option("shards", "--shards", "with --jobs: check lowering NAME in S processes, each running a 1/S share of the "
           "cases a serial run draws, whole compile families where the lowering compiles (for compile-bound "
           "lowerings; repeatable; see parity.exec.shards)", kind="append",
           metavar="NAME=S", pytest=False),
    Option("shard", "--shard", "run shard I of S (0 <= I < S) of the serial run's cases, for a run split over S "
           "machines; `dflash-parity merge` makes one report of the S reports", parse=shard, metavar="I/S"),
    Option("gate_baseline", "--gate-baseline", "once the report is written, gate it against this baseline report "
           "(as `dflash-parity gate REPORT --baseline DIR`; gate.md next to it); a failing gate fails the run",
           metavar="DIR"),
    Option("gate_accept", "--gate-accept", "with --gate-baseline: accept a gate rule (repeatable; see "
           "`dflash-parity gate --help`)", kind="append", metavar="RULE[,RULE...]"),
    Option("allow_nothing_judged", "--allow-nothing-judged", "exit 0 even when no case was judged (every lowering "
           "unavailable here or every case unsupported); without it that exits 1", kind="flag", default=False,
           pytest=False),
    Option("quiet", "--quiet", "no progress lines", kind="flag", default=False, pytest=False),
)

BY_FIELD = {o.field: o for o in OPTIONS}


def pytest_flag(flag: str) -> str:
    """`--max-examples` -> `--parity-max-examples`, `--no-isolate` -> `--parity-no-isolate`."""
    return PYTEST_PREFIX + flag[2:]


def pytest_dest(option: Option) -> str:
    return "parity_" + option.positive.replace("-", "_")


_FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z-]*)")


def pytest_message(text: str) -> str:
    """A message naming CLI flags, with each flag of the table spelled as pytest spells it."""
    flags = {o.flag for o in OPTIONS if o.pytest} | {f"--{o.positive}" for o in OPTIONS if o.kind == "negated"}
    return _FLAG.sub(lambda m: pytest_flag(m.group(1)) if m.group(1) in flags else m.group(1), text)


# ---- argparse (the CLI) -------------------------------------------------------------------------------
def argparse_type(parse: Callable[[str, str], Any], flag: str) -> Callable[[str], Any]:
    """An argparse `type=`: `parse(text, flag)`, its ValueError an argparse usage error."""
    def typed(text: str) -> Any:
        try:
            return parse(text, flag)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None
    return typed


def add_to_argparse(parser: argparse.ArgumentParser, *, common: bool) -> None:
    """Add the CLI's options (`common`: those of every verb; else those of `check` only) to `parser`."""
    for o in OPTIONS:
        if not o.cli or o.common != common:
            continue
        kw: dict[str, Any] = {"dest": o.field, "help": o.help}
        if o.kind == "flag":
            kw.update(action="store_true", default=o.default)
        elif o.kind == "negated":
            kw.update(action="store_false", default=o.default)
        else:
            kw.update(metavar=o.metavar, default=[] if o.kind == "append" else o.default)
            if o.kind == "append":
                kw["action"] = "append"
            choices = o.choices() if callable(o.choices) else o.choices
            if choices:
                kw["choices"] = choices
            elif o.parse is not None:
                kw["type"] = argparse_type(o.parse, o.flag)
        parser.add_argument(o.flag, **kw)


def config_from_args(args: argparse.Namespace, **changes: Any) -> CheckConfig:
    """The `CheckConfig` of a parsed `check` command line."""
    values = {o.field: getattr(args, o.field) for o in OPTIONS if o.cli and hasattr(args, o.field)}
    for o in OPTIONS:
        if o.kind == "append" and o.field in values:
            values[o.field] = tuple(values[o.field])
    values.update(changes)
    return CheckConfig(**values)


# ---- pytest -------------------------------------------------------------------------------------------
def add_to_pytest(group: Any) -> None:
    """Add the pytest spellings (`--parity-...`) to a pytest option group. Values stay text here; they
    are parsed, and a bad one refused naming the option, by `config_from_pytest`."""
    for o in OPTIONS:
        if not o.pytest:
            continue
        dest, text = pytest_dest(o), pytest_message(o.help)
        if o.kind == "flag":
            group.addoption(pytest_flag(o.flag), dest=dest, action="store_true", default=None, help=text)
        elif o.kind == "negated":
            group.addoption(pytest_flag("--" + o.positive), dest=dest, action="store_true", default=None,
                            help=f"(default {'on' if o.default_for('pytest') else 'off'}) the opposite of "
                                 f"{pytest_flag(o.flag)}")
            group.addoption(pytest_flag(o.flag), dest=dest, action="store_false", default=None, help=text)
        else:
            group.addoption(pytest_flag(o.flag), dest=dest, metavar=o.metavar or o.field.upper(),
                            action="append" if o.kind == "append" else "store",
                            default=[] if o.kind == "append" else None, help=text)


def given_in_pytest(getoption: Callable[[str], Any]) -> list[str]:
    """The `--parity-...` options given a value (not left at their default)."""
    out = []
    for o in OPTIONS:
        if o.pytest:
            value = getoption(pytest_dest(o))
            if value not in (None, [], ()):
                out.append(pytest_flag(o.flag if o.kind != "negated" or value is False else "--" + o.positive))
    return out


def config_from_pytest(getoption: Callable[[str], Any], extra: dict[str, Any] | None = None) -> CheckConfig:
    """The `CheckConfig` of a pytest session's `--parity-...` options (`getoption(dest)`); `extra`: values
    given by other spellings (the deprecated `--lowering`, ...) added to the lists / used when unset.
    A bad value raises ValueError naming the pytest option."""
    values: dict[str, Any] = {}
    for o in OPTIONS:
        if not o.pytest:
            continue
        raw = getoption(pytest_dest(o))
        flag = pytest_flag(o.flag)
        if o.kind == "append":
            texts = list(raw or []) + list((extra or {}).get(o.field, []))
            values[o.field] = tuple(o.parse(t, flag) for t in texts) if o.parse else tuple(texts)
        elif raw is None:
            fallback = (extra or {}).get(o.field)
            values[o.field] = fallback if fallback is not None else o.default_for("pytest")
        elif o.kind in ("flag", "negated"):
            values[o.field] = bool(raw)
        else:
            values[o.field] = o.parse(raw, flag) if o.parse else raw
    try:
        return CheckConfig(**values)
    except ValueError as err:
        raise ValueError(pytest_message(str(err))) from None
