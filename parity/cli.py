"""Deprecated name of `parity.front.cli` (moved by issue 48); kept for one release, then removed.

Importing it gives the module itself (`parity.front.cli`), so what is patched or read through either name is the same.
"""

import importlib
import sys
import warnings

_moved = importlib.import_module("parity.front.cli")

if __name__ == "__main__":  # `python -m parity.cli`, as before
    _moved.console()

if __name__ != "__main__":
    warnings.warn("parity.cli is deprecated: import parity.front.cli", DeprecationWarning, stacklevel=2)
    sys.modules[__name__] = _moved
