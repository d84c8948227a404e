"""A `check --jobs` child: `python -m parity.front.child --part SPEC` checks one part and writes it.

SPEC (`parity.front.part.part_spec`) is the run's `CheckConfig` as JSON and the part: one lowering, or one shard of
it. The child installs the ports (`parity.front.startup.install_ports`), takes SIGINT whatever its parent was
started with (its parent's means "write your partial part"), checks its part in a `CheckSession` and writes the part
(`parity.front.parts.part_path`; a shard's failure files in its own directory). Exit codes: `parity.front.exit_codes`
(0 pass, 1 fail, 2 bad input, 130 interrupted: the part of the cases that ran is written first).

Public: `main(argv)`, `run_part(session)`.
"""

from __future__ import annotations

import contextlib
import json
import sys
from typing import Any, Sequence

import lowerings
from oracle.errors import InvalidInput
from parity.exec import interrupt
from parity.exec.leftovers import finish
from parity.front import shards as shards_mod
from parity.front import startup
from parity.front.config import CheckConfig
from parity.front.exit_codes import EXIT_FAIL, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE
from parity.front.part import Part, compose
from parity.front.parts import part_path, shared_draws_path, workers_cpu_path
from parity.front.progress import progress_printer, say
from parity.front.session import CheckSession
from parity.report.file_names import lowering_stem
from parity.report.files import format_table, table_rows


def run_part(session: CheckSession) -> tuple[dict[str, Any], bool]:
    """The child's check of `session.part`: the part written (`part_path`); (data, interrupted)."""
    session.load()
    name, inner = session.part.lowering, session.part.shard
    report_dir = session.report_dir
    shard = compose(session.config.shard, inner)
    work_dir = report_dir if inner is None else shards_mod.shard_dir(report_dir, lowering_stem(name), inner)
    label = shards_mod.shard_label(name, inner)
    progress = None if session.config.quiet else progress_printer(False, lines=True, label=label)
    try:
        shared = shared_draws_path(report_dir, name, inner[1]) if inner else None
        rep = session.check(lowerings.get(name), shard=shard, work_dir=work_dir, progress=progress,
                            shared_draws=shared)
    finally:
        session.close()
        if session.worker_cpu_seconds:  # the parent's count of this child's CPU cannot see them (not its children)
            with contextlib.suppress(OSError):
                workers_cpu_path(report_dir, name, inner).write_text(f"{session.worker_cpu_seconds:.3f}\n")
    fams = rep.compile_families
    data = session.write([rep], part=part_path(report_dir, name, inner), work_dir=work_dir,
                         amend_part=lambda entry: shards_mod.shard_part_entry(entry, work_dir if inner else None, fams))
    return data, rep.interrupted


def main(argv: Sequence[str]) -> int:
    """Check the part SPEC names and write it; the exit code (see the module docstring)."""
    if len(argv) != 2 or argv[0] != "--part":
        print("usage: python -m parity.front.child --part SPEC (a dflash-parity check --jobs child)", file=sys.stderr)
        return EXIT_USAGE
    startup.install_ports()
    try:
        spec = json.loads(argv[1])
        config = CheckConfig.from_json(spec["config"])
        part = Part.from_json(spec["part"])
        with interrupt.installed(force=True):
            session = CheckSession(config, say=None if config.quiet else say, part=part)
            try:
                data, interrupted = run_part(session)
            except SystemExit as exc:  # plugin code exiting the process: never a clean (or any) verdict
                print(f"dflash-parity: error: plugin code raised SystemExit({exc.code!r}) outside any case; the "
                      f"part fails (none written)", file=sys.stderr)
                return EXIT_FAIL
    except (InvalidInput, ValueError, KeyError, TypeError) as err:
        print(f"dflash-parity: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return interrupt.exit_code()
    print(format_table(table_rows(data)))
    if interrupted:
        return EXIT_INTERRUPTED
    return EXIT_FAIL if any(v["status"] == "fail" for v in data["lowerings"].values()) else EXIT_OK


if __name__ == "__main__":  # pragma: no cover
    from parity.front.child import main as _main  # the module proper, not this __main__ copy

    finish(_main(sys.argv[1:]))
