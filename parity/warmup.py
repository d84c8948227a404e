"""Deprecated name of `parity.exec.warmup` (moved by issue 48); kept for one release, then removed.

Importing it gives the module itself (`parity.exec.warmup`), so what is patched or read through either name is the same.
"""

import importlib
import sys
import warnings

_moved = importlib.import_module("parity.exec.warmup")

if __name__ == "__main__":  # `python -m parity.warmup`, as before
    sys.exit(_moved.main())

if __name__ != "__main__":
    warnings.warn("parity.warmup is deprecated: import parity.exec.warmup", DeprecationWarning, stacklevel=2)
    sys.modules[__name__] = _moved
