"""Compatibility alias: the flashinfer adapters moved to the package `lowerings.flashinfer` (one module per
concern). Import from there; this module re-exports its public names for plugins written against the old
path (`from lowerings import flashinfer_paged as fp; fp.FlashinferContext("fa2")`)."""

from lowerings.flashinfer import *  # noqa: F401,F403
from lowerings.flashinfer import __all__  # noqa: F401
