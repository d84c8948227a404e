"""`dflash-parity`: list, check, merge, repro, gate, and the verbs installed packages add (bench).

`main(argv)` runs the front ends' start-up (`parity.front.startup.start`) for the verbs that run cases (`check`,
`repro`, and an added verb that asks for it: `bench`), before the command line is parsed (parsing imports torch,
which the prefork's imports then overlap); `list` installs the ports alone; `gate` and `merge` start nothing. Then
the verb runs with the hook timeout set (`--hook-timeout`); bad input is one line naming it, exit 2. Exit codes:
`parity.front.exit_codes`.

A package adds a verb through the entry-point group `dflash_parity.verbs` (`NAME = "module:VERB"`; this one's
`bench`, `parity.bench.verb`): VERB has `help`, `machinery` (whether the start-up runs first), `add_arguments(parser)`
and `run(args, setup) -> exit code`, `setup(args) -> (device, policy)` being `load_for`.

Public: `main`, `console`, `build_parser`, `VERBS`, `Verb`, `added_verbs`, `load_for`, `cmd_list`, `cmd_merge`.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from dataclasses import dataclass
from importlib import metadata
from typing import Any, Callable, NoReturn, Sequence

from parity.exec import leftovers
from parity.front import cmd_check, cmd_gate, cmd_repro, startup
from parity.front.exit_codes import EXIT_FAIL, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE
from parity.front.options import add_to_argparse

VERB_GROUP = "dflash_parity.verbs"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse's own usage errors: exit 2 with the usage line
        self.print_usage(sys.stderr)
        print(f"dflash-parity: error: {message}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)


@dataclass(frozen=True)
class Verb:
    """One verb: `run(args) -> exit code`; `machinery`: the start-up runs before it; `ports`: the ports are installed
    before it (implied by `machinery`)."""

    run: Callable[[argparse.Namespace], int]
    machinery: bool = False
    ports: bool = False


def _common(sp: argparse.ArgumentParser) -> None:
    add_to_argparse(sp, common=True)  # --plugin, --device, --tolerances, --hook-timeout, --allow-loose-bounds


def added_verbs() -> dict[str, Any]:
    """The verbs installed packages add (`dflash_parity.verbs` entry points), by name; one that cannot be loaded is
    left out (said on stderr)."""
    out = {}
    for ep in sorted(metadata.entry_points(group=VERB_GROUP), key=lambda e: e.name):
        try:
            out[ep.name] = ep.load()
        except Exception as err:  # noqa: BLE001  (another package's import: said, the others go on)
            print(f"dflash-parity: warning: the verb {ep.name} ({ep.value}) cannot be loaded: "
                  f"{type(err).__name__}: {err}", file=sys.stderr)
    return out


def build_parser(added: dict[str, Any] | None = None) -> argparse.ArgumentParser:
    p = _Parser(prog="dflash-parity", description="Numerical parity of drafter block-attention lowerings "
                "against an fp32 oracle.")
    sub = p.add_subparsers(dest="verb", required=True, parser_class=_Parser)
    sp = sub.add_parser("list", help="lowerings, where each runs, whether it can run here and why not")
    _common(sp)
    cmd_check.add_parser(sub, _common)
    sp = sub.add_parser("merge", help="one report from the reports of a run's shards (check --shard I/S)",
                        description="Merge the reports of the S shards of one run (each written by "
                                    "`dflash-parity check --shard I/S`) into one report, as a serial run would "
                                    "have written it; `dflash-parity gate` reads the merged one. The shards must "
                                    "have been checked with the same settings, policy, plugins and commit.")
    sp.add_argument("reports", nargs="+", metavar="DIR", help="the shards' report directories (or parity.json files)")
    sp.add_argument("--report", required=True, metavar="OUT", help="the merged report's directory")
    sp.add_argument("--quiet", action="store_true", help="no table")
    cmd_repro.add_parser(sub, _common)
    for name, verb in (added_verbs() if added is None else added).items():
        sp = sub.add_parser(name, help=verb.help)
        _common(sp)
        verb.add_arguments(sp)
    cmd_gate.add_parser(sub)
    return p


def load_for(args: argparse.Namespace) -> tuple[str, Any]:
    """The plugins, the device and the policy of a verb that runs no check session (`list`, an added verb)."""
    import lowerings
    from parity.engine import policy as policy_mod
    from parity.exec import hooks
    from parity.front.session import default_device

    for path in args.plugins:
        hooks.load_plugin(path)
    device = args.device or default_device()
    pol = policy_mod.load(args.tolerances, allow_loose_bounds=getattr(args, "allow_loose_bounds", False))
    pol.check_lowerings(lowerings.names())
    return device, pol


def cmd_list(args: argparse.Namespace) -> int:
    import lowerings
    from lowerings.calls import HookFailure, call
    from lowerings.protocol import lse_name
    from parity.report.files import format_table

    device, _ = load_for(args)
    rows = [["lowering", "runs on", "LSE base", f"here ({device})"]]
    for lw in lowerings.all_lowerings():
        try:
            ok, why = call(lw, "available", device)
        except HookFailure as hf:
            ok, why = False, hf.message
        rows.append([lw.name, ",".join(lw.devices), lse_name(lw.lse_base), "yes" if ok else f"no: {why}"])
    print(format_table(rows))
    return EXIT_OK


def cmd_merge(args: argparse.Namespace) -> int:
    """One report from the shards' reports (parity.report.merge); the table; the exit code of its verdict."""
    from parity.report import files as report_mod
    from parity.report import merge

    data = merge.merge_reports(args.reports, args.report)
    if not args.quiet:
        print(report_mod.format_table(report_mod.table_rows(data)))
        print(f"\nmerged {len(args.reports)} shard report(s) into {args.report}/ (parity.json, junit.xml, summary.md): "
              f"{data['verdict']}")
    return {"pass": EXIT_OK, "interrupted": EXIT_INTERRUPTED}.get(data["verdict"], EXIT_FAIL)


VERBS: dict[str, Verb] = {
    "list": Verb(cmd_list, ports=True), "check": Verb(cmd_check.cmd_check, machinery=True),
    "merge": Verb(cmd_merge), "repro": Verb(cmd_repro.cmd_repro, machinery=True), "gate": Verb(cmd_gate.cmd_gate)}


def _option_value(tokens: Sequence[str], name: str) -> str | None:
    """The value of `name` as the command line gives it (`--name V` or `--name=V`; the last one wins), or None."""
    value = None
    for i, tok in enumerate(tokens):
        if tok == name and i + 1 < len(tokens):
            value = tokens[i + 1]
        elif tok.startswith(name + "="):
            value = tok.split("=", 1)[1]
    return value


def jobs_asked(tokens: Sequence[str]) -> tuple[int, str]:
    """`check --jobs N --jobs-start HOW` read from the raw tokens, before parsing (a guess: the start-up launches the
    prefork from it, which the run adopts only where it needs one); (1, ...) where it is not a check's or unreadable."""
    how = _option_value(tokens, "--jobs-start") or "prefork"
    if not tokens or tokens[0] != "check" or "-h" in tokens or "--help" in tokens:
        return 1, how
    try:
        return max(1, int(_option_value(tokens, "--jobs") or "1")), how
    except ValueError:
        return 1, how


def main(argv: Sequence[str] | None = None, added: dict[str, Any] | None = None) -> int:
    """Run the command line `argv` (default: this process's); `added`: the verbs other packages add, by name
    (default: the installed entry points, `added_verbs()`; a source tree that is not installed passes its own)."""
    tokens = sys.argv[1:] if argv is None else list(argv)
    added = added_verbs() if added is None else added
    verbs = {**VERBS, **{name: Verb(lambda args, v=v: v.run(args, load_for), machinery=v.machinery, ports=True)
                         for name, v in added.items()}}
    verb = verbs.get(tokens[0]) if tokens else None
    started = startup.start(*jobs_asked(tokens)) if verb is not None and verb.machinery else None
    if verb is not None and verb.ports and started is None:
        startup.install_ports()
    try:
        return _main(tokens, verbs, added)
    finally:
        if started is not None:
            started.close()


def _main(tokens: list[str], verbs: dict[str, Verb], added: dict[str, Any]) -> int:
    from oracle.errors import InvalidInput
    from parity.exec import hooks, interrupt

    parser = build_parser(added)
    try:
        args = parser.parse_args(tokens)
    except SystemExit as exit_:  # --help (0) or a usage error (2, message already printed)
        return int(exit_.code or 0)
    try:
        with hooks.timeout_set(getattr(args, "hook_timeout", None)):
            return verbs[args.verb].run(args)
    except (InvalidInput, ValueError) as err:  # validated settings raise ValueError with the option named
        print(f"dflash-parity: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("dflash-parity: interrupted", file=sys.stderr)
        return interrupt.exit_code()


def console() -> NoReturn:
    """The `dflash-parity` program: `main()`, then the end of the process whatever plugin code left running
    (`parity.exec.leftovers.finish`: its child processes stopped, its non-daemon threads named and not waited for),
    with `main()`'s exit code (1 after a traceback, should the framework itself raise)."""
    try:
        code = main()
    except Exception:  # noqa: BLE001  (a bug of the framework: said, and the process ends all the same)
        traceback.print_exc()
        code = EXIT_FAIL
    leftovers.finish(code)


if __name__ == "__main__":  # pragma: no cover
    console()
