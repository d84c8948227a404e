"""One compile of each Triton kernel across the processes of a run.

`share_compiles` here; the cache itself: `parity.exec.shared_compile_cache`.

Triton keeps what it compiled in a file cache (`TRITON_CACHE_DIR`, `~/.triton/cache` by default): a kernel
variant (its source, types, specializations and constexprs) compiled by one process is loaded by the next.
But processes that start together on a cold cache all miss the same variants at once, and each compiles
them: the 16 processes of `check --jobs 16` each compiled the oracle's and the case builder's variants, most of
the lowerings' time lines on a host whose cores were all taken (docs/gpu/2026-12-03-h200-session21.md).

`SharedCompileCache` is Triton's own file cache with one addition: the first process to miss an entry
compiles it and the others wait for it, then load it. A miss takes an exclusive `flock` on the entry's
folder (`<cache>/<key>/parity.lock`) and looks again; the lock is held until that entry is stored
(`put_group` for a kernel, `put` of the same file for a launcher module) or the manager is dropped (a
compile that raised). A process that dies holding it releases it (the kernel drops a dead process's
locks). A waiter gives up after `WAIT_S` and compiles itself, as Triton would have; a process never waits
for a lock it holds itself. Nothing else changes: the same keys, files and folder as Triton's
`FileCacheManager`, so a cache filled with it serves plain Triton and the other way round.

`share_compiles()` (this module; it imports no triton, so `check` can call it first) selects it for this
process and those it starts (`TRITON_CACHE_MANAGER`, which Triton reads at each compile), unless the user
chose a cache manager. `check`, `parity.exec.warmup` and the pytest plugin call it. Under Triton's interpreter
nothing is compiled and it is never used. With it every entry of a cold run is compiled once.
"""

from __future__ import annotations

import os
from typing import MutableMapping

ENV = "TRITON_CACHE_MANAGER"
SPEC = "parity.exec.shared_compile_cache:SharedCompileCache"


def share_compiles(environ: MutableMapping[str, str] | None = None) -> bool:
    """Select `SharedCompileCache` in `environ` (this process's environment by default, which the processes it
    starts inherit) unless `TRITON_CACHE_MANAGER` is set already. True where it is selected now or was."""
    env = os.environ if environ is None else environ
    if env.get(ENV, SPEC) != SPEC:
        return False
    env[ENV] = SPEC
    return True
