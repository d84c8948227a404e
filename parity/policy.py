"""Tolerance policy: `tolerances.toml` loaded into frozen, validated `Tolerance` values."""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

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

    def for_lowering(self, lowering: str, dtype: str) -> Tolerance:
        base = self.defaults[dtype]
        over = self.overrides.get(lowering, {}).get(dtype, {})
        return replace(base, **over) if over else base

    def check_lowerings(self, known: list[str]) -> None:
        """Fail on overrides naming a lowering that does not exist."""
        for name in self.overrides:
            if name not in known:
                raise InvalidInput(f"{self.source}: lowering.{name!r}",
                                   f"no such lowering; known: {', '.join(known)}")


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
    unknown = sorted(set(data) - {"defaults", "lowering", "gate"})
    if unknown:
        raise InvalidInput(f"{source}: {unknown[0]}", "unknown table; expected [defaults.<dtype>], [lowering.\"<name>\".<dtype>], [gate]")
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
    gate = data.get("gate", {})
    unknown = sorted(set(gate) - {"max_margin_growth"})
    if unknown:
        raise InvalidInput(f"{source}: gate.{unknown[0]}", "unknown key; expected max_margin_growth")
    growth = _number(f"{source}: gate.max_margin_growth", gate.get("max_margin_growth", 0.25))
    return Policy(defaults=defaults, overrides=overrides, max_margin_growth=growth, source=source)


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
