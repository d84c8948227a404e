"""A dead CUDA context, named in the report of every test that fails after it (a part of the pytest plugin).

A kernel's device-side assert or illegal address leaves the process's CUDA context unusable: every later CUDA
call in that process raises the same error, wherever it is. In a pytest-xdist worker the tests that run after
it then fail at unrelated lines (one mutant's fault failed 31 later tests of its worker,
docs/gpu/2026-12-02-h200-session8.md), and the one real failure hides among them. `CudaContextWatch` probes
the context before and after each test (a `torch.cuda.synchronize()`, only once this process has initialized
CUDA: it never initializes it) and adds a section to each failed test's report: the test during which the
context died, and the error. Registered by the plugin in a session that uses it (`parity.front.pytest_plugin._use`).
"""

from __future__ import annotations

import sys
from typing import Any

import pytest

from parity.exec.hooks import first_line

SECTION = "dflash-parity: CUDA context"


def context_error() -> str | None:
    """The error the CUDA context of this process raises on a synchronize, or None: alive, or CUDA not
    initialized here (torch not imported, or no CUDA call made yet). Never initializes CUDA."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return None
    try:
        torch.cuda.synchronize()
    except Exception as err:  # noqa: BLE001 - any error of the probe is the finding
        return first_line(err)
    return None


def died_here(error: str) -> str:
    return (f"the CUDA context of this process died during this test ({error}). Every later CUDA call in this "
            f"process fails the same way: later failures in it may be this one, not theirs.")


def died_before(where: str, error: str) -> str:
    return (f"the CUDA context of this process was already dead when this test started: it died {where} "
            f"({error}). This failure may be that one, not this test's own: run this test alone (or in a "
            f"fresh process) for its own verdict.")


class CudaContextWatch:
    """Finds the test during which this process's CUDA context died; names it in every later failure."""

    def __init__(self, probe=context_error) -> None:
        self.probe = probe
        self.died: str | None = None  # where the context died: "during <nodeid>", "after <nodeid>", ...
        self.died_in: str | None = None  # the test during which it died, when it died during one
        self.error = ""
        self.last: str | None = None  # the last test that ended on a live context
        self.dead_before: set[str] = set()  # tests that started on a dead context

    def _check(self, where: str, nodeid: str | None = None) -> None:
        if self.died is None:
            err = self.probe()
            if err is not None:
                self.died, self.died_in, self.error = where, nodeid, err

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:  # before the test's fixtures
        if self.died is not None and self.probe() is None:
            # A dead context never comes back: what the probe saw was not one (a test's stand-in for
            # torch.cuda, say). Forget it rather than blame later failures on it.
            self.died = self.died_in = None
        self._check(f"after {self.last}" if self.last else "before the first test of this process")
        if self.died is not None:
            self.dead_before.add(item.nodeid)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: Any):
        outcome = yield
        if item.nodeid not in self.dead_before:
            self._check(f"during {item.nodeid}", item.nodeid)
            if call.when == "teardown" and self.died is None:
                self.last = item.nodeid
        rep = outcome.get_result()
        if not rep.failed or self.died is None or any(name == SECTION for name, _ in rep.sections):
            return
        if item.nodeid in self.dead_before:
            rep.sections.append((SECTION, died_before(self.died, self.error)))
        elif self.died_in == item.nodeid:
            rep.sections.append((SECTION, died_here(self.error)))
