"""`dflash-parity`: list, check, repro, gate, bench.

Exit codes: 0 all hold; 1 a parity failure (or a gate failure), or `check` judged nothing (every lowering
unavailable or every case unsupported; `--allow-nothing-judged` makes that 0); 2 bad usage or bad input
(one clear message naming the input, no traceback); 128+n interrupted by signal n (130 SIGINT, 143
SIGTERM, 129 SIGHUP): `check` first writes the report of the cases that ran, the interrupted lowering
marked failed as a partial run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import NoReturn, Sequence

from parity.exec import leftovers

from parity.engine import ranges

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2
EXIT_INTERRUPTED = 130  # SIGINT (Ctrl-C, `timeout -s INT`): the report of what ran is written first; 128+n for signal n


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse's own usage errors: exit 2 with the usage line
        self.print_usage(sys.stderr)
        print(f"dflash-parity: error: {message}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)


def _positive_int(name: str, most: int):
    from parity.front.options import argparse_type, int_at_least
    return argparse_type(int_at_least(1, "a positive integer", most), name)


def _positive_float(name: str):
    from parity.front.options import argparse_type, positive_seconds
    return argparse_type(positive_seconds, name)


def _margin_growth(text: str) -> float:
    """`--max-margin-growth`: a finite number > 0 (a fraction of the tolerance)."""
    try:
        v = float(text)
    except ValueError:
        v = float("nan")
    if not (v > 0 and v != float("inf")):
        raise argparse.ArgumentTypeError(f"--max-margin-growth must be a positive fraction of the tolerance, got {text!r}")
    return v


def default_device() -> str:
    from parity.front.session import default_device as device
    return device()


def build_parser() -> argparse.ArgumentParser:
    from strategies import PROFILES

    p = _Parser(prog="dflash-parity", description="Numerical parity of drafter block-attention lowerings "
                "against an fp32 oracle.")
    sub = p.add_subparsers(dest="verb", required=True, parser_class=_Parser)

    from parity.front.options import add_to_argparse

    def common(sp: argparse.ArgumentParser) -> None:
        add_to_argparse(sp, common=True)  # --plugin, --device, --tolerances, --hook-timeout, --allow-loose-bounds

    sp = sub.add_parser("list", help="lowerings, where each runs, whether it can run here and why not")
    common(sp)

    sp = sub.add_parser("check", help="draw cases for each lowering, judge them, shrink failures, write reports")
    common(sp)
    add_to_argparse(sp, common=False)  # parity.front.options: the options the pytest plugin has as --parity-...

    sp = sub.add_parser("merge", help="one report from the reports of a run's shards (check --shard I/S)",
                        description="Merge the reports of the S shards of one run (each written by "
                                    "`dflash-parity check --shard I/S`) into one report, as a serial run would "
                                    "have written it; `dflash-parity gate` reads the merged one. The shards must "
                                    "have been checked with the same settings, policy, plugins and commit.")
    sp.add_argument("reports", nargs="+", metavar="DIR", help="the shards' report directories (or parity.json files)")
    sp.add_argument("--report", required=True, metavar="OUT", help="the merged report's directory")
    sp.add_argument("--quiet", action="store_true", help="no table")

    sp = sub.add_parser("repro", help="replay one saved case file and print its verdict")
    common(sp)
    sp.add_argument("case_file", metavar="FILE.json")
    sp.add_argument("--lowering", action="append", default=[], metavar="NAME",
                    help="lowering to run (default: the one the failure file names; its plugin file, recorded "
                         "there, is loaded again when --plugin is not given)")
    sp.add_argument("--no-isolate", action="store_true",
                    help="run the lowering in this process (for a debugger; a crash ends the command)")
    sp.add_argument("--case-timeout", type=_positive_float("--case-timeout"), default=None, metavar="SECONDS",
                    help="isolated: seconds the case may take before its worker is killed (default: 120)")

    sp = sub.add_parser("bench", help="timing tables (CUDA graphs, median of replays), each row with its parity verdict")
    common(sp)
    from parity.bench import TABLES, parse_max_gib
    sp.add_argument("--table", choices=TABLES + ("all",), default="all", help="which table (default: all)")
    sp.add_argument("--quick", action="store_true", help="a tiny shape subset (CPU runs, smoke runs)")
    sp.add_argument("--out", default="bench-report", metavar="DIR",
                    help="writes bench.json, bench.md and <table>.png here (default: bench-report)")
    sp.add_argument("--replays", type=_positive_int("--replays", ranges.MAX_REPLAYS), default=None,
                    help="timed replays per measurement (default: 50 on cuda, 5 on a cpu)")
    sp.add_argument("--max-gib", type=parse_max_gib, default=100.0, metavar="GIB",
                    help="skip shapes whose inputs and oracle would need more memory (default: 100)")
    sp.add_argument("--time-cap", type=_positive_float("--time-cap"), default=None, metavar="SECONDS",
                    help="fewer replays for slow shapes: timed replays stop past this (default: 1 on cuda, 0.5 on a cpu)")
    sp.add_argument("--lowering", action="append", default=[], metavar="NAME",
                    help="also time this lowering in the hybrid table (repeatable; e.g. a plugin's)")
    sp.add_argument("--quiet", action="store_true", help="no progress lines")

    from parity.report.gate import RULES, rules_help
    sp = sub.add_parser("gate", help="compare a report with a baseline; fail on regressions",
                        description="Compare a new check report with a baseline and fail closed, naming the "
                                    "reason. Rules (each accepted only by --accept RULE):\n\n" + rules_help(),
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    sp.add_argument("new", metavar="NEW", help="new report directory (or its parity.json)")
    sp.add_argument("--baseline", required=True, metavar="OLD", help="baseline report directory or parity.json")
    sp.add_argument("--accept", action="append", default=[], metavar="RULE[,RULE...]",
                    help=f"accept what a rule would fail, written in gate.md (repeatable): {', '.join(RULES)}")
    sp.add_argument("--max-margin-growth", type=_margin_growth, default=None, metavar="X",
                    help="the gate's bound on worst-margin growth (default: the baseline report's recorded "
                         "[gate] max_margin_growth; never the policy under review)")
    sp.add_argument("--not-before", default=None, metavar="TIME",
                    help="fail when the new report's run started before TIME (ISO-8601, or @UNIX-SECONDS): a "
                         "stale report from an earlier run")
    sp.add_argument("--commit", default=None, metavar="SHA",
                    help="fail unless the new report's run was on this git commit (a prefix of 7+ hex digits)")
    sp.add_argument("--tolerances", default=None, help=argparse.SUPPRESS)  # refused: see cmd_gate
    sp.add_argument("--markdown", default=None, metavar="FILE", help="write the Markdown diff here (default: NEW/gate.md)")
    return p


def _option_value(tokens: Sequence[str], name: str) -> str | None:
    """The value of `name` as the command line gives it (`--name V` or `--name=V`; the last one wins), or None."""
    value = None
    for i, tok in enumerate(tokens):
        if tok == name and i + 1 < len(tokens):
            value = tokens[i + 1]
        elif tok.startswith(name + "="):
            value = tok.split("=", 1)[1]
    return value


def launch_prefork_early(argv: Sequence[str]) -> bool:
    """`check --jobs N` (N > 1) with `--jobs-start prefork`, the default: launch the prefork the children are
    forked from (`parity.exec.prefork.start_early`) before the command line is parsed, since parsing imports torch:
    its imports then overlap this process's instead of following them. A guess from the raw tokens; the run
    adopts it only where it needs one and the children's environment is the one it was launched with, and it is
    stopped at the end of `main` otherwise (a usage error, one lowering). True where it was launched."""
    tokens = list(argv)
    if "check" not in tokens or "-h" in tokens or "--help" in tokens:
        return False
    if (_option_value(tokens, "--jobs-start") or "prefork") != "prefork":
        return False
    try:
        jobs = int(_option_value(tokens, "--jobs") or "1")
    except ValueError:
        return False
    if jobs < 2:
        return False
    from parity.exec import pool, prefork

    return prefork.start_early(pool.child_env(jobs)) is not None


def main(argv: Sequence[str] | None = None) -> int:
    from parity.exec import bytecode, host_profile, prefork, shared_compiles

    tokens = sys.argv[1:] if argv is None else list(argv)
    bytecode.cache_bytecode(say=lambda line: print(line, file=sys.stderr, flush=True),
                            hint="check" in tokens and "--quiet" not in tokens)
    shared_compiles.share_compiles()  # before any process is started: they inherit it
    launch_prefork_early(tokens)
    try:
        with host_profile.profiled("check"):
            return _main(argv)
    finally:
        prefork.discard_early()


def _main(argv: Sequence[str] | None) -> int:
    from oracle.errors import InvalidInput

    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # --help (0) or a usage error (2, message already printed)
        return int(exit_.code or 0)
    from parity.exec import hooks

    try:
        with hooks.timeout_set(getattr(args, "hook_timeout", None)):
            return {"list": cmd_list, "check": cmd_check, "repro": cmd_repro, "gate": cmd_gate,
                    "bench": _cmd_bench, "merge": cmd_merge}[args.verb](args)
    except InvalidInput as err:
        print(f"dflash-parity: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    except ValueError as err:  # validated settings (profile, limits) raise ValueError with the option named
        print(f"dflash-parity: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        from parity.exec import interrupt
        print("dflash-parity: interrupted", file=sys.stderr)
        return interrupt.exit_code()


def _setup(args, probe: bool = False) -> tuple:
    """Load the plugins (first in a throwaway worker when `probe`: one that crashes, hangs or exits at
    import is refused before this process imports it), the device and the policy (list, repro, bench)."""
    import lowerings
    from parity.exec import hooks
    from parity.engine import policy as policy_mod

    if probe and args.plugins:
        from parity.exec.plugin_probe import probe_plugins
        probe_plugins(args.plugins)
    for path in args.plugins:
        hooks.load_plugin(path)
    device = args.device or default_device()
    pol = policy_mod.load(args.tolerances, allow_loose_bounds=getattr(args, "allow_loose_bounds", False))
    pol.check_lowerings(lowerings.names())
    return device, pol


def cmd_list(args) -> int:
    import lowerings
    from lowerings.protocol import lse_name

    from parity.exec import hooks

    device, _ = _setup(args)
    rows = [["lowering", "runs on", "LSE base", f"here ({device})"]]
    for lw in lowerings.all_lowerings():
        try:
            ok, why = hooks.call(lw, "available", device)
        except hooks.HookFailure as hf:
            ok, why = False, hf.message
        rows.append([lw.name, ",".join(lw.devices), lse_name(lw.lse_base), "yes" if ok else f"no: {why}"])
    from parity.report.files import format_table
    print(format_table(rows))
    return EXIT_OK


def progress_printer(quiet: bool, lines: bool = False, label: str | None = None):
    """Progress for one lowering's check: a line rewritten in place on a terminal, else (or with `lines`,
    as in a --jobs child sharing the terminal) a line every 5 s, and the first failure at once."""
    last = [0.0]
    tty = sys.stderr.isatty() and not lines
    first_failure = [True]

    def show(report, outcome) -> None:
        if quiet:
            return
        if outcome.status == "fail" and first_failure[0]:
            # Said at once: a run stopped during a long shrink still leaves what failed in its log.
            first_failure[0] = False
            print(("\n" if tty else "") + f"  {label or report.lowering}: first failure on {outcome.case.short()}: "
                  + "; ".join(outcome.failures)[:600] + " (shrinking...)", file=sys.stderr, flush=True)
        now = time.perf_counter()
        if outcome.status != "fail" and now - last[0] < (0.2 if tty else 5.0):
            return
        last[0] = now
        worst = f"worst margin {report.worst_margin:.2f}" if report.worst else ""
        line = (f"  {label or report.lowering}: {report.cases} cases, {report.unsupported} unsupported, "
                f"{sum(1 for _ in report.failures)} failed {worst}"
                + (" (shrinking a failure...)" if outcome.status == "fail" else ""))
        print(("\r" + line.ljust(100)) if tty else line, end="" if tty else "\n", file=sys.stderr, flush=True)

    return show


def cmd_check(args) -> int:
    """A `CheckSession` (parity.front.session) over the config of the command line, then the table, the time split
    and each failure on the terminal, and the gate when `--gate-baseline` is given."""
    from parity.exec import interrupt
    from parity.front.options import config_from_args
    from parity.front.session import CheckSession
    from parity.exec.shards import shard_label

    config = config_from_args(args)
    t0 = time.perf_counter()
    session = CheckSession(config, say=None if config.quiet else _say)
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
        code = _finish(config, data, Path(config.report), t0)
        res = session.gate()
    if res is not None:
        print(res.markdown)
        if not res.passed:
            code = max(code, EXIT_FAIL)
    return code


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def cmd_merge(args) -> int:
    """One report from the shards' reports (parity.report.merge); the table; the exit code of its verdict."""
    from parity.report import merge
    from parity.report import files as report_mod

    data = merge.merge_reports(args.reports, args.report)
    if not args.quiet:
        print(report_mod.format_table(report_mod.table_rows(data)))
        print(f"\nmerged {len(args.reports)} shard report(s) into {args.report}/ (parity.json, junit.xml, summary.md): "
              f"{data['verdict']}")
    return {"pass": EXIT_OK, "interrupted": EXIT_INTERRUPTED}.get(data["verdict"], EXIT_FAIL)


def _finish(config, data: dict, report_dir: Path, t0: float) -> int:
    """Print the table, the time split and each failure (from the report data); the exit code."""
    from oracle.case import Case
    from parity.report import files as report_mod

    print(report_mod.format_table(report_mod.table_rows(data)))
    if not config.quiet:
        for name, v in data["lowerings"].items():
            line = report_mod.phase_line(v)
            if line:
                print(f"  time {name}: {line}", file=sys.stderr)
            line = report_mod.oracle_line(v)
            if line:
                print(f"  oracle {name}: {line}", file=sys.stderr)
    for entry in data.get("tolerances_unmatched", []):  # a typo must not leave the default in place unseen
        print(report_mod.unmatched_line(data.get("tolerances") or "tolerances.toml", entry), file=sys.stderr)
    failed = [(n, v) for n, v in data["lowerings"].items() if v["status"] == "fail"]
    for name, v in failed:
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
    where = f"reports in {report_dir}/ (parity.json, junit.xml, summary.md)"
    print(f"\n{len(data['lowerings'])} lowering(s), {sum(v['cases'] for v in data['lowerings'].values())} cases in "
          f"{time.perf_counter() - t0:.1f} s; {where}")
    return _exit_code(config, data, failed)


def _exit_code(config, data: dict, failed: list) -> int:
    """The exit code of a check from its report data (its `verdict` when it has one: not a --jobs child's)."""
    from parity.exec import interrupt

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


def _recorded_plugins(path: Path, wrapper: dict) -> list[str]:
    """The plugin files a failure file records (`"plugins": [{"path", "sha256"}]`) that still exist; a
    missing one or one whose content changed since is said on stderr (the replay goes on with the file
    as it is now)."""
    from oracle.errors import InvalidInput
    from parity.report.files import file_sha256

    recs = wrapper.get("plugins") or []
    if not isinstance(recs, list) or not all(isinstance(r, dict) and isinstance(r.get("path"), str)
                                             and isinstance(r.get("sha256"), str) for r in recs):
        raise InvalidInput(f"{path}: plugins", 'an array of {"path": str, "sha256": str} objects')
    out = []
    for rec in recs:
        p = rec["path"]
        if not Path(p).is_file():
            print(f"dflash-parity: warning: {path} was saved with the plugin {p}, which is no longer there; "
                  f"pass --plugin FILE", file=sys.stderr)
            continue
        now = file_sha256(p)
        if now != rec["sha256"]:
            print(f"dflash-parity: warning: the plugin {p} changed since this failure was saved (sha256 "
                  f"{rec['sha256'][:12]} then, {now[:12]} now); replaying with it as it is now", file=sys.stderr)
        out.append(p)
    return out


def cmd_repro(args) -> int:
    """Replay a case file: isolated in a worker as `check` runs it (default), or in this process with
    `--no-isolate` (for a debugger). Exit 1 when it fails, 2 for bad input or a lowering that cannot run."""
    import lowerings
    from oracle.errors import InvalidInput
    from parity.exec.hooks import HookFailure
    from parity.front.intake import check_case_fits, read_case_file
    from parity.engine.runner import INVALID, RunOptions, executor_run_case, lowering_available, run_case

    path = Path(args.case_file)
    case, wrapper = read_case_file(path)  # kind, JSON types, nesting and sizes: before anything is loaded
    if args.no_isolate and args.case_timeout is not None:
        raise InvalidInput("--case-timeout", "applies to isolated runs only; drop it or drop --no-isolate")
    if not args.plugins:
        args.plugins = _recorded_plugins(path, wrapper)
    device, pol = _setup(args, probe=not args.no_isolate)
    check_case_fits(case, device, str(path))
    named = wrapper.get("lowering")
    history = _history_of(wrapper, path)
    names = args.lowering or ([named] if named else [])
    if not names:
        raise InvalidInput("--lowering", f"{path} names no lowering; pass --lowering NAME")
    lws = [lowerings.get(name) for name in names]
    opts = RunOptions(device=device)
    from parity.engine import yardstick

    yard = yardstick.get(yardstick.DEFAULT)
    executor = None
    if not args.no_isolate:
        from parity.exec.isolation import DEFAULT_CASE_TIMEOUT, IsolatedExecutor
        executor = IsolatedExecutor(plugins=args.plugins, tolerances=args.tolerances, opts=opts, yardstick=yardstick.DEFAULT,
                                    case_timeout=args.case_timeout or DEFAULT_CASE_TIMEOUT)
    run = run_case if executor is None else executor_run_case(executor)
    worst = EXIT_OK
    try:
        for lw in lws:
            name = lw.name
            try:
                ok, why = lowering_available(lw, device, executor)
                if not ok:
                    print(f"{name}: cannot run on {device}: {why}")
                    worst = max(worst, EXIT_USAGE)
                    continue
                if history:  # the failure depends on state earlier calls left: replayed with them
                    print(f"{name}: first the {len(history)} case(s) that ran before it (the failure depends on the "
                          f"state a previous call leaves), the latest {history[-1].short()}")
                    for h in history:
                        run(lw, h, pol, opts, yard)
                out = run(lw, case, pol, opts, yard)
                if out.status == INVALID:  # the oracle is not finite on this case: bad input, never a verdict
                    where, _, rule = out.reason.partition(": ")
                    raise InvalidInput(f"{path}: {where}", rule)
            except HookFailure as hf:
                print(f"{name} on {case.short()}")
                print(f"  FAIL: {hf.message}")
                worst = max(worst, EXIT_FAIL)
                continue
            print(f"{name} on {case.short()}")
            print(f"  {out.summary()}")
            if out.main:
                f = out.main.figures
                print(f"  max abs {f.get('out_max_abs', 0):.4g} = {f.get('out_ulp', 0):.2f} ulp, rel L2 {f.get('out_rel_l2', 0):.3g}, "
                      f"LSE err {f.get('lse_max_abs', float('nan')):.3g}, worst at {f.get('worst_out')}")
            if out.status == "fail":
                worst = max(worst, EXIT_FAIL)
    finally:
        if executor is not None:
            executor.close()
    return worst


def _history_of(wrapper: dict, path: Path) -> list:
    """The cases a failure file says must run first, oldest first (its classification found that the failure
    depends on the state a previous call leaves), or none. When the bit-for-bit probe saw the case's result
    change after one particular history case (`probe.after_history[j]`), that case runs last, so that the
    state the replayed case reads is the state that changed it (the latest history case may leave none)."""
    from oracle.case import Case

    c = wrapper.get("classification") or {}
    if not isinstance(c, dict) or not c.get("depends_on_history"):
        return []
    hist = c.get("history") or []
    if not isinstance(hist, list):
        raise InvalidInput(f"{path}: classification.history", "an array of cases")
    order = list(reversed(range(len(hist))))  # oldest first
    probe = c.get("probe") if isinstance(c.get("probe"), dict) else {}
    after = probe.get("after_history") or []
    changed = [j for j in order if j < len(after) and isinstance(after[j], str) and after[j]]
    if changed:  # the probe saw the result change after history case j: it runs last, right before the case
        order = [j for j in order if j != changed[-1]] + [changed[-1]]
    return [Case.from_json_dict(hist[i], source=f"{path}: classification.history[{i}]") for i in order]


def cmd_gate(args) -> int:
    """Exit 0 when the gate passes, 1 when it fails (gate.md says why), 2 for bad input."""
    from oracle.errors import InvalidInput
    from parity.report import gate as gate_mod
    from parity.report.provenance import parse_time
    from parity.report.files import atomic_write

    if args.tolerances is not None:
        raise InvalidInput("--tolerances", "the gate reads no policy file (the one under review must not set its "
                                           "own gate): it takes max_margin_growth from the baseline report; pass "
                                           "--max-margin-growth X to set it")
    accept = gate_mod.parse_accept(args.accept)
    not_before = parse_time(args.not_before, "--not-before") if args.not_before is not None else None
    if args.commit is not None and not (7 <= len(args.commit) <= 40 and all(c in "0123456789abcdefABCDEF" for c in args.commit)):
        raise InvalidInput("--commit", f"a git commit SHA (7 to 40 hex digits), got {args.commit!r}")
    md_path = Path(args.markdown) if args.markdown else gate_mod.report_path(args.new).parent / "gate.md"
    unfinished = [f"{what}: {why}" for what, path in (("--baseline", args.baseline), ("NEW", args.new))
                  for why in [gate_mod.unfinished(path)] if why]
    if unfinished:
        res = gate_mod.unfinished_result(unfinished)
    else:
        base = gate_mod.load_report(args.baseline, "--baseline")
        new = gate_mod.load_report(args.new, "NEW")
        res = gate_mod.gate(base, new, max_margin_growth=args.max_margin_growth, accept=accept,
                            not_before=not_before, commit=args.commit)
    atomic_write(md_path, res.markdown)
    print(res.markdown)
    return EXIT_OK if res.passed else EXIT_FAIL


def _cmd_bench(args) -> int:
    """Time the tables; exit 1 when a timed lowering fails parity (or raises), 0 otherwise."""
    import lowerings
    from oracle.errors import InvalidInput
    from parity.bench import TABLES
    from parity.bench.run import BenchOptions, run_bench

    device, pol = _setup(args)
    if device == "cuda":
        import torch
        if not torch.cuda.is_available():
            raise InvalidInput("--device", "'cuda' was asked for but torch sees no CUDA device here")
    tables = TABLES if args.table == "all" else (args.table,)
    for name in args.lowering:
        lowerings.get(name)  # unknown -> "--lowering: unknown lowering ..."
    if args.lowering and "hybrid" not in tables:
        raise InvalidInput("--lowering", f"adds a lowering to the hybrid table, which --table {args.table} leaves out")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise InvalidInput("--out", f"{out} exists and is not a directory")
    opts = BenchOptions(device=device, tables=tables, quick=args.quick, replays=args.replays, max_gib=args.max_gib,
                        time_cap=args.time_cap, out_dir=str(out), extra_lowerings=tuple(args.lowering),
                        quiet=args.quiet)
    result = run_bench(opts, pol)
    return EXIT_FAIL if result.failed else EXIT_OK


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
