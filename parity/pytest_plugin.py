"""Deprecated name of `parity.front.pytest_plugin` (moved by issue 48); kept for one release, then removed.

Importing it gives the module itself (`parity.front.pytest_plugin`), so what is patched or read through either name is the same.
"""

import importlib
import sys
import warnings

_moved = importlib.import_module("parity.front.pytest_plugin")

if __name__ != "__main__":
    warnings.warn("parity.pytest_plugin is deprecated: import parity.front.pytest_plugin", DeprecationWarning, stacklevel=2)
    sys.modules[__name__] = _moved
