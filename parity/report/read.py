"""Reading a report back (`gate`, `merge`): one `InvalidInput` naming the file and the field for anything
that is not a finished version-2 report of `check` (exit 2, never a traceback), and the data with its
statuses and verdict recomputed (`parity.report.trust`).

- `report_path(path)`: a report directory's `parity.json`, or the file given.
- `load_report(path, what)`: read with `parity.report.intake.read_json` (a FIFO, a device, a file past 256 MiB or
  nested too deeply is refused by kind, size and depth, never blocking); the schema, version 2 (version 1
  recorded neither the settings nor the policy, so it cannot be compared honestly), the fields the gate
  reads and their types; then `report_trust.check_report` (the run finished, every figure finite) and
  `report_trust.recomputed`.
- `unfinished(path)`: why the report's directory is no verdict yet (marked `IN_PROGRESS`), or None.

Public: `report_path`, `load_report`, `unfinished`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from oracle.errors import InvalidInput
from parity.report import trust as report_trust, rundir
from parity.report.escape import md_code as _c, md_text as _t
from parity.report.intake import read_json
from parity.report.files import SCHEMA, SCHEMA_VERSION

_V2_FIELDS = {"run_id": str, "started": str, "verdict": str, "settings": dict, "policy": dict, "lowerings": dict}
_SETTINGS_FIELDS = {"device": str, "profile": str, "hardening": bool, "isolation": bool, "limits": list}


def report_path(path: str | Path) -> Path:
    """`DIR/parity.json` for a report directory, else the path as given."""
    p = Path(path)
    return p / "parity.json" if p.is_dir() else p


def load_report(path: str | Path, what: str) -> dict[str, Any]:
    """The report at `path` (a directory or its parity.json), checked and recomputed (see the module
    docstring); `what` names it in a refusal (`NEW`, `--baseline`, `REPORT DIR`)."""
    p = report_path(path)
    if not p.exists():
        raise InvalidInput(f"{what} {path}", "no parity.json there (give a report directory or its parity.json)")
    try:  # a FIFO, a device, a huge or deeply nested file: refused by kind, size and depth, never blocking
        data = read_json(p, "report")
    except InvalidInput as err:
        raise InvalidInput(f"{what} {err.where}", err.rule) from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise InvalidInput(f"{what} {p}", f"not a dflash-parity report (schema {SCHEMA!r})")
    version = data.get("version")
    if version == 1:
        raise InvalidInput(f"{what} {p}", "report version 1 records neither the settings nor the policy the run "
                                          f"checked with, so it cannot be compared honestly; this gate reads version "
                                          f"{SCHEMA_VERSION}: re-run `dflash-parity check` to write it")
    if version != SCHEMA_VERSION:
        raise InvalidInput(f"{what} {p}", f"report version {version!r}; this gate reads version {SCHEMA_VERSION}")
    for key, kind in _V2_FIELDS.items():
        if not isinstance(data.get(key), kind):
            raise InvalidInput(f"{what} {p}: {key}", f"missing or not a {kind.__name__} (a version-2 report has it)")
    for key, kind in _SETTINGS_FIELDS.items():
        if not isinstance(data["settings"].get(key), kind):
            raise InvalidInput(f"{what} {p}: settings.{key}", f"missing or not a {kind.__name__}")
    if not isinstance(data["policy"].get("bounds"), dict):
        raise InvalidInput(f"{what} {p}: policy.bounds", "missing or not an object")
    report_trust.check_report(data, f"{what} {p}")  # finished, finite figures: else refused, exit 2
    return report_trust.recomputed(data)  # statuses and verdict from the cases and failures, never read


def unfinished(path: str | Path) -> str | None:
    """Why the report at `path` is no verdict yet (its directory marked IN_PROGRESS), or None."""
    d = report_path(path).parent
    info = rundir.in_progress(d)
    if info is None:
        return None
    return (f"{_c(d)} is marked in progress ({rundir.MARKER}: run {_t(info.get('run_id', '?'))}, started "
            f"{_t(info.get('started', '?'))}, pid {_t(info.get('pid', '?'))}): its check has not finished, or died; "
            f"no verdict to compare")
