"""Tolerance policy: `tolerances.toml` loaded into frozen, validated `Tolerance` values.

A case's bounds are chosen after its lowering ran, from what ran (`Policy.for_case`): per tolerance key,
the lowering's own entry `[lowering."<name>".<dtype>]` wins over the entries of the kernels it ran
`[kernel."<key>".<dtype>]`, which win over `[defaults.<dtype>]`. `ToleranceSource` says which entry set
each bound and why it applied.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Mapping

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from oracle.errors import InvalidInput

DEFAULT_PATH = Path(__file__).resolve().parent.parent / "tolerances.toml"
# A non-editable install ships the file as data under <prefix>/share/dflash-parity/.
INSTALLED_PATH = Path(sys.prefix) / "share" / "dflash-parity" / "tolerances.toml"
DTYPES = ("bfloat16", "float16")


@dataclass(frozen=True)
class Tolerance:
    """Bounds for one lowering in one working dtype (units: see tolerances.toml)."""

    out_max_ulp: float
    out_rel_l2: float
    yardstick_factor: float
    yardstick_floor_ulp: float
    lse_abs: float
    lse_rel: float = 0.0

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name == "lse_rel":
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                    raise InvalidInput(f.name, f"a finite number >= 0, got {v!r}")
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise InvalidInput(f.name, f"a finite positive number, got {v!r}")


TOLERANCE_KEYS = tuple(f.name for f in fields(Tolerance))


@dataclass(frozen=True)
class Policy:
    """Defaults per dtype, overrides per lowering and dtype, and the gate's bound."""

    defaults: dict[str, Tolerance]
    overrides: dict[str, dict[str, dict[str, float]]]
    max_margin_growth: float
    source: str
    # [kernel."<key>".<dtype>]: bounds for every case in which kernel `key` ran (counters.kernel_keys)
    kernels: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    kernel_reasons: dict[str, dict[str, str]] = field(default_factory=dict)  # key -> dtype -> measured reason

    def for_lowering(self, lowering: str, dtype: str) -> Tolerance:
        """The lowering's entry over the dtype default (no kernel entry: see `for_case`)."""
        base = self.defaults[dtype]
        over = self.overrides.get(lowering, {}).get(dtype, {})
        return replace(base, **over) if over else base

    def for_case(self, lowering: str, dtype: str, kernels_seen: Mapping[str, str] | None = None
                 ) -> tuple[Tolerance, "ToleranceSource"]:
        """The bounds of one case: per key, the lowering's entry > the entries of the kernels seen > the
        dtype default. `kernels_seen` maps each kernel key the case ran (or the lowering claims) to why
        (`lowerings.counters.kernel_keys`). Several kernel entries: each key takes the largest of their
        values (the case ran every one of those kernels)."""
        values: dict[str, float] = {}
        by_key: dict[str, str] = {}
        why: dict[str, str] = {}
        reasons: dict[str, str] = {}
        kernels_seen = kernels_seen or {}
        for key in sorted(kernels_seen):
            table = self.kernels.get(key, {}).get(dtype)
            if not table:
                continue
            name = kernel_entry(key, dtype)
            why[name] = kernels_seen[key] or f"kernel {key} ran"
            reasons[name] = self.kernel_reasons.get(key, {}).get(dtype, "")
            for k, v in table.items():
                if k not in values or v > values[k]:
                    values[k], by_key[k] = v, name
        own = self.overrides.get(lowering, {}).get(dtype, {})
        if own:
            name = lowering_entry(lowering, dtype)
            why[name] = f"the entry of lowering {lowering}"
            reasons[name] = ""
            for k, v in own.items():
                values[k], by_key[k] = v, name
        used = tuple(sorted({*by_key.values()}, key=lambda e: (not e.startswith("[lowering."), e)))
        src = ToleranceSource(dtype=dtype, entries=used, by_key=dict(by_key),
                              why={e: why[e] for e in used}, reasons={e: reasons[e] for e in used})
        return (replace(self.defaults[dtype], **values) if values else self.defaults[dtype]), src

    def entries(self) -> list[str]:
        """Every entry but the defaults, as `[lowering."<name>".<dtype>]` / `[kernel."<key>".<dtype>]`."""
        return ([lowering_entry(n, d) for n, per in self.overrides.items() for d in per]
                + [kernel_entry(k, d) for k, per in self.kernels.items() for d in per])

    def check_lowerings(self, known: list[str]) -> None:
        """Fail on overrides naming a lowering that does not exist."""
        for name in self.overrides:
            if name not in known:
                raise InvalidInput(f"{self.source}: lowering.{name!r}",
                                   f"no such lowering; known: {', '.join(known)}")


def lowering_entry(name: str, dtype: str) -> str:
    return f'[lowering."{name}".{dtype}]'


def kernel_entry(key: str, dtype: str) -> str:
    return f'[kernel."{key}".{dtype}]'


def default_entry(dtype: str) -> str:
    return f"[defaults.{dtype}]"


@dataclass(frozen=True)
class ToleranceSource:
    """Where the bounds of one case came from: the entries applied (`entries`, the lowering's first; empty:
    the dtype default alone), the entry that set each tolerance key (`by_key`; keys absent: the default),
    why each entry applied and its measured reason (the `reason` written next to a kernel entry)."""

    dtype: str
    entries: tuple[str, ...] = ()
    by_key: Mapping[str, str] = field(default_factory=dict)
    why: Mapping[str, str] = field(default_factory=dict)
    reasons: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise InvalidInput("ToleranceSource.dtype", f"one of {DTYPES}, got {self.dtype!r}")
        missing = sorted(set(self.by_key.values()) - set(self.entries))
        if missing:
            raise InvalidInput("ToleranceSource.by_key", f"names entries not in entries: {missing}")

    @property
    def label(self) -> str:
        """`[kernel."K".bfloat16]`, several joined by ` + ` (the lowering's first), or the default entry."""
        return " + ".join(self.entries) or default_entry(self.dtype)

    @property
    def because(self) -> str:
        """Why the entries applied (`"kernel K ran (flashinfer.BatchPrefill[fa2].run)"`), or the default's why."""
        return "; ".join(self.why[e] for e in self.entries) or "no entry of its lowering or of a kernel it ran"

    def cite(self, key: str) -> str:
        """`from [kernel."K".bfloat16] (why): reason` for the entry that set tolerance `key`."""
        entry = self.by_key.get(key)
        if entry is None:
            return f"from {default_entry(self.dtype)}"
        reason = self.reasons.get(entry, "")
        return f"from {entry} ({self.why.get(entry, '')})" + (f": {reason}" if reason else "")

    def citations(self) -> dict[str, str]:
        """`cite(key)` for every tolerance key (what `parity.judge.compare` takes as `bound_from`)."""
        return {k: self.cite(k) for k in TOLERANCE_KEYS}


def load(path: str | Path | None = None) -> Policy:
    if path is None:
        p = DEFAULT_PATH if DEFAULT_PATH.is_file() else INSTALLED_PATH
    else:
        p = Path(path)
    src = str(p)
    if not p.is_file():
        raise InvalidInput(src, "tolerance file not found")
    try:
        data = tomllib.loads(p.read_text())
    except tomllib.TOMLDecodeError as err:
        raise InvalidInput(src, f"not valid TOML ({err})") from None
    return from_dict(data, source=src)


def _number(where: str, v: Any, *, zero_ok: bool = False) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise InvalidInput(where, f"a number, got {v!r}")
    if not math.isfinite(v) or v < 0 or (v == 0 and not zero_ok):
        raise InvalidInput(where, f"a finite {'non-negative' if zero_ok else 'positive'} number, got {v!r}")
    return float(v)


def from_dict(data: dict[str, Any], *, source: str = "tolerances.toml") -> Policy:
    unknown = sorted(set(data) - {"defaults", "lowering", "kernel", "gate"})
    if unknown:
        raise InvalidInput(f"{source}: {unknown[0]}", "unknown table; expected [defaults.<dtype>], [lowering.\"<name>\".<dtype>], "
                                                      "[kernel.\"<key>\".<dtype>], [gate]")
    defaults: dict[str, Tolerance] = {}
    for dtype in DTYPES:
        table = data.get("defaults", {}).get(dtype)
        if table is None:
            raise InvalidInput(f"{source}: defaults.{dtype}", "missing table")
        _check_keys(f"{source}: defaults.{dtype}", table, required=True)
        defaults[dtype] = Tolerance(**{k: _number(f"{source}: defaults.{dtype}.{k}", table[k], zero_ok=k == "lse_rel")
                                       for k in TOLERANCE_KEYS if k in table})
    extra = sorted(set(data.get("defaults", {})) - set(DTYPES))
    if extra:
        raise InvalidInput(f"{source}: defaults.{extra[0]}", f"unknown dtype; expected one of {DTYPES}")
    overrides: dict[str, dict[str, dict[str, float]]] = {}
    for name, per_dtype in data.get("lowering", {}).items():
        if not isinstance(per_dtype, dict):
            raise InvalidInput(f"{source}: lowering.{name!r}", "a table of dtypes")
        for dtype, table in per_dtype.items():
            where = f"{source}: lowering.{name!r}.{dtype}"
            if dtype not in DTYPES:
                raise InvalidInput(where, f"unknown dtype; expected one of {DTYPES}")
            _check_keys(where, table, required=False)
            overrides.setdefault(name, {})[dtype] = {k: _number(f"{where}.{k}", v, zero_ok=k == "lse_rel")
                                                     for k, v in table.items()}
            replace(defaults[dtype], **overrides[name][dtype])  # validates the merged values
    kernels, kernel_reasons = _kernel_tables(data.get("kernel", {}), defaults, source)
    gate = data.get("gate", {})
    unknown = sorted(set(gate) - {"max_margin_growth"})
    if unknown:
        raise InvalidInput(f"{source}: gate.{unknown[0]}", "unknown key; expected max_margin_growth")
    growth = _number(f"{source}: gate.max_margin_growth", gate.get("max_margin_growth", 0.25))
    return Policy(defaults=defaults, overrides=overrides, max_margin_growth=growth, source=source,
                  kernels=kernels, kernel_reasons=kernel_reasons)


def _kernel_tables(tables: Any, defaults: dict[str, Tolerance], source: str
                   ) -> tuple[dict[str, dict[str, dict[str, float]]], dict[str, dict[str, str]]]:
    """`[kernel."<key>".<dtype>]` tables: tolerance keys plus a required `reason` (what was measured)."""
    kernels: dict[str, dict[str, dict[str, float]]] = {}
    reasons: dict[str, dict[str, str]] = {}
    if not isinstance(tables, dict):
        raise InvalidInput(f"{source}: kernel", 'tables [kernel."<key>".<dtype>]')
    for key, per_dtype in tables.items():
        if not isinstance(per_dtype, dict) or not key:
            raise InvalidInput(f"{source}: kernel.{key!r}", "a table of dtypes")
        for dtype, table in per_dtype.items():
            where = f"{source}: kernel.{key!r}.{dtype}"
            if dtype not in DTYPES:
                raise InvalidInput(where, f"unknown dtype; expected one of {DTYPES}")
            if not isinstance(table, dict):
                raise InvalidInput(where, "a table of tolerance keys")
            reason = table.get("reason")
            if not isinstance(reason, str) or not reason.strip():
                raise InvalidInput(f"{where}.reason", "missing: say what was measured (where, on which shapes, by which "
                                                      "run) in one line")
            bounds = {k: v for k, v in table.items() if k != "reason"}
            _check_keys(where, bounds, required=False)
            if not bounds:
                raise InvalidInput(where, f"no tolerance key; expected some of {', '.join(TOLERANCE_KEYS)}")
            kernels.setdefault(key, {})[dtype] = {k: _number(f"{where}.{k}", v, zero_ok=k == "lse_rel")
                                                  for k, v in bounds.items()}
            reasons.setdefault(key, {})[dtype] = reason.strip()
            replace(defaults[dtype], **kernels[key][dtype])  # validates the merged values
    return kernels, reasons


def _check_keys(where: str, table: Any, *, required: bool) -> None:
    if not isinstance(table, dict):
        raise InvalidInput(where, "a table of tolerance keys")
    unknown = sorted(set(table) - set(TOLERANCE_KEYS))
    if unknown:
        raise InvalidInput(f"{where}.{unknown[0]}", f"unknown key; expected {', '.join(TOLERANCE_KEYS)}")
    if required:
        missing = [k for k in TOLERANCE_KEYS if k not in table and k != "lse_rel"]
        if missing:
            raise InvalidInput(f"{where}.{missing[0]}", "missing key")
