"""Draws that depend on the seed alone, not on which modules a process happened to import.

hypothesis (6.13x and later) mixes into its draws, one integer draw in twenty, constants it finds in
the source of every local module loaded at the time (`hypothesis.internal.conjecture.providers.
_get_local_constants`). So one derandomized profile drew different cases in a pytest worker (the test
modules loaded), in a `check --jobs` child, and in a serial `check` whose earlier lowering had
imported a kernel module: "each child draws the cases a serial run draws" held by luck. Inside
`seed_only_draws()` that pool is empty (hypothesis's global constants stay): a check draws the same
cases in any process. If this hypothesis has no such pool, the context does nothing.
"""

from __future__ import annotations

import contextlib
from typing import Iterator


@contextlib.contextmanager
def seed_only_draws() -> Iterator[None]:
    try:
        from hypothesis.internal.conjecture import providers

        get, cache = providers._get_local_constants, providers.CONSTANTS_CACHE
        none = providers.Constants(integers=providers.SortedSet(), floats=providers.SortedSet(key=providers.float_to_int),
                                   bytes=providers.SortedSet(), strings=providers.SortedSet())
    except (ImportError, AttributeError, TypeError):
        yield
        return
    providers._get_local_constants = lambda: none
    cache.cache.clear()  # tuples computed with the modules' constants
    try:
        yield
    finally:
        providers._get_local_constants = get
        cache.cache.clear()
