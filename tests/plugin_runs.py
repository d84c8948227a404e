"""Running the pytest plugin as another repository would, from the suite's own tests (pytester).

Installed (`pip install -e .`, as CI and a GPU runner following the README do), pytest loads the plugin
through the `pytest11` entry point. A checkout used without installing it (a GPU machine with the
sources on PYTHONPATH) has no entry point: the plugin is then named with `-p parity.pytest_plugin`,
which loads the same module. A run whose summary line is missing fails with what it printed.
"""

from __future__ import annotations

import importlib.metadata


def entry_point_installed() -> bool:
    """Whether pytest finds `parity.pytest_plugin` through an installed `pytest11` entry point."""
    try:
        return any(ep.value == "parity.pytest_plugin" for ep in importlib.metadata.entry_points(group="pytest11"))
    except Exception:  # pragma: no cover
        return False


def plugin_args() -> tuple[str, ...]:
    """Arguments that load the plugin in a pytester run: none when the entry point does."""
    return () if entry_point_installed() else ("-p", "parity.pytest_plugin")


def runpytest(pytester, *args: str):
    """`pytester.runpytest_subprocess(*args)` with the plugin loaded as an installed user has it."""
    return pytester.runpytest_subprocess(*plugin_args(), *args)


def assert_outcomes(res, **outcomes: int) -> None:
    """`res.assert_outcomes(**outcomes)`; on a mismatch or a missing summary, fail with the run's output."""
    try:
        res.assert_outcomes(**outcomes)
    except (AssertionError, ValueError) as err:
        raise AssertionError(f"{err}\n--- stdout (tail) ---\n{res.stdout.str()[-4000:]}\n"
                             f"--- stderr (tail) ---\n{res.stderr.str()[-4000:]}") from None
