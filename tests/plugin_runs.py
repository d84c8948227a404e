"""Running the pytest plugin as another repository would, from the suite's own tests (pytester).

Installed (`pip install -e .`, as CI and a GPU runner following the README do), pytest loads the plugin
through the `pytest11` entry point. A checkout used without installing it (a GPU machine with the
sources on PYTHONPATH) has no entry point: the plugin is then named with `-p parity.front.pytest_plugin`,
which loads the same module. A run whose summary line is missing fails with what it printed.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os


def entry_point_installed() -> bool:
    """Whether pytest finds `parity.front.pytest_plugin` through an installed `pytest11` entry point."""
    try:
        return any(ep.value == "parity.front.pytest_plugin" for ep in importlib.metadata.entry_points(group="pytest11"))
    except Exception:  # pragma: no cover
        return False


def plugin_args() -> tuple[str, ...]:
    """Arguments that load the plugin in a pytester run: none when the entry point does."""
    return () if entry_point_installed() else ("-p", "parity.front.pytest_plugin")


# What makes a process an xdist worker. A pytester subprocess started from a worker inherits them, and is a
# session of its own, not a worker: with them, pytest-benchmark (on the H200's image) warned "xdist plugin
# is active" at configure and `-W error` ended the inner session (docs/gpu/2026-12-02-h200-session8.md).
# PYTEST_XDIST_WORKER_COUNT stays: the inner session still shares the cores with the other workers.
XDIST_WORKER_VARS = ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_TESTRUNUID")


@contextlib.contextmanager
def not_an_xdist_worker():
    """This process's environment without `XDIST_WORKER_VARS` inside the block, restored after it."""
    saved = {k: os.environ.pop(k) for k in XDIST_WORKER_VARS if k in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


def run_subprocess(pytester, *args: str):
    """`pytester.runpytest_subprocess(*args)` as a standalone pytest session (not an xdist worker)."""
    with not_an_xdist_worker():
        return pytester.runpytest_subprocess(*args)


def runpytest(pytester, *args: str):
    """`run_subprocess(pytester, *args)` with the plugin loaded as an installed user has it."""
    return run_subprocess(pytester, *plugin_args(), *args)


def assert_outcomes(res, **outcomes: int) -> None:
    """`res.assert_outcomes(**outcomes)`; on a mismatch or a missing summary, fail with the run's output."""
    try:
        res.assert_outcomes(**outcomes)
    except (AssertionError, ValueError) as err:
        raise AssertionError(f"{err}\n--- stdout (tail) ---\n{res.stdout.str()[-4000:]}\n"
                             f"--- stderr (tail) ---\n{res.stderr.str()[-4000:]}") from None
