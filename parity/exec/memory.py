"""Device memory shared by several processes on one GPU: the memory port's process-aware implementation.

What a case's steps ask of the device's memory (`fits`, out-of-memory, the allocator's cache) is the engine's
(`parity.engine.device_memory`, re-exported here). This module adds what several processes on one device need:
a large case leases its bytes in a ledger the processes share and waits for room (`device_lease`).
`SharedDeviceMemory` is the memory port (`parity.engine.ports.DeviceMemory`) with that lease, installed by
`parity.exec.ports_impl.install()`.

Public: `SharedDeviceMemory`, `device_lease`, `lease`, `release`, `ledger_path`, `LARGE_SHARE`, `LEASE_SHARE`,
`POLL_SECONDS`; the engine's `fits`, `free_bytes`, `cached_unused_bytes`, `skip_message`, `is_out_of_memory`,
`release_cached`, `OutOfDeviceMemory` and the check names (`RETRIED_OOM`, `YARDSTICK`, `UNTOUCHED`, `RERUN`,
`ISOLATION`, `HEADROOM`), re-exported.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Iterator

import torch

from oracle import footprint
from parity.engine.device_memory import (  # noqa: F401  (public here too)
    HEADROOM, ISOLATION, RERUN, RETRIED_OOM, UNTOUCHED, YARDSTICK, InProcessMemory, OutOfDeviceMemory,
    cached_unused_bytes, fits, free_bytes, is_out_of_memory, release_cached, skip_message)
from parity.exec.pool import process_alive


# ---- one device, several processes: admission of the large cases ------------------------------------------
#
# `check --jobs N` runs N processes on one GPU, each drawing cases up to `max_case_bytes` (40% of it): two
# or three large cases at once would not fit. A case whose footprint (`footprint.lease_bytes`: the input sets it
# holds at once) passes `LARGE_SHARE` of the device first leases its bytes in a
# ledger shared by every process on that device (a JSON file under a file lock: pid -> bytes), and waits
# until the leases held, its own included, fit in `LEASE_SHARE` of the device (a case alone always runs).
# Small cases do not queue: together they stay below the rest. After a large case the process returns
# its cached blocks to the device (`torch.cuda.empty_cache()`), so that the next large case, perhaps in
# another process, finds them free. The estimates are estimates: a case that runs out of device memory anyway is
# judged again alone (`device_lease(alone=True)`, `parity.engine.case_run`), never failed for it.

LARGE_SHARE = 0.02
LEASE_SHARE = 0.6
POLL_SECONDS = 0.05


@contextlib.contextmanager
def _ledger(path) -> Iterator[dict[int, int]]:
    """The ledger at `path` (created if missing) under an exclusive lock: `{pid: bytes leased}`, written back
    after the block when the block changed it (an unreadable ledger reads as empty)."""
    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        try:
            held = {int(k): int(v) for k, v in json.loads(f.read() or "{}").items()}
        except (ValueError, AttributeError):
            held = {}
        before = dict(held)
        yield held
        if held != before:
            f.seek(0)
            f.truncate()
            f.write(json.dumps({str(p): b for p, b in held.items()}))


def lease(path, need: int, cap: int, *, pid: int | None = None) -> bool:
    """Try once to lease `need` bytes in the ledger at `path` (created if missing): True if the leases of
    live processes plus `need` fit in `cap`, or none is held; False otherwise (the caller waits)."""
    pid = os.getpid() if pid is None else pid
    with _ledger(path) as held:
        live = {p: b for p, b in held.items() if p != pid and process_alive(p)}
        if live and sum(live.values()) + need > cap:
            return False
        held.clear()
        held.update(live)
        held[pid] = need
        return True


def release(path, *, pid: int | None = None) -> None:
    pid = os.getpid() if pid is None else pid
    with _ledger(path) as held:
        held.pop(pid, None)


def ledger_path(device_index: int):
    """One ledger per physical GPU (its UUID where torch gives it: processes may number GPUs differently)."""
    props = torch.cuda.get_device_properties(device_index)
    ident = str(getattr(props, "uuid", "") or f"{device_index}-{props.name}").replace("/", "_").replace(" ", "_")
    return Path(tempfile.gettempdir()) / f"dflash-parity-gpu-{ident}.json"


class device_lease:
    """`with device_lease(case, opts):` around a case: on CUDA, a large case (see above) waits for its bytes
    in the device's ledger and gives them back after; elsewhere, or with `opts.memory_bytes` set, nothing.
    `alone=True`: whatever its size, the case leases all of `LEASE_SHARE`, so it waits until no other process
    holds a lease and no large case starts beside it (a case that ran out of device memory, judged again).
    `waited` holds the seconds it waited."""

    def __init__(self, case, opts, *, alone: bool = False) -> None:
        self.case, self.opts, self.path, self.waited, self.alone = case, opts, None, 0.0, alone

    def __enter__(self) -> "device_lease":
        if not str(self.opts.device).startswith("cuda") or self.opts.memory_bytes is not None:
            return self
        index = torch.cuda.current_device()
        total = torch.cuda.get_device_properties(index).total_memory
        o = self.opts
        need = footprint.lease_bytes(self.case, hardening=o.check_determinism)
        if self.alone:
            need = int(LEASE_SHARE * total)
        elif need <= LARGE_SHARE * total:
            return self
        self.path = ledger_path(index)
        t0 = time.perf_counter()
        while not lease(self.path, need, int(LEASE_SHARE * total)):
            time.sleep(POLL_SECONDS)
        self.waited = time.perf_counter() - t0
        return self

    def __exit__(self, *exc) -> None:
        if self.path is not None:
            release(self.path)
            torch.cuda.empty_cache()


class SharedDeviceMemory(InProcessMemory):
    """The memory port of a process that shares its GPU with others (`check --jobs`, pytest-xdist, the isolated
    workers beside them): the engine's `fits` and out-of-memory, and `device_lease` as the lease."""

    def lease(self, case, opts, *, alone: bool = False) -> device_lease:
        return device_lease(case, opts, alone=alone)
