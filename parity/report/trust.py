"""A report read back (by `gate`, by `merge`) is input, not a verdict to take on trust.

- `check_report(data, where)`: refuses (one `InvalidInput` naming `where` and the field, exit 2) a report
  whose run did not finish (no `finished` time: `parity.report.provenance.finish` stamps it with the verdict), a
  lowering entry that is not an object or whose status is none of `STATUSES`, a count (`cases`, `passed`,
  `unsupported`, `judged`, `calls_checked`, a class's `cases` and `failed`) that is not an integer >= 0, a
  figure the gate reads (`worst_margin`, `worst_ulp`, `seconds`; a policy bound's `value`, an override's
  values, `max_margin_growth`) that is not a finite number: `"nan"`, `"inf"`, NaN, a string. A report
  `check` writes has none of these (worst figures come from passing cases only, so they are finite).
- `entry_status(entry)`: a lowering's status recomputed from its cases and failures, never read as a
  pass: `fail` when it lists a failure, has a class with a failed case, or was interrupted, whatever its
  `status` says; else its own `fail` or `unavailable`, or `pass`.
- `recomputed(data)`: the report with every lowering's status recomputed and its `verdict` the worse of
  the recorded one and `parity.report.provenance.verdict_of` over the recomputed statuses (interrupted, then
  fail, then nothing judged, then pass: a `pass` recorded over a failing lowering becomes `fail`).

Public: `check_report`, `entry_status`, `recomputed`, `STATUSES`.
"""

from __future__ import annotations

import copy
import math
from typing import Any

from oracle.errors import InvalidInput
from parity.report.provenance import VERDICTS, verdict_of

STATUSES = ("pass", "fail", "unavailable")
_COUNTS = ("cases", "passed", "unsupported", "judged", "calls_checked")
_FIGURES = ("worst_margin", "worst_ulp", "seconds")


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _count(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _refuse(where: str, field: str, rule: str) -> InvalidInput:
    return InvalidInput(f"{where}: {field}", rule)


def _figure(where: str, field: str, x: Any) -> None:
    if not _finite(x):
        raise _refuse(where, field, f"not a finite number ({x!r}); a report `check` writes has only finite "
                                    f"figures here, so this one was edited or corrupted")


def _entry(where: str, name: str, v: Any) -> None:
    at = f"lowerings.{name}"
    if not isinstance(v, dict):
        raise _refuse(where, at, f"not an object ({type(v).__name__})")
    if v.get("status") not in STATUSES:
        raise _refuse(where, f"{at}.status", f"one of {', '.join(STATUSES)}, got {v.get('status')!r}")
    for key in _COUNTS:
        if key in v and not _count(v[key]):
            raise _refuse(where, f"{at}.{key}", f"not an integer >= 0 ({v[key]!r})")
    for key in _FIGURES:
        if key in v:
            _figure(where, f"{at}.{key}", v[key])
    classes = v.get("classes", {})
    if not isinstance(classes, dict) or not all(isinstance(c, dict) and _count(c.get("cases")) and
                                                _count(c.get("failed")) for c in classes.values()):
        raise _refuse(where, f"{at}.classes", 'an object of {"cases": n, "failed": n} counts (integers >= 0)')
    if not isinstance(v.get("failures", []), list) or not isinstance(v.get("notes", []), list):
        raise _refuse(where, at, "its failures and notes are lists")


def _policy(where: str, pol: dict[str, Any]) -> None:
    if "max_margin_growth" in pol:
        _figure(where, "policy.max_margin_growth", pol["max_margin_growth"])
    for name, per in pol.get("bounds", {}).items():
        for dtype, keys in (per.items() if isinstance(per, dict) else [("?", None)]):
            if not isinstance(keys, dict):
                raise _refuse(where, f"policy.bounds.{name}.{dtype}", "an object of bounds")
            for key, b in keys.items():
                _figure(where, f"policy.bounds.{name}.{dtype}.{key}.value", b.get("value") if isinstance(b, dict) else b)
    for entry, e in (pol.get("overrides") or {}).items():
        for key, val in ((e or {}).get("values") or {}).items() if isinstance(e, dict) else ():
            _figure(where, f"policy.overrides.{entry}.values.{key}", val)


def check_report(data: dict[str, Any], where: str) -> None:
    """Refuse a report whose run did not finish or whose figures cannot be trusted (see the module docstring)."""
    if not isinstance(data.get("finished"), str):
        raise _refuse(where, "finished", "missing: the run that wrote this report did not finish (a verdict is "
                                         "stamped with its finished time), so it is no verdict")
    if data.get("verdict") not in VERDICTS:
        raise _refuse(where, "verdict", f"one of {', '.join(VERDICTS)}, got {data.get('verdict')!r}")
    for name, v in data["lowerings"].items():
        _entry(where, name, v)
    _policy(where, data["policy"])


def entry_status(entry: dict[str, Any]) -> str:
    """A lowering entry's status from its cases and failures (see the module docstring)."""
    failed = bool(entry.get("failures")) or bool(entry.get("interrupted")) or \
        any(int(c.get("failed", 0)) > 0 for c in (entry.get("classes") or {}).values())
    if failed:
        return "fail"
    return entry["status"] if entry.get("status") in ("fail", "unavailable") else "pass"


def _worse(a: str, b: str) -> str:
    order = ("interrupted", "fail", "nothing judged", "pass")
    return min(a, b, key=lambda v: order.index(v) if v in order else 0)


def recomputed(data: dict[str, Any]) -> dict[str, Any]:
    """A copy of checked report data with every status recomputed and the worse verdict (see the module
    docstring)."""
    out = copy.deepcopy(data)
    for v in out["lowerings"].values():
        v["status"] = entry_status(v)
    recorded = str(out.get("verdict"))
    out["verdict"] = _worse(recorded, verdict_of(out, interrupted=recorded == "interrupted"))
    return out
