"""A plugin file (`--plugin tests/gpu_mutants_plugin.py`) registering the GPU mutants of `tests/gpu_mutants.py`
under their names, for `dflash-parity check` on a GPU, for isolated workers (the 32-bit-offset mutant faults
on a GPU: it only ever runs isolated) and for the stream sanitizer's replay (`parity.exec.sanitizer`), which finds
a lowering by name in a fresh process."""

from tests.gpu_mutants import register_all

register_all()
