"""A plugin file (`--plugin tests/gpu_mutants_plugin.py`) that registers the GPU mutants; isolated workers
load it to find them by name (the 32-bit-offset mutant faults on a GPU: it only ever runs isolated)."""

from tests.gpu_mutants import register_all

register_all()
