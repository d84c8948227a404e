"""A case's bounds: `Tolerance` (one value per tolerance key, in one working dtype), the sanity ceilings every
bound is held under (`CEILINGS`, each with its reason), the tables of bounds as `tolerances.toml` writes them
(`PolicyEntry`, and their names: `lowering_entry`, `kernel_entry`, `default_entry`), and where a case's bounds came
from (`ToleranceSource`). `parity.engine.policy` chooses them from the file; it re-exports every public name here.

Public: `Tolerance`, `TOLERANCE_KEYS`, `OPTIONAL_KEYS`, `META_KEYS`, `DTYPES`, `Ceiling`, `CEILINGS`,
`MAX_MARGIN_GROWTH_CEILING`, `ceiling_message`, `PolicyEntry`, `override_name`, `quoted`, `lowering_entry`,
`kernel_entry`, `default_entry`, `ToleranceSource`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Mapping

from oracle.errors import InvalidInput

DTYPES = ("bfloat16", "float16")
META_KEYS = ("reason", "measured_in")  # the non-bound keys of a table of bounds
OPTIONAL_KEYS = ("lse_rel", "yardstick_score_rel", "out_score_rel")  # may be 0, may be left out of [defaults.<dtype>] (0 then)


@dataclass(frozen=True)
class Tolerance:
    """Bounds for one lowering in one working dtype (units: see tolerances.toml)."""

    out_max_ulp: float
    out_rel_l2: float
    yardstick_factor: float
    yardstick_floor_ulp: float
    lse_abs: float
    lse_rel: float = 0.0
    yardstick_score_rel: float = 0.0
    out_score_rel: float = 0.0

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name in OPTIONAL_KEYS:
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                    raise InvalidInput(f.name, f"a finite number >= 0, got {v!r}")
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise InvalidInput(f.name, f"a finite positive number, got {v!r}")


TOLERANCE_KEYS = tuple(f.name for f in fields(Tolerance))


@dataclass(frozen=True)
class Ceiling:
    """The largest value a bound may take in each dtype before it stops meaning anything, and why."""

    per_dtype: dict[str, float]
    reason: str


# A quarter of max|O_ref| is 32 bf16 ulp and 256 fp16 ulp (ulp = 2^-7 and 2^-10 of the binade): an output
# that far off is wrong, not rounded (the defaults are 8 ulp; correct lowerings measure about 2).
_QUARTER = {"bfloat16": 32.0, "float16": 256.0}
CEILINGS: dict[str, Ceiling] = {
    "out_max_ulp": Ceiling(_QUARTER, "a quarter of max|O_ref| (4x the 8-ulp default in bf16); an all-zeros "
                                     "output is 128-256 bf16 ulp (1024-2048 fp16 ulp) off"),
    "out_rel_l2": Ceiling({d: 0.1 for d in DTYPES}, "10x docs/semantics.md's 1e-2; an all-zeros output has 1.0, a window "
                                                     "one key off typically 0.05-0.5"),
    "yardstick_factor": Ceiling({d: 16.0 for d in DTYPES}, "8x flash-attn's factor of 2 over the working-dtype SDPA"),
    "yardstick_floor_ulp": Ceiling(_QUARTER, "the out_max_ulp ceiling: a floor above it waives the yardstick rule"),
    "lse_abs": Ceiling({d: 0.05 for d in DTYPES}, "50x the 1e-3 default and 25x the largest measured override "
                                                  "(2e-3, flashinfer fa2); an LSE in the wrong base is off by 0.31 |LSE|"),
    "lse_rel": Ceiling({d: 0.01 for d in DTYPES}, "4x the largest measured override (2.5e-3, flashinfer fa2); "
                                                  "an LSE in the wrong base is off by 0.31 |LSE|"),
    "yardstick_score_rel": Ceiling({d: 1e-4 for d in DTYPES}, "1.7x the largest measured override (6e-5, flashinfer "
                                                              "fa2 fp16); past it the term passes a plain case's "
                                                              "(|LSE| ~ 10) output off by 1e-3 of max|O_ref| and more"),
    "out_score_rel": Ceiling({d: 1e-4 for d in DTYPES}, "the same as yardstick_score_rel's: the same measured score "
                                                        "error, added to the absolute bound"),
}
MAX_MARGIN_GROWTH_CEILING = Ceiling({"gate": 1.0}, "a margin that may grow by a whole tolerance between two runs "
                                                   "gates nothing")


def ceiling_message(key: str, value: float, dtype: str) -> str | None:
    """The refusal of `value` for bound `key` in `dtype` when it is past its ceiling, else None."""
    c = CEILINGS[key]
    limit = c.per_dtype[dtype]
    if value <= limit:
        return None
    return (f"{value:g} is past the sanity ceiling {limit:g} for {dtype} ({c.reason}); pass --allow-loose-bounds "
            f"to accept it (recorded in the report)")


@dataclass(frozen=True)
class PolicyEntry:
    """One table of bounds: its name as written in the file, the bounds it sets, its reason and logs."""

    name: str  # `defaults.bfloat16` or `lowering."context[flashinfer-fa2]".bfloat16`
    values: dict[str, float]
    reason: str
    measured_in: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.reason, str) or not self.reason.strip():
            raise InvalidInput(f"{self.name}.reason", "a non-empty string saying what was measured, where")


def override_name(lowering: str, dtype: str) -> str:
    return f"lowering.{quoted(lowering)}.{dtype}"


def quoted(name: str) -> str:
    """`name` as a TOML quoted key (backslashes and quotes escaped)."""
    return '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'


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
        """`cite(key)` for every tolerance key (what `parity.engine.judge.compare` takes as `bound_from`)."""
        return {k: self.cite(k) for k in TOLERANCE_KEYS}
