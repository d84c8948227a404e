"""Deprecated name of `parity.exec.hooks` (moved by issue 48); kept for one release, then removed.

Importing it gives the module itself (`parity.exec.hooks`), so what is patched or read through either name is the same.
"""

import importlib
import sys
import warnings

_moved = importlib.import_module("parity.exec.hooks")

if __name__ != "__main__":
    warnings.warn("parity.hooks is deprecated: import parity.exec.hooks", DeprecationWarning, stacklevel=2)
    sys.modules[__name__] = _moved
