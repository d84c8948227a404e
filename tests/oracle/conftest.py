"""Oracle tests: tiny tensors, so run torch single-threaded.

On a small shared CPU the intra-op thread pool costs far more than it saves on tensors this size
(measured: the directory took ~52 s with 2 threads next to another busy process, ~14 s with 1).
The previous thread count is restored after each test, so other test directories are unaffected.
"""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _single_threaded_torch(single_threaded_torch):  # tests/conftest.py
    yield
