"""Tolerance policy: `tolerances.toml` loaded into frozen, validated `Tolerance` values.

Every table of bounds (`[defaults.<dtype>]`, `[lowering."<name>".<dtype>]`) carries a machine-checked
`reason = "..."` (what was measured, on which shapes, by which run) and may name the run logs it comes
from (`measured_in = ["docs/gpu/...md", ...]`); a table without a reason is refused. Every bound is held
under a sanity ceiling per dtype (`CEILINGS`, each with its reason): past it the bound no longer tells a
correct lowering from a broken one (an all-zeros output is 128-256 bf16 ulp and a relative L2 of 1.0
off), so it is refused unless the caller allows it explicitly (`allow_loose_bounds`, the CLI's
`--allow-loose-bounds`, recorded in the report).

A case's bounds are chosen after its lowering ran, from what ran (`Policy.for_case`): per tolerance key,
the lowering's own entry `[lowering."<name>".<dtype>]` wins over the entries of the kernels it ran
`[kernel."<key>".<dtype>]`, which win over `[defaults.<dtype>]`. `ToleranceSource` says which entry set
each bound and why it applied. A `[kernel."<key>".<dtype>]` table carries a reason like every
table of bounds and is held under the same ceilings.

The bounds themselves, their ceilings and where a case's came from are `parity.engine.tolerance`'s; its public
names are re-exported here.

Public: `Policy`, `load`, `from_dict`, `DEFAULT_PATH`, `INSTALLED_PATH`, `DEFAULT_MAX_MARGIN_GROWTH`; re-exported:
`Tolerance`, `TOLERANCE_KEYS`, `OPTIONAL_KEYS`, `META_KEYS`, `DTYPES`, `Ceiling`, `CEILINGS`,
`MAX_MARGIN_GROWTH_CEILING`, `ceiling_message`, `PolicyEntry`, `override_name`, `lowering_entry`, `kernel_entry`,
`default_entry`, `ToleranceSource`.
"""

from __future__ import annotations

import hashlib
import math
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from oracle.errors import InvalidInput
from parity.engine.tolerance import (  # noqa: F401  (public here too)
    CEILINGS, DTYPES, MAX_MARGIN_GROWTH_CEILING, META_KEYS, OPTIONAL_KEYS, TOLERANCE_KEYS, Ceiling, PolicyEntry,
    Tolerance, ToleranceSource, ceiling_message, default_entry, kernel_entry, lowering_entry, override_name, quoted)

DEFAULT_PATH = Path(__file__).resolve().parents[2] / "tolerances.toml"
# A non-editable install ships the file as data under <prefix>/share/dflash-parity/.
INSTALLED_PATH = Path(sys.prefix) / "share" / "dflash-parity" / "tolerances.toml"
DEFAULT_MAX_MARGIN_GROWTH = 0.25


@dataclass(frozen=True)
class Policy:
    """Defaults per dtype, overrides per lowering and dtype, and the gate's bound.

    `entries` holds every table of bounds by name (reason included); `sha256` is the file's content hash
    ('' for a policy not read from a file); `allow_loose_bounds` records whether bounds past `CEILINGS`
    were allowed when it was loaded."""

    defaults: dict[str, Tolerance]
    overrides: dict[str, dict[str, dict[str, float]]]
    max_margin_growth: float
    source: str
    entries: dict[str, PolicyEntry] | None = None
    sha256: str = ""
    allow_loose_bounds: bool = False
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

    def entry_names(self) -> list[str]:
        """Every entry but the defaults, as `[lowering."<name>".<dtype>]` / `[kernel."<key>".<dtype>]`."""
        return ([lowering_entry(n, d) for n, per in self.overrides.items() for d in per]
                + [kernel_entry(k, d) for k, per in self.kernels.items() for d in per])

    def check_lowerings(self, known: list[str]) -> None:
        """Fail on overrides naming a lowering that does not exist."""
        for name in self.overrides:
            if name not in known:
                raise InvalidInput(f"{self.source}: lowering.{name!r}",
                                   f"no such lowering; known: {', '.join(known)}")

    def bounds(self, lowering: str, dtype: str) -> dict[str, dict[str, Any]]:
        """Every bound applied to `lowering` in `dtype`: `{key: {"value", "source", "reason"}}`, the source
        being the table it comes from (an override, else the dtype's defaults)."""
        tol = self.for_lowering(lowering, dtype)
        over = self.overrides.get(lowering, {}).get(dtype, {})
        entries = self.entries or {}
        out: dict[str, dict[str, Any]] = {}
        for key in TOLERANCE_KEYS:
            src = override_name(lowering, dtype) if key in over else f"defaults.{dtype}"
            entry = entries.get(src)
            out[key] = {"value": getattr(tol, key), "source": src, "reason": entry.reason if entry else ""}
        return out

    def record(self, lowerings: list[str]) -> dict[str, Any]:
        """The policy as `parity.json` records it: the file and its hash, the gate's setting, every bound
        applied per lowering and dtype with its source and reason, and every override table."""
        entries = self.entries or {}
        return {
            "file": self.source, "sha256": self.sha256, "max_margin_growth": self.max_margin_growth,
            "allow_loose_bounds": self.allow_loose_bounds,
            "ceilings": {k: dict(c.per_dtype) for k, c in CEILINGS.items()},
            "bounds": {name: {d: self.bounds(name, d) for d in DTYPES} for name in lowerings},
            "overrides": {e.name: {"values": dict(e.values), "reason": e.reason, "measured_in": list(e.measured_in)}
                          for e in entries.values() if e.name.startswith(("lowering.", "kernel."))},
        }


def load(path: str | Path | None = None, *, allow_loose_bounds: bool = False) -> Policy:
    """The policy in `path` (default: the packaged `tolerances.toml`); bounds past `CEILINGS` are refused
    unless `allow_loose_bounds`."""
    if path is None:
        p = DEFAULT_PATH if DEFAULT_PATH.is_file() else INSTALLED_PATH
    else:
        p = Path(path)
    src = str(p)
    if not p.is_file():
        raise InvalidInput(src, "tolerance file not found")
    raw = p.read_bytes()
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
        raise InvalidInput(src, f"not valid TOML ({err})") from None
    pol = from_dict(data, source=src, allow_loose_bounds=allow_loose_bounds)
    return replace(pol, sha256=hashlib.sha256(raw).hexdigest())


def _number(where: str, v: Any, *, zero_ok: bool = False) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise InvalidInput(where, f"a number, got {v!r}")
    if not math.isfinite(v) or v < 0 or (v == 0 and not zero_ok):
        raise InvalidInput(where, f"a finite {'non-negative' if zero_ok else 'positive'} number, got {v!r}")
    return float(v)


def _entry(where: str, name: str, table: dict[str, Any], *, required: bool, dtype: str,
           allow_loose_bounds: bool) -> PolicyEntry:
    """One table of bounds checked: known keys, a reason, numbers, each under its ceiling."""
    _check_keys(where, table, required=required)
    reason = table.get("reason")
    if not isinstance(reason, str) or not reason.strip():
        raise InvalidInput(f"{where}.reason", f"missing: every table of bounds says why, e.g. reason = \"measured "
                                              f"... on ... (docs/gpu/...)\"; got {reason!r}")
    measured = table.get("measured_in", [])
    if isinstance(measured, str):
        measured = [measured]
    if not isinstance(measured, list) or not all(isinstance(m, str) and m.strip() for m in measured):
        raise InvalidInput(f"{where}.measured_in", f"a path or a list of paths (the run logs), got {measured!r}")
    values = {k: _number(f"{where}.{k}", v, zero_ok=k in OPTIONAL_KEYS) for k, v in table.items() if k not in META_KEYS}
    if not allow_loose_bounds:
        for k, v in values.items():
            msg = ceiling_message(k, v, dtype)
            if msg:
                raise InvalidInput(f"{where}.{k}", msg)
    return PolicyEntry(name=name, values=values, reason=reason.strip(), measured_in=tuple(measured))


def from_dict(data: dict[str, Any], *, source: str = "tolerances.toml", allow_loose_bounds: bool = False) -> Policy:
    unknown = sorted(set(data) - {"defaults", "lowering", "kernel", "gate"})
    if unknown:
        raise InvalidInput(f"{source}: {unknown[0]}", "unknown table; expected [defaults.<dtype>], [lowering.\"<name>\".<dtype>], "
                                                      "[kernel.\"<key>\".<dtype>], [gate]")
    defaults: dict[str, Tolerance] = {}
    entries: dict[str, PolicyEntry] = {}
    for dtype in DTYPES:
        table = data.get("defaults", {}).get(dtype)
        if table is None:
            raise InvalidInput(f"{source}: defaults.{dtype}", "missing table")
        e = _entry(f"{source}: defaults.{dtype}", f"defaults.{dtype}", table, required=True,
                   dtype=dtype, allow_loose_bounds=allow_loose_bounds)
        entries[e.name] = e
        defaults[dtype] = Tolerance(**e.values)
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
            e = _entry(where, override_name(name, dtype), table, required=False, dtype=dtype,
                       allow_loose_bounds=allow_loose_bounds)
            if not e.values:
                raise InvalidInput(where, f"sets no bound; expected some of {', '.join(TOLERANCE_KEYS)}")
            entries[e.name] = e
            overrides.setdefault(name, {})[dtype] = dict(e.values)
            replace(defaults[dtype], **overrides[name][dtype])  # validates the merged values
    kernels, kernel_reasons = _kernel_tables(data.get("kernel", {}), defaults, source, entries,
                                             allow_loose_bounds=allow_loose_bounds)
    gate = data.get("gate", {})
    if not isinstance(gate, dict):
        raise InvalidInput(f"{source}: gate", "a table with max_margin_growth")
    unknown = sorted(set(gate) - {"max_margin_growth", "reason"})
    if unknown:
        raise InvalidInput(f"{source}: gate.{unknown[0]}", "unknown key; expected max_margin_growth (and reason)")
    growth = _number(f"{source}: gate.max_margin_growth", gate.get("max_margin_growth", DEFAULT_MAX_MARGIN_GROWTH))
    limit = MAX_MARGIN_GROWTH_CEILING.per_dtype["gate"]
    if growth > limit and not allow_loose_bounds:
        raise InvalidInput(f"{source}: gate.max_margin_growth",
                           f"{growth:g} is past the sanity ceiling {limit:g} ({MAX_MARGIN_GROWTH_CEILING.reason}); "
                           f"pass --allow-loose-bounds to accept it")
    return Policy(defaults=defaults, overrides=overrides, max_margin_growth=growth, source=source, entries=entries,
                  allow_loose_bounds=allow_loose_bounds, kernels=kernels, kernel_reasons=kernel_reasons)


def _kernel_tables(tables: Any, defaults: dict[str, Tolerance], source: str, entries: dict[str, PolicyEntry], *,
                   allow_loose_bounds: bool) -> tuple[dict[str, dict[str, dict[str, float]]], dict[str, dict[str, str]]]:
    """`[kernel."<key>".<dtype>]` tables: tolerance keys plus a required `reason` (what was measured), held
    under the ceilings like every table; each is added to `entries` as `kernel."<key>".<dtype>`."""
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
            e = _entry(where, f"kernel.{quoted(key)}.{dtype}", table, required=False, dtype=dtype,
                       allow_loose_bounds=allow_loose_bounds)
            if not e.values:
                raise InvalidInput(where, f"no tolerance key; expected some of {', '.join(TOLERANCE_KEYS)}")
            entries[e.name] = e
            kernels.setdefault(key, {})[dtype] = dict(e.values)
            reasons.setdefault(key, {})[dtype] = e.reason
            replace(defaults[dtype], **kernels[key][dtype])  # validates the merged values
    return kernels, reasons


def _check_keys(where: str, table: Any, *, required: bool) -> None:
    if not isinstance(table, dict):
        raise InvalidInput(where, "a table of tolerance keys")
    unknown = sorted(set(table) - set(TOLERANCE_KEYS) - set(META_KEYS))
    if unknown:
        raise InvalidInput(f"{where}.{unknown[0]}", f"unknown key; expected {', '.join(TOLERANCE_KEYS)} "
                                                    f"(and reason, measured_in)")
    if required:
        missing = [k for k in TOLERANCE_KEYS if k not in table and k not in OPTIONAL_KEYS]
        if missing:
            raise InvalidInput(f"{where}.{missing[0]}", "missing key")
