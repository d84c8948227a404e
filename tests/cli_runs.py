"""`dflash-parity` run in this process from the suite's tests: `run(argv) -> (exit code, stdout, stderr)`."""

from __future__ import annotations

import contextlib
import io

from parity.front import cli


def run(argv) -> tuple[int, str, str]:
    """`cli.main(argv)` in this process (each argument as `str`); its exit code and what it printed."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main([str(a) for a in argv])
    return code, out.getvalue(), err.getvalue()
