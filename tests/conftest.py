"""Fixtures shared by the test directories (requested by name; the autouse fixtures share the cores and give the
checks the tests start a default SIGINT)."""

from __future__ import annotations

import signal

import pytest
import torch

from lowerings import registry


@pytest.fixture(scope="session", autouse=True)
def torch_threads_share_the_cores():
    """Each pytest-xdist worker takes its share of the cores for torch's CPU threads
    (`parity.front.config.default_threads`): with torch's default every worker takes every core, and on a
    16-core GPU runner `-n 10` made CPU checks of this suite run for minutes (docs/gpu/2026-12-01-h200-session7.md)."""
    from parity.front.config import default_threads, xdist_worker_count

    before = torch.get_num_threads()
    torch.set_num_threads(default_threads(xdist_worker_count()))
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session", autouse=True)
def sigint_as_a_terminal_gives_it():
    """The suite run as a background job of a script (SIGINT ignored, inherited by every check a test starts)
    made each check say so first on stderr, and 26 tests that read its first line failed (a fresh clone's suite
    started with `... &`). The tests of that note set the disposition themselves; the others get Python's
    default, as from a terminal or a CI step."""
    before = signal.getsignal(signal.SIGINT)
    if before == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    if before == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.fixture
def restore_registry():
    """The lowering registry as it was before the test (plugins a test loads are dropped after it)."""
    with registry.restored():
        yield


@pytest.fixture
def single_threaded_torch():
    """One intra-op thread for tiny CPU tensors (the pool costs more than it saves); restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
