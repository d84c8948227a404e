"""What a check says on the terminal while it runs: progress lines on stderr.

Public: `progress_printer`, `say`, `start_up_line`.
"""

from __future__ import annotations

import sys
import time


def say(line: str) -> None:
    """One line on stderr, at once."""
    print(line, file=sys.stderr, flush=True)


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


def start_up_line(label: str, created: float, marks: list[tuple[str, float]]) -> str:
    """`"  NAME: its cases start 3.1 s after this process began: session 0.4 s, load 0.0 s, planning 1.2 s, ..."`:
    where a `--jobs` child's time went before its first case; `marks` are (the phase that starts, when), the last
    one unnamed (the cases)."""
    parts = [("session", marks[0][1] - created)] + [(n, t1 - t0) for (n, t0), (_, t1) in zip(marks, marks[1:])]
    return (f"  {label}: its cases start {marks[-1][1] - created:.1f} s after this process began: "
            + ", ".join(f"{n} {s:.1f} s" for n, s in parts))
