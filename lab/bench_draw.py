"""Time drawing cases (hypothesis + repair + validation), and fingerprint them.

    python lab/bench_draw.py [N]

Draws N (default 150) `gpu`-profile cases for each of four lowerings with their CUDA case limits (no
GPU needed: only the strategies run), inside `seed_only_draws()` as `check` draws them (without it hypothesis mixes
in constants from the source of every module loaded, so adding a module changed the cases), and prints the cases drawn, a SHA-256 prefix of their JSON (equal
fingerprints: the very same cases) and the milliseconds per case, each lowering's and all. Used for docs/lab/draw-bench.md and docs/lab/performance-log.md.
"""

from __future__ import annotations

import hashlib
import sys
import time

from hypothesis import given

import lowerings
from lowerings.protocol import optional_hook
from strategies import cases, profile_settings
from strategies._determinism import seed_only_draws

LOWERINGS = ("decode_rows[flashinfer]", "windowed_merge[flashinfer-eager]", "hybrid_paged", "context")


def main(n: int = 150) -> None:
    digest, count = hashlib.sha256(), 0
    t0 = time.perf_counter()
    for name in LOWERINGS:
        lw = lowerings.get(name)
        fn = optional_hook(lw, "case_limits")
        limits = fn("cuda") if fn is not None else None
        t1, before = time.perf_counter(), count

        @profile_settings("gpu", max_examples=n)
        @given(case=cases(lw, limits=limits))
        def draw(case):
            nonlocal count
            count += 1
            digest.update(case.to_json().encode())

        with seed_only_draws():  # as `check` draws: the same cases whatever modules are loaded
            draw()
        print(f"  {name}: {count - before} cases, {(time.perf_counter() - t1) / max(1, count - before) * 1000:.1f} ms "
              f"per case")
    ms = (time.perf_counter() - t0) / count * 1000
    print(f"{count} cases, fingerprint {digest.hexdigest()[:16]}, {ms:.1f} ms per case")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 150)
