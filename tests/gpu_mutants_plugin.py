"""A plugin file (`--plugin tests/gpu_mutants_plugin.py`) registering the GPU mutants of `tests/gpu_mutants.py`
under their names, for `dflash-parity check` on a GPU and for the stream sanitizer's replay (`parity.sanitizer`),
which finds a lowering by name in a fresh process."""

from lowerings import register
from tests.gpu_mutants import GPU_MUTANTS, ReturnsBeforeSideStream

for cls, _ in GPU_MUTANTS.values():
    register(cls(), replace=True)
register(ReturnsBeforeSideStream(), replace=True)
