"""Run 59's diagnostic (session 17): which case made `hybrid_paged[splits=4]` compile a third variant in one
shape family in run 58, and what differed (Triton's cache key of each new variant).

    python docs/gpu/runs/59-compile-keys.py [check arguments...]

Runs `check` in this process with the given arguments; every time a Triton variant of the hybrid kernels is
compiled, prints the case being judged, its compile family and the new cache keys (specialization and options)."""

import os
import sys

sys.path.insert(0, os.getcwd())

import lowerings  # noqa: E402
from lowerings import counters  # noqa: E402
from lowerings import _hybrid_kernel as hk  # noqa: E402
from parity import case_run, cli  # noqa: E402

current: dict = {}


def around(fn, case, opts):
    current["case"] = case
    return fn()


def keys() -> set:
    out = set()
    for k in hk.KERNELS:
        name = getattr(getattr(k, "fn", k), "__name__", repr(k))
        for entry in getattr(k, "device_caches", {}).values():
            cache = entry[0] if isinstance(entry, tuple) else entry
            out.update((name, str(key)) for key in cache)
    return out


seen = keys()
real = counters.record_compile
low = lowerings.get(sys.argv[sys.argv.index("--lowering") + 1])


def record(name: str) -> None:
    global seen
    now = keys()
    new, seen = now - seen, now
    c = current.get("case")
    for kname, key in sorted(new):
        fam = case_run.compile_family(low, c) if c is not None else None
        print(f"COMPILE {kname} family={fam}\n  case {c.short()[:160] if c is not None else '-'}\n"
              f"  layout={getattr(c, 'layout', '-')} storage={getattr(c, 'block_storage', '-')} "
              f"pad={getattr(c, 'page_table_pad', '-')} B={getattr(c, 'batch_size', '-')}\n  key {key[:1500]}", flush=True)
    real(name)


counters.record_compile = record
case_run.around_case = around
sys.exit(cli.main(sys.argv[1:]))
