"""What the reports and the gate say of a lowering whose LSE goes unchecked: one that declares
`lse_base = NO_LSE` (`lowerings.protocol`: its `run` returns `lse=None`, its output is judged alone).

Its `parity.json` entry has `"lse_checked": false` (absent: the LSE was checked in every judged case, a
missing one failing it); the table's status cell (terminal, `summary.md`, the pytest terminal summary),
a `summary.md` line and its `junit.xml` test case (a `lse_checked` property) say "LSE unchecked". The
gate's `lse-dropped` rule (`dropped`) fails a lowering whose LSE the baseline checked and the new report
does not. Pure functions of report entries (`parity.report.files`'s JSON).

Public: `UNCHECKED`, `lse_checked`, `status_cell`, `summary_lines`, `junit_properties`, `dropped`.
"""

from __future__ import annotations

from typing import Any

from parity.report.escape import md_code

UNCHECKED = "LSE unchecked"


def lse_checked(entry: dict[str, Any]) -> bool:
    """Whether a lowering entry's LSE was checked (an entry without the key: it was, as every entry written
    before output-only lowerings existed)."""
    return entry.get("lse_checked", True) is not False


def status_cell(entry: dict[str, Any], status: str) -> str:
    """`status`, with `" (LSE unchecked)"` for an output-only lowering."""
    return status if lse_checked(entry) else f"{status} ({UNCHECKED})"


def summary_lines(lowerings: dict[str, dict[str, Any]]) -> list[str]:
    """One `summary.md` line per lowering whose LSE went unchecked (none for an unavailable one)."""
    return [f"- {md_code(name)}: {UNCHECKED}: it declares no LSE (`lse_base = None`, its `run` returns `lse=None`); its "
            f"output alone was judged" for name, v in lowerings.items()
            if not lse_checked(v) and v.get("status") != "unavailable"]


def junit_properties(entry: dict[str, Any]) -> str:
    """The `<properties>` element of an output-only lowering's `junit.xml` test case ("" for any other)."""
    if lse_checked(entry):
        return ""
    return '<properties><property name="lse_checked" value="false"/></properties>'


def dropped(old: dict[str, Any] | None, new: dict[str, Any] | None) -> str | None:
    """Why the gate's `lse-dropped` rule fails a lowering (None when it does not): the baseline judged cases
    with its LSE checked, and the new report judges it without (it declares no LSE now). A lowering missing
    or unavailable on either side is another rule's (`lowering-removed`); a new one has no baseline."""
    if old is None or new is None or "unavailable" in (old.get("status"), new.get("status")):
        return None
    if lse_checked(old) and not lse_checked(new):
        return ("returns no LSE now (it declares lse_base None): the baseline checked its LSE in every judged "
                "case, the new report judges its output alone (LSE unchecked)")
    return None
