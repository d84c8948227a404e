"""What a check draws for one lowering on one device: its limits, the strategy, the boundary cases.

`limits_for` is where a lowering's own limits meet the device's defaults: a lowering's `case_limits`
(or `Limits()`), the profile's and `--limit`'s changes, then every production field it left None set
for the device (`strategies._production.resolve`). So every lowering, a plugin's too, draws the
production dimension on CUDA unless it declares narrower limits itself. `check_cases` adds the strategy
and the boundary cases `check`, the pytest plugin and the tests run first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from lowerings import calls as hooks
from lowerings.limits import Limits, with_overrides
from oracle.case import Case
from strategies._boundaries import Boundary, boundary_cases
from strategies._cases import cases
from strategies._production import resolve
from strategies._profiles import PROFILES


@dataclass(frozen=True)
class CheckCases:
    """The limits a check of one lowering draws under, the strategy, and the boundary cases run first."""

    limits: Limits
    strategy: st.SearchStrategy[Case]
    boundaries: tuple[Boundary, ...]


def _limits_answer(value: Any) -> str | None:
    """`case_limits(device)`: None (the device's defaults) or a `strategies.Limits`."""
    return None if value is None or isinstance(value, Limits) else "None or a strategies.Limits"


def limits_for(lowering: Any, device: str, *, profile: str | None = None,
               overrides: dict[str, Any] | None = None) -> Limits:
    """`lowering.case_limits(device)` (or `Limits()`; asked under the hook watchdog, `lowerings.calls.call`: a
    hook that raises or hangs, or answers anything but None or a `Limits`, raises HookFailure), `overrides`
    (`--limit`) applied, then the production fields still None set from `profile`'s defaults and the device's
    (see the module docstring)."""
    lim = hooks.call_optional(lowering, "case_limits", device, expect=_limits_answer) if lowering is not None else None
    lim = lim or Limits()
    lim = with_overrides(lim, overrides or {}) or lim
    return resolve(lim, device, PROFILES.get(profile) if profile else None)


def check_cases(lowering: Any, device: str, *, profile: str | None = None, overrides: dict[str, Any] | None = None,
                **fixed: Any) -> CheckCases:
    """`limits_for(...)`, the `cases` strategy under them (`fixed` fields as `cases` takes them) and the
    lowering's boundary cases (none when fields are fixed: the caller narrowed the draw on purpose)."""
    lim = limits_for(lowering, device, profile=profile, overrides=overrides)
    bounds = () if fixed else tuple(boundary_cases(lowering, lim))
    return CheckCases(lim, cases(lowering, limits=lim, **fixed), bounds)
