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
from pathlib import Path
from typing import Sequence

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2
EXIT_INTERRUPTED = 130  # SIGINT (Ctrl-C, `timeout -s INT`): the report of what ran is written first; 128+n for signal n


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse's own usage errors: exit 2 with the usage line
        self.print_usage(sys.stderr)
        print(f"dflash-parity: error: {message}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)


def _int_at_least(name: str, minimum: int, expected: str):
    """An argparse type: an integer >= `minimum`, else "NAME must be EXPECTED, got 'TEXT'"."""
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            v = None
        if v is None or v < minimum:
            raise argparse.ArgumentTypeError(f"{name} must be {expected}, got {text!r}")
        return v
    return parse


def _positive_int(name: str):
    return _int_at_least(name, 1, "a positive integer")


_nonneg_int = _int_at_least("--seed", 0, "an integer >= 0")


def _positive_float(name: str):
    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a positive number of seconds, got {text!r}") from None
        if not v > 0 or v == float("inf"):
            raise argparse.ArgumentTypeError(f"{name} must be a positive number of seconds, got {text!r}")
        return v
    return parse


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
    import torch
    return "cuda" if torch.cuda.is_available() else "cpu"


def build_parser() -> argparse.ArgumentParser:
    from strategies import PROFILES

    p = _Parser(prog="dflash-parity", description="Numerical parity of drafter block-attention lowerings "
                "against an fp32 oracle.")
    sub = p.add_subparsers(dest="verb", required=True, parser_class=_Parser)

    def common(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--plugin", action="append", default=[], metavar="FILE.py",
                        help="a Python file that registers lowerings (repeatable)")
        sp.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda if available, else cpu")
        sp.add_argument("--tolerances", default=None, metavar="TOML", help="tolerance policy (default: the packaged tolerances.toml)")
        sp.add_argument("--hook-timeout", type=_positive_float("--hook-timeout"), default=None, metavar="SECONDS",
                        help="seconds a lowering's available()/supports()/expected_calls() or a plugin's import may "
                             "take before it fails that lowering (default: $DFLASH_PARITY_HOOK_TIMEOUT or 60)")
        sp.add_argument("--allow-loose-bounds", action="store_true",
                        help="accept bounds past the policy's sanity ceilings (parity.policy.CEILINGS; recorded "
                             "in the report, refused by the gate unless it accepts loose-bounds)")

    sp = sub.add_parser("list", help="lowerings, where each runs, whether it can run here and why not")
    common(sp)

    sp = sub.add_parser("check", help="draw cases for each lowering, judge them, shrink failures, write reports")
    common(sp)
    sp.add_argument("--lowering", action="append", default=[], metavar="NAME", help="lowering to check (repeatable; default: all)")
    sp.add_argument("--max-examples", type=_positive_int("--max-examples"), default=None, help="cases per lowering (default: the profile's)")
    sp.add_argument("--seed", type=_nonneg_int, default=None, help="hypothesis seed (default: derandomized profiles fix it)")
    sp.add_argument("--profile", choices=sorted(PROFILES), default="ci", help="hypothesis profile (default: ci)")
    sp.add_argument("--report", default="parity-report", metavar="DIR", help="report directory (default: parity-report)")
    sp.add_argument("--database", default=None, metavar="DIR", help="hypothesis example database (default: none)")
    sp.add_argument("--no-hardening", action="store_true",
                    help="skip the untouched-input, determinism, canary and output-buffer checks (timing runs only)")
    sp.add_argument("--no-isolate", action="store_true",
                    help="run the lowerings in this process (faster start, for debugging; a crash ends the run)")
    sp.add_argument("--case-timeout", type=_positive_float("--case-timeout"), default=None, metavar="SECONDS",
                    help="isolated runs: seconds a case may take before its worker is killed and the case "
                         "fails as hung (default: 120)")
    sp.add_argument("--kernel-names-every", type=_int_at_least("--kernel-names-every", 0, "an integer >= 0"),
                    default=4, metavar="N",
                    help="on CUDA, profile one case in N (by seed) and check its kernel names against the "
                         "lowering's declaration (default 4; 0: never)")
    sp.add_argument("--jobs", type=_positive_int("--jobs"), default=1, metavar="N",
                    help="check up to N lowerings at once, each in its own process on the same device "
                         "(default 1; each draws the cases a serial run draws)")
    sp.add_argument("--warm-up", action="store_true",
                    help="load each lowering's JIT kernel modules before its first case, timed apart from "
                         "the cases (see parity.warmup)")
    sp.add_argument("--limit", action="append", default=[], metavar="FIELD=V[,V...]",
                    help="widen or narrow the drawn shapes of every lowering checked, over its own limits on the "
                         "device: dtypes, kv_dtypes, head_dims, max_context, max_batch, ... (repeatable; e.g. "
                         "--limit dtypes=bfloat16,float16 --limit head_dims=64,128; see strategies.Limits)")
    sp.add_argument("--shards", action="append", default=[], metavar="NAME=S",
                    help="with --jobs: check lowering NAME in S processes, each running every S-th of the "
                         "cases a serial run draws (for compile-bound lowerings; repeatable; see parity.shards)")
    sp.add_argument("--part", action="store_true", help=argparse.SUPPRESS)  # a --jobs child (parity.jobs)
    sp.add_argument("--shard", default=None, help=argparse.SUPPRESS)  # I/S: a --shards child (parity.shards)
    sp.add_argument("--allow-nothing-judged", action="store_true",
                    help="exit 0 even when no case was judged (every lowering unavailable here or every case "
                         "unsupported); without it that exits 1")
    sp.add_argument("--quiet", action="store_true", help="no progress lines")

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
    sp.add_argument("--replays", type=_positive_int("--replays"), default=None,
                    help="timed replays per measurement (default: 50 on cuda, 5 on a cpu)")
    sp.add_argument("--max-gib", type=parse_max_gib, default=100.0, metavar="GIB",
                    help="skip shapes whose inputs and oracle would need more memory (default: 100)")
    sp.add_argument("--time-cap", type=_positive_float("--time-cap"), default=None, metavar="SECONDS",
                    help="fewer replays for slow shapes: timed replays stop past this (default: 1 on cuda, 0.5 on a cpu)")
    sp.add_argument("--lowering", action="append", default=[], metavar="NAME",
                    help="also time this lowering in the hybrid table (repeatable; e.g. a plugin's)")
    sp.add_argument("--quiet", action="store_true", help="no progress lines")

    from parity.gate import RULES, rules_help
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


def main(argv: Sequence[str] | None = None) -> int:
    from oracle.errors import InvalidInput

    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # --help (0) or a usage error (2, message already printed)
        return int(exit_.code or 0)
    from parity import hooks

    try:
        with hooks.timeout_set(getattr(args, "hook_timeout", None)):
            return {"list": cmd_list, "check": cmd_check, "repro": cmd_repro, "gate": cmd_gate,
                    "bench": _cmd_bench}[args.verb](args)
    except InvalidInput as err:
        print(f"dflash-parity: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    except ValueError as err:  # validated settings (profile, limits) raise ValueError with the option named
        print(f"dflash-parity: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        from parity import interrupt
        print("dflash-parity: interrupted", file=sys.stderr)
        return interrupt.exit_code()


def _setup(args, probe: bool = False) -> tuple:
    """Load the plugins (first in a throwaway worker when `probe`: one that crashes, hangs or exits at
    import is refused before this process imports it), the device and the policy. `args.plugin_of`:
    lowering name -> the plugin file that registered it."""
    import lowerings
    from parity import hooks
    from parity import policy as policy_mod

    if probe and args.plugin:
        from parity.isolation import probe_plugins
        probe_plugins(args.plugin)
    args.plugin_of = {}
    for path in args.plugin:
        for name in hooks.load_plugin(path):
            args.plugin_of[name] = path
    device = args.device or default_device()
    pol = policy_mod.load(args.tolerances, allow_loose_bounds=getattr(args, "allow_loose_bounds", False))
    pol.check_lowerings(lowerings.names())
    return device, pol


def cmd_list(args) -> int:
    import lowerings

    from parity import hooks

    device, _ = _setup(args)
    rows = [["lowering", "runs on", "LSE base", f"here ({device})"]]
    for lw in lowerings.all_lowerings():
        try:
            ok, why = hooks.call(lw, "available", device)
        except hooks.HookFailure as hf:
            ok, why = False, hf.message
        rows.append([lw.name, ",".join(lw.devices), "2" if lw.lse_base == 2.0 else "e", "yes" if ok else f"no: {why}"])
    from parity.report import format_table
    print(format_table(rows))
    return EXIT_OK


def _progress(quiet: bool, lines: bool = False, label: str | None = None):
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


def _saved_failures(report_dir: Path, lowering: str, device: str):
    """The lowering's saved failure files, then the case a previous run left in flight (its worker, or the
    whole run, died on it). Each is checked as a case file a user gives is (`parity.intake`: its kind,
    JSON types, nesting, sizes and memory): a bad one raises InvalidInput naming the file and the field.
    A file saved for another lowering (whose name maps to the same file name) is not this one's."""
    from parity.intake import check_case_fits, read_case_file
    from parity.isolation import inflight_path
    from parity.report import lowering_stem

    stem = lowering_stem(lowering)
    files = sorted((report_dir / "failures").glob(f"{stem}-*.json"))
    inflight = inflight_path(report_dir / "inflight", lowering)
    if inflight.exists() or inflight.is_symlink():
        files.append(inflight)
    out = []
    for f in files:
        case, wrapper = read_case_file(f)
        if wrapper.get("lowering") != lowering or case in out:
            continue
        check_case_fits(case, device, str(f))
        out.append(case)
    return out


def _report_written(what: str, report_dir: Path, write, *args, **kwargs):
    """`write(*args, **kwargs)`; an OSError (a full disk, a directory made read-only under the run) becomes
    one message naming the report directory (exit 2). `parity.json` is written last, so none is left."""
    from oracle.errors import InvalidInput

    try:
        return write(*args, **kwargs)
    except OSError as err:
        raise InvalidInput(f"--report {report_dir}", f"could not write {what}: {err.strerror or err} "
                                                     f"({err.filename or 'a report file'}); no parity.json was "
                                                     f"written by this run") from None


def cmd_check(args) -> int:
    import contextlib

    from parity import interrupt, report_dir as report_dir_mod
    from parity.report import PARTIAL_NAME

    # The report directory is proven writable and free of links out of it, and locked against another
    # check, before anything else runs (a --jobs child runs under its parent's lock).
    with contextlib.ExitStack() as held:
        if not args.part:
            d = report_dir_mod.prepare(args.report)
            held.enter_context(report_dir_mod.locked(d))
            (d / PARTIAL_NAME).unlink(missing_ok=True)
        # A --jobs child always takes SIGINT (its parent's means "write your partial part"), even where the
        # parent was started with SIGINT ignored; a top-level check leaves an ignored SIGINT ignored.
        with interrupt.installed(force=args.part):
            try:
                return _check(args)
            except SystemExit as exc:  # plugin code exiting the process: never a clean (or any) verdict
                print(f"dflash-parity: error: plugin code raised SystemExit({exc.code!r}) outside any case; the run "
                      f"fails (no verdict written)", file=sys.stderr)
                return EXIT_FAIL


def _check(args) -> int:
    import lowerings
    from oracle.errors import InvalidInput
    from parity import report as report_mod
    from parity import hooks
    from parity.runner import LoweringReport, RunOptions, check_lowering, hook_failure_report
    from strategies import PROFILES, check_cases, profile_settings

    device, pol = _setup(args, probe=not args.no_isolate and not args.part)
    names = args.lowering or lowerings.names()
    selected = [lowerings.get(n) for n in names]
    settings = profile_settings(args.profile, max_examples=args.max_examples, seed=args.seed, database=args.database)
    report_dir = Path(args.report)
    if args.no_isolate and args.case_timeout is not None:
        raise InvalidInput("--case-timeout", "applies to isolated runs only; drop it or drop --no-isolate")
    if args.part and len(selected) != 1:
        raise InvalidInput("--part", f"writes one lowering's part; got {len(selected)} lowerings")
    from parity import shards as shards_mod

    from strategies import limit_overrides

    overrides = limit_overrides(args.limit)
    shard_counts = shards_mod.parse_shards(args.shards, [lw.name for lw in selected])
    if shard_counts and args.jobs < 2:
        raise InvalidInput("--shards", "runs a lowering's shards side by side: give --jobs N (N >= 2) too")
    shard = shards_mod.parse_shard(args.shard) if args.shard is not None else None
    if shard is not None and not args.part:
        raise InvalidInput("--shard", "is for a --jobs child (with --part); use --shards NAME=S")
    # Saved failures and cases in flight are read (and refused if bad) before the first case runs (under
    # --jobs, by the parent too: before any child starts).
    replays = {lw.name: _saved_failures(report_dir, lw.name, device)
               if shard is None or shard[0] == 0 else [] for lw in selected}
    t0 = time.perf_counter()
    from parity import provenance, rundir

    header = None
    if not args.part:  # the run's own report (a --jobs child writes a part; its parent marks the directory)
        run_id, started = provenance.new_run_id(), provenance.now()
        header = provenance.run_header(
            run_id=run_id, started=started, device=device, profile=args.profile, policy=pol,
            lowerings=[lw.name for lw in selected], plugins=args.plugin,
            settings=provenance.run_settings(args, device=device, settings=settings,
                                             lowerings=[lw.name for lw in selected]))
        rundir.begin(report_dir, run_id, started)
    if args.jobs > 1 and (len(selected) > 1 or shard_counts):
        from parity.jobs import run_jobs

        if not args.quiet:
            print(f"checking {len(selected)} lowerings on {device}, up to {args.jobs} at once ({args.profile} profile, "
                  f"{'in process' if args.no_isolate else 'isolated'} in each)", file=sys.stderr, flush=True)
        say = (lambda line: None) if args.quiet else (lambda line: print(line, file=sys.stderr, flush=True))
        data, interrupted = run_jobs(args, [lw.name for lw in selected], device, report_dir, args.jobs, pol.source, say,
                                     shards=shard_counts, header=header)
        report_mod.note_unmatched(data, pol.entry_names())
        _report_written("the report", report_dir, report_mod.write_merged, report_dir,
                        provenance.finish(data, interrupted=interrupted))
        if header is not None:
            rundir.end(report_dir, header["run_id"])
        return _finish(args, data, report_dir, t0)
    opts = RunOptions(device=device, check_inputs_untouched=not args.no_hardening,
                      check_determinism=not args.no_hardening, check_output_buffers=not args.no_hardening,
                      profile_every=args.kernel_names_every)
    yard = lowerings.get("sdpa")
    from parity.jobs import part_path
    from parity.report import lowering_stem

    # A shard writes its failure files and its case in flight to a directory of its own.
    work_dir = report_dir if shard is None else shards_mod.shard_dir(report_dir, lowering_stem(selected[0].name), shard)
    replay_args = report_mod.replay_args(device, args.tolerances)
    plugins = {lw.name: report_mod.plugin_records([args.plugin_of[lw.name]])
               for lw in selected if lw.name in args.plugin_of}
    executor = None
    if not args.no_isolate:
        from parity.isolation import DEFAULT_CASE_TIMEOUT, IsolatedExecutor
        executor = IsolatedExecutor(plugins=args.plugin, tolerances=args.tolerances, opts=opts, yardstick="sdpa",
                                    case_timeout=args.case_timeout or DEFAULT_CASE_TIMEOUT,
                                    inflight_dir=work_dir / "inflight")
    where = "in process" if executor is None else f"isolated, case timeout {executor.case_timeout:g} s"
    sanitizer = None
    if device == "cuda":  # a nondeterministic failure is replayed under torch.cuda._sanitizer (parity.sanitizer)
        from parity import sanitizer as san
        sanitizer = lambda name, case, hist: san.replay(name, case, hist, plugins=args.plugin)  # noqa: E731
    results = []
    try:
        for n, lw in enumerate(selected, 1):
            if not args.quiet:
                print(f"[{n}/{len(selected)}] {shards_mod.shard_label(lw.name, shard)} on {device} ({args.profile} profile, {where})",
                      file=sys.stderr, flush=True)
            rep = None
            try:  # the lowering's hooks before its cases; one that raises, exits or hangs fails it alone
                plan = check_cases(lw, device, profile=args.profile, overrides=overrides)  # case_limits, supports
                if args.warm_up:
                    _warm_up(lw, device, args.quiet, plan.limits)
            except hooks.HookFailure as hf:
                rep = hook_failure_report(LoweringReport(lw.name, device, "pass"), hf, time.perf_counter())
            except KeyboardInterrupt:  # stopped while compiling: said so in the report, not lost
                results.append(LoweringReport(lw.name, device, "fail", interrupted=True, extra=[
                    "interrupted before its first case, during the JIT warm-up (a partial run, not a verdict)"]))
                print(f"dflash-parity: interrupted during {lw.name}'s warm-up; writing the partial report",
                      file=sys.stderr)
                break
            if rep is None:
                rep = check_lowering(lw, pol, strategy=plan.strategy, boundaries=plan.boundaries, settings=settings,
                                     opts=opts, yardstick=yard, replay=replays[lw.name],
                                     progress=_progress(args.quiet, lines=args.part,
                                                        label=shards_mod.shard_label(lw.name, shard)),
                                     target=PROFILES[args.profile].target, seed=args.seed, executor=executor,
                                     shard=shard, flaky_runs=PROFILES[args.profile].flaky_runs, sanitizer=sanitizer)
            if not args.quiet and sys.stderr.isatty() and not args.part:
                print(file=sys.stderr)
            results.append(rep)
            if len(selected) > 1 and not args.part:  # on disk before the next lowering (a crash loses none)
                try:
                    report_mod.write_progress(work_dir, results, device=device, profile=args.profile,
                                              tolerances=pol.source, replay=replay_args, plugins=plugins)
                except OSError as err:
                    print(f"dflash-parity: warning: could not write the progress report: {err}", file=sys.stderr)
            if rep.interrupted:  # SIGINT: report what ran, check nothing more
                print(f"dflash-parity: interrupted during {lw.name}; writing the partial report", file=sys.stderr)
                break
    finally:
        if executor is not None:
            executor.close()
    if executor is not None and not args.quiet:
        print(f"{'  ' + shards_mod.shard_label(selected[0].name, shard) + ': ' if args.part else ''}isolated: {executor.workers_started} worker(s) "
              f"started, {executor.crashes} case(s) crashed or hung one, {executor.worker_cpu_seconds:.1f} s of "
              f"worker CPU", file=sys.stderr)
    part = part_path(report_dir, selected[0].name, shard) if args.part else None
    amend = None
    if shard is not None:
        fams = results[0].compile_families if results else {}
        amend = lambda entry: shards_mod.shard_part_entry(entry, work_dir, fams)  # noqa: E731
    # stale failure files of the re-checked lowerings go (write_failure_files); this run writes its own
    data = _report_written("the report", report_dir, report_mod.write_reports, work_dir, results, device=device,
                           profile=args.profile, tolerances=pol.source, part=part, amend_part=amend,
                           replay=replay_args, plugins=plugins, header=header,
                           policy_entries=pol.entry_names())
    if header is not None:
        rundir.end(report_dir, header["run_id"])
    code = _finish(args, data, report_dir, t0)
    return EXIT_INTERRUPTED if args.part and any(r.interrupted for r in results) else code


def _warm_up(lw, device: str, quiet: bool, limits=None) -> None:
    """`--warm-up`: load the lowering's JIT modules now (on the GPU: in this process, so that an isolated
    worker finds them compiled in the on-disk cache and only loads them)."""
    from parity.warmup import warm_up

    say = (lambda line: None) if quiet else (lambda line: print(f"  {line}", file=sys.stderr, flush=True))
    rep = warm_up([lw], limits, device, progress=say)
    if not quiet:
        say(rep.lines()[-1])


def _finish(args, data: dict, report_dir: Path, t0: float) -> int:
    """Print the table, the time split and each failure (from the report data); the exit code."""
    from oracle.case import Case
    from parity import report as report_mod

    print(report_mod.format_table(report_mod.table_rows(data)))
    if not args.quiet and not args.part:  # a --jobs child's time line is printed by its parent
        for name, v in data["lowerings"].items():
            line = report_mod.phase_line(v)
            if line:
                print(f"  time {name}: {line}", file=sys.stderr)
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
    where = f"part {report_dir / 'parts'}" if args.part else f"reports in {report_dir}/ (parity.json, junit.xml, summary.md)"
    print(f"\n{len(data['lowerings'])} lowering(s), {sum(v['cases'] for v in data['lowerings'].values())} cases in "
          f"{time.perf_counter() - t0:.1f} s; {where}")
    return _exit_code(args, data, failed)


def _exit_code(args, data: dict, failed: list) -> int:
    """The exit code of a check from its report data (its `verdict` when it has one: not a --jobs child's)."""
    from parity import interrupt

    verdict = data.get("verdict")
    if verdict == "interrupted":
        return interrupt.exit_code()
    if verdict == "nothing judged":
        why = "; ".join(f"{n}: {v.get('reason') or 'every case unsupported'}" for n, v in data["lowerings"].items())
        print(f"\nnothing was judged: no lowering ran a case here ({why[:600]})"
              + ("; accepted (--allow-nothing-judged)" if args.allow_nothing_judged else
                 "; exit 1 (pass --allow-nothing-judged when that is expected)"), file=sys.stderr)
        return EXIT_OK if args.allow_nothing_judged else EXIT_FAIL
    return EXIT_FAIL if failed else EXIT_OK


def _recorded_plugins(path: Path, wrapper: dict) -> list[str]:
    """The plugin files a failure file records (`"plugins": [{"path", "sha256"}]`) that still exist; a
    missing one or one whose content changed since is said on stderr (the replay goes on with the file
    as it is now)."""
    from oracle.errors import InvalidInput
    from parity.report import file_sha256

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
    from parity.hooks import HookFailure
    from parity.intake import check_case_fits, read_case_file
    from parity.runner import INVALID, RunOptions, executor_run_case, lowering_available, run_case

    path = Path(args.case_file)
    case, wrapper = read_case_file(path)  # kind, JSON types, nesting and sizes: before anything is loaded
    if args.no_isolate and args.case_timeout is not None:
        raise InvalidInput("--case-timeout", "applies to isolated runs only; drop it or drop --no-isolate")
    if not args.plugin:
        args.plugin = _recorded_plugins(path, wrapper)
    device, pol = _setup(args, probe=not args.no_isolate)
    check_case_fits(case, device, str(path))
    named = wrapper.get("lowering")
    history = _history_of(wrapper, path)
    names = args.lowering or ([named] if named else [])
    if not names:
        raise InvalidInput("--lowering", f"{path} names no lowering; pass --lowering NAME")
    lws = [lowerings.get(name) for name in names]
    opts = RunOptions(device=device)
    yard = lowerings.get("sdpa")
    executor = None
    if not args.no_isolate:
        from parity.isolation import DEFAULT_CASE_TIMEOUT, IsolatedExecutor
        executor = IsolatedExecutor(plugins=args.plugin, tolerances=args.tolerances, opts=opts, yardstick="sdpa",
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
    depends on the state a previous call leaves), or none."""
    from oracle.case import Case

    c = wrapper.get("classification") or {}
    if not isinstance(c, dict) or not c.get("depends_on_history"):
        return []
    hist = c.get("history") or []
    if not isinstance(hist, list):
        raise InvalidInput(f"{path}: classification.history", "an array of cases")
    return [Case.from_json_dict(h, source=f"{path}: classification.history[{i}]")
            for i, h in reversed(list(enumerate(hist)))]


def cmd_gate(args) -> int:
    """Exit 0 when the gate passes, 1 when it fails (gate.md says why), 2 for bad input."""
    from oracle.errors import InvalidInput
    from parity import gate as gate_mod
    from parity.provenance import parse_time
    from parity.report import atomic_write

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


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
