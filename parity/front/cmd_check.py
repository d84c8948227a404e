"""`dflash-parity check`: a `CheckSession` over the command line's config, the table, the time split, each failure,
the gate when `--gate-baseline` is given (exit codes: `parity.front.exit_codes`).

Public: `add_parser`, `cmd_check`, `finish`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from parity.exec import interrupt
from parity.front.exit_codes import EXIT_FAIL, EXIT_OK
from parity.front.options import add_to_argparse, config_from_args
from parity.front.progress import progress_printer, say


def add_parser(sub, common) -> None:
    sp = sub.add_parser("check", help="draw cases for each lowering, judge them, shrink failures, write reports")
    common(sp)
    add_to_argparse(sp, common=False)  # parity.front.options: the options the pytest plugin has as --parity-...


def cmd_check(args: argparse.Namespace) -> int:
    """A `CheckSession` (parity.front.session) over the config of the command line, then the table, the time split
    and each failure on the terminal, and the gate when `--gate-baseline` is given."""
    from parity.front.session import CheckSession  # the session imports torch: not for `--help`'s parser
    from parity.front.shards import shard_label

    config = config_from_args(args)
    t0 = time.perf_counter()
    session = CheckSession(config, say=None if config.quiet else say)
    notice = interrupt.ignored_sigint_notice()
    if notice:
        print(notice, file=sys.stderr, flush=True)
    # The report directory is proven writable and free of links out of it, and locked against another
    # check, before anything else runs.
    with session.holding_report_dir():
        with interrupt.installed():
            try:
                data = session.run(progress_for=lambda name, shard: progress_printer(config.quiet,
                                                                                   label=shard_label(name, shard)))
            except SystemExit as exc:  # plugin code exiting the process: never a clean (or any) verdict
                print(f"dflash-parity: error: plugin code raised SystemExit({exc.code!r}) outside any case; the run "
                      f"fails (no verdict written)", file=sys.stderr)
                return EXIT_FAIL
        code = finish(config, data, Path(config.report), t0)
        res = session.gate()
    if res is not None:
        print(res.markdown)
        if not res.passed:
            code = max(code, EXIT_FAIL)
    return code


def _time_lines(data: dict) -> None:
    from parity.report import files as report_mod

    for name, v in data["lowerings"].items():
        line = report_mod.phase_line(v)
        if line:
            print(f"  time {name}: {line}", file=sys.stderr)
        line = report_mod.oracle_line(v)
        if line:
            print(f"  oracle {name}: {line}", file=sys.stderr)


def _failure_lines(name: str, v: dict, report_dir: Path) -> None:
    from oracle.case import Case
    from parity.report import files as report_mod

    for note in v.get("notes", []):
        print(f"\n{name}: {note}")
    for f in v.get("failures", []):
        what = "shrunk failing case" if f.get("shrunk") else "failing case (not shrunk)"
        print(f"\n{name}: {what} -> {report_dir / f['file']}")
        try:
            print(f"  {Case.from_json_dict(f['case']).short()}")
        except Exception:  # a case this version cannot read back is still shown as saved
            print(f"  {json.dumps(f['case'])[:200]}")
        for msg in f["failures"]:
            print(f"  - {msg}")
        if f.get("runs"):
            print(f"  re-run: {f['runs']}")
        print(f"  replay: {report_mod.replay_command(report_dir / f['file'], f.get('replay_args'))}")
        print(f"  {f['example']}")


def finish(config, data: dict, report_dir: Path, t0: float) -> int:
    """Print the table, the time split and each failure (from the report data); the exit code."""
    from parity.report import files as report_mod

    print(report_mod.format_table(report_mod.table_rows(data)))
    if not config.quiet:
        _time_lines(data)
    for entry in data.get("tolerances_unmatched", []):  # a typo must not leave the default in place unseen
        print(report_mod.unmatched_line(data.get("tolerances") or "tolerances.toml", entry), file=sys.stderr)
    failed = [(n, v) for n, v in data["lowerings"].items() if v["status"] == "fail"]
    for name, v in failed:
        _failure_lines(name, v, report_dir)
    where = f"reports in {report_dir}/ (parity.json, junit.xml, summary.md)"
    print(f"\n{len(data['lowerings'])} lowering(s), {sum(v['cases'] for v in data['lowerings'].values())} cases in "
          f"{time.perf_counter() - t0:.1f} s; {where}")
    return _exit_code(config, data, failed)


def _exit_code(config, data: dict, failed: list) -> int:
    """The exit code of a check from its report data (its `verdict` when it has one: not a --jobs child's)."""
    verdict = data.get("verdict")
    if verdict == "interrupted":
        return interrupt.exit_code()
    if verdict == "nothing judged":
        why = "; ".join(f"{n}: {v.get('reason') or 'every case unsupported'}" for n, v in data["lowerings"].items())
        print(f"\nnothing was judged: no lowering ran a case here ({why[:600]})"
              + ("; accepted (--allow-nothing-judged)" if config.allow_nothing_judged else
                 "; exit 1 (pass --allow-nothing-judged when that is expected)"), file=sys.stderr)
        return EXIT_OK if config.allow_nothing_judged else EXIT_FAIL
    return EXIT_FAIL if failed else EXIT_OK
