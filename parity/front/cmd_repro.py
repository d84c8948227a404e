"""`dflash-parity repro FILE.json`: replay one saved case through the session `check` runs (its plugins, policy,
options and executor: isolated in a worker by default, in this process with `--no-isolate`) and print its verdict.
Exit 1 when it fails, 2 for bad input or a lowering that cannot run.

Public: `add_parser`, `cmd_repro`, `history_of`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from parity.front.exit_codes import EXIT_FAIL, EXIT_OK, EXIT_USAGE
from parity.front.options import argparse_type, positive_seconds


def add_parser(sub, common) -> None:
    sp = sub.add_parser("repro", help="replay one saved case file and print its verdict")
    common(sp)
    sp.add_argument("case_file", metavar="FILE.json")
    sp.add_argument("--lowering", action="append", default=[], metavar="NAME",
                    help="lowering to run (default: the one the failure file names; its plugin file, recorded "
                         "there, is loaded again when --plugin is not given)")
    sp.add_argument("--no-isolate", action="store_true",
                    help="run the lowering in this process (for a debugger; a crash ends the command)")
    sp.add_argument("--case-timeout", type=argparse_type(positive_seconds, "--case-timeout"), default=None,
                    metavar="SECONDS", help="isolated: seconds the case may take before its worker is killed "
                                            "(default: 120)")


def recorded_plugins(path: Path, wrapper: dict) -> list[str]:
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


def history_of(wrapper: dict, path: Path) -> list:
    """The cases a failure file says must run first, oldest first (its classification found that the failure
    depends on the state a previous call leaves), or none. When the bit-for-bit probe saw the case's result
    change after one particular history case (`probe.after_history[j]`), that case runs last, so that the
    state the replayed case reads is the state that changed it (the latest history case may leave none)."""
    from oracle.case import Case
    from oracle.errors import InvalidInput

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


def _session(args: argparse.Namespace):
    """The session of the replay: the `check` config of the verb's options, no report, quiet."""
    from parity.front.config import CheckConfig
    from parity.front.session import CheckSession

    config = CheckConfig(plugins=tuple(args.plugins), device=args.device, tolerances=args.tolerances,
                         allow_loose_bounds=getattr(args, "allow_loose_bounds", False),
                         hook_timeout=getattr(args, "hook_timeout", None),
                         isolate=not args.no_isolate, case_timeout=args.case_timeout, report=None, quiet=True)
    return CheckSession(config)


def _replay(session, lw, case, history: list, path: Path) -> int:
    """One lowering's replay of `case` (its `history` first); the exit code."""
    from oracle.errors import InvalidInput
    from parity.engine.runner import INVALID
    from parity.exec.hooks import HookFailure

    name = lw.name
    try:
        ok, why = session.available(lw)
        if not ok:
            print(f"{name}: cannot run on {session.device}: {why}")
            return EXIT_USAGE
        if history:  # the failure depends on state earlier calls left: replayed with them
            print(f"{name}: first the {len(history)} case(s) that ran before it (the failure depends on the "
                  f"state a previous call leaves), the latest {history[-1].short()}")
            for h in history:
                session.run_one(lw, h)
        out = session.run_one(lw, case)
        if out.status == INVALID:  # the oracle is not finite on this case: bad input, never a verdict
            where, _, rule = out.reason.partition(": ")
            raise InvalidInput(f"{path}: {where}", rule)
    except HookFailure as hf:
        print(f"{name} on {case.short()}")
        print(f"  FAIL: {hf.message}")
        return EXIT_FAIL
    print(f"{name} on {case.short()}")
    print(f"  {out.summary()}")
    if out.main:
        f = out.main.figures
        print(f"  max abs {f.get('out_max_abs', 0):.4g} = {f.get('out_ulp', 0):.2f} ulp, rel L2 "
              f"{f.get('out_rel_l2', 0):.3g}, LSE err {f.get('lse_max_abs', float('nan')):.3g}, worst at "
              f"{f.get('worst_out')}")
    return EXIT_FAIL if out.status == "fail" else EXIT_OK


def cmd_repro(args: argparse.Namespace) -> int:
    """Replay a case file (see the module docstring)."""
    import lowerings
    from oracle.errors import InvalidInput
    from parity.front.intake import check_case_fits, read_case_file

    path = Path(args.case_file)
    case, wrapper = read_case_file(path)  # kind, JSON types, nesting and sizes: before anything is loaded
    if args.no_isolate and args.case_timeout is not None:
        raise InvalidInput("--case-timeout", "applies to isolated runs only; drop it or drop --no-isolate")
    if not args.plugins:
        args.plugins = recorded_plugins(path, wrapper)
    session = _session(args)
    session.load()  # the plugins first probed in a throwaway worker when isolated
    check_case_fits(case, session.device, str(path))
    named = wrapper.get("lowering")
    history = history_of(wrapper, path)
    names = args.lowering or ([named] if named else [])
    if not names:
        raise InvalidInput("--lowering", f"{path} names no lowering; pass --lowering NAME")
    lws = [lowerings.get(name) for name in names]
    worst = EXIT_OK
    try:
        for lw in lws:
            worst = max(worst, _replay(session, lw, case, history, path))
    finally:
        session.close()
    return worst
