"""Fixtures shared by the test directories (requested by name; none is autouse here)."""

from __future__ import annotations

import pytest
import torch

from lowerings import registry


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
