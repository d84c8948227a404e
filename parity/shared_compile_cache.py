"""Deprecated name of `parity.exec.shared_compile_cache` (moved by issue 48); kept for one release, then removed.

Importing it gives the module itself (`parity.exec.shared_compile_cache`), so what is patched or read through either name is the same.
"""

import importlib
import sys
import warnings

_moved = importlib.import_module("parity.exec.shared_compile_cache")

if __name__ != "__main__":
    warnings.warn("parity.shared_compile_cache is deprecated: import parity.exec.shared_compile_cache", DeprecationWarning, stacklevel=2)
    sys.modules[__name__] = _moved
