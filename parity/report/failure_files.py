"""The failure files of a run, one per shrunk failure, and the command that replays each.

A failure file (`failures/<stem>-<n>.json`, `<stem>` one-to-one with the lowering's name:
`parity.report.file_names.lowering_stem`) stands on its own: `{"lowering", "device", "shrunk", "failures",
"case", "figures" (the failing case's main comparison, {} for a crash), "plugins": [{"path", "sha256"}] (the
plugin file that registered the lowering; `repro` loads it again), "replay": the exact command}`, and the
extras of its failure (`parity.engine.outcome.failure_extras`: runs, classification, sanitizer, slip).

- `write_failure_files(dir, reports, ...)`: each lowering's files, after removing the files an earlier run
  left for that lowering (they were replayed first; this run writes its own).
- `replay_args(device, tolerances)`: the options `repro` needs to judge a failure as `check` did;
  `replay_command(file, args)`: `dflash-parity repro FILE ...`, quoted for a shell.
- `plugin_records(paths)`: the plugin files with their content hashes.

Public: `write_failure_files`, `replay_args`, `replay_command`, `plugin_records`, `file_sha256`.
"""

from __future__ import annotations

import hashlib
import shlex
from pathlib import Path

from parity.engine.outcome import LoweringReport, failure_extras, failure_figures
from parity.report.file_names import check_distinct, failure_filename, lowering_stem, stem_files
from parity.report.writing import atomic_write, dumps


def file_sha256(path: str | Path) -> str:
    """The hex SHA-256 of a file's bytes (OSError when it cannot be read)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def plugin_records(paths) -> list[dict[str, str]]:
    """`[{"path": absolute path, "sha256": content hash}]` of plugin files (what `repro` loads back)."""
    return [{"path": str(Path(p).resolve()), "sha256": file_sha256(p)} for p in paths]


def replay_args(device: str, tolerances: str | None) -> list[str]:
    """The options `repro` needs to judge a failure as `check` did (the plugin is in the file itself)."""
    return ["--device", device] + (["--tolerances", str(Path(tolerances).resolve())] if tolerances else [])


def replay_command(failure_path: str | Path, args: list[str] | None = None) -> str:
    """`dflash-parity repro FILE --device cpu ...`, quoted for a shell."""
    return shlex.join(["dflash-parity", "repro", str(failure_path)] + list(args or []))


def write_failure_files(report_dir: str | Path, reports: list[LoweringReport], *, device: str,
                        replay: list[str] | None = None, plugins: dict[str, list[dict[str, str]]] | None = None) -> None:
    """Each report's `failures/<stem>-<n>.json` (see the module docstring), after removing the lowering's
    failure files of an earlier run (they were replayed first; this run writes its own)."""
    d = Path(report_dir)
    check_distinct([r.lowering for r in reports], "--lowering")
    for r in reports:
        for old in stem_files(d / "failures", lowering_stem(r.lowering)):
            old.unlink()
        for n, f in enumerate(r.failures, 1):
            path = d / "failures" / failure_filename(r.lowering, n)
            payload = {"lowering": r.lowering, "device": device, "shrunk": f.shrunk,
                       "failures": f.outcome.failures, "case": f.outcome.case.to_json_dict(),
                       "figures": failure_figures(f.outcome), "plugins": (plugins or {}).get(r.lowering, []),
                       "replay": replay_command(path, replay), **failure_extras(f)}
            atomic_write(path, dumps(payload) + "\n")
