"""`dflash-parity gate NEW --baseline OLD`: compare a report with a baseline and fail closed, naming the reason.
Exit 0 when the gate passes, 1 when it fails (gate.md says why), 2 for bad input. It starts no process and imports
no torch.

Public: `add_parser`, `cmd_gate`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from parity.front.exit_codes import EXIT_FAIL, EXIT_OK


def _margin_growth(text: str) -> float:
    """`--max-margin-growth`: a finite number > 0 (a fraction of the tolerance)."""
    try:
        v = float(text)
    except ValueError:
        v = float("nan")
    if not (v > 0 and v != float("inf")):
        raise argparse.ArgumentTypeError(f"--max-margin-growth must be a positive fraction of the tolerance, got {text!r}")
    return v


def add_parser(sub) -> None:
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


def cmd_gate(args: argparse.Namespace) -> int:
    """Exit 0 when the gate passes, 1 when it fails (gate.md says why), 2 for bad input."""
    from oracle.errors import InvalidInput
    from parity.report import gate as gate_mod
    from parity.report.files import atomic_write
    from parity.report.provenance import parse_time

    if args.tolerances is not None:
        raise InvalidInput("--tolerances", "the gate reads no policy file (the one under review must not set its "
                                           "own gate): it takes max_margin_growth from the baseline report; pass "
                                           "--max-margin-growth X to set it")
    accept = gate_mod.parse_accept(args.accept)
    not_before = parse_time(args.not_before, "--not-before") if args.not_before is not None else None
    if args.commit is not None and not (7 <= len(args.commit) <= 40
                                        and all(c in "0123456789abcdefABCDEF" for c in args.commit)):
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
