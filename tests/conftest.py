"""Fixtures shared by the test directories (requested by name; the one autouse fixture shares the cores)."""

from __future__ import annotations

import pytest
import torch

from lowerings import registry


@pytest.fixture(scope="session", autouse=True)
def torch_threads_share_the_cores():
    """Each pytest-xdist worker takes its share of the cores for torch's CPU threads
    (`parity.config.default_threads`): with torch's default every worker takes every core, and on a
    16-core GPU runner `-n 10` made CPU checks of this suite run for minutes (docs/gpu/2026-12-01-h200-session7.md)."""
    from parity.config import default_threads, xdist_worker_count

    before = torch.get_num_threads()
    torch.set_num_threads(default_threads(xdist_worker_count()))
    yield
    torch.set_num_threads(before)


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
