"""Whether the next step of a case fits in the device's memory; a step that does not is skipped, and says so.

`run_case` asks `fits(...)` before each step that holds more tensors than the case's inputs (the
yardstick's copy and working set, the untouched-input snapshot, the determinism / canary re-run, the
request-isolation run), with the bytes the step needs
(`oracle.footprint`). Free memory is measured (CUDA: `cudaMemGetInfo` plus what torch's caching
allocator holds unused; CPU: `MemAvailable`), or, when `RunOptions.memory_bytes` is set, that budget less
the case's inputs. A step that would not fit in `HEADROOM` of it is not run: the case's outcome records
why under `skipped[check]`, the lowering's report counts the cases per check, and `summary.md` lists them.
Never silent: a verdict without its hardening says so.
"""

from __future__ import annotations

import contextlib
import os
from typing import Iterator

from oracle import footprint
from parity.exec.pool import process_alive


class OutOfDeviceMemory(Exception):
    """A step of a case ran out of device memory (CUDA): a condition of the shared device, which `run_case`
    answers by judging the case again with the device's large-case memory to itself, never a verdict by itself."""


def is_out_of_memory(err: BaseException) -> bool:
    """Whether `err` is the device running out of memory: `OutOfDeviceMemory`, torch's `OutOfMemoryError`, or a
    CUDA error saying so (a kernel library's allocation). A host `MemoryError` is not (nothing to wait for)."""
    if isinstance(err, OutOfDeviceMemory):
        return True
    import torch

    oom = getattr(torch.cuda, "OutOfMemoryError", None)
    text = str(err).lower()
    return (oom is not None and isinstance(err, oom)) or ("cuda" in text and "out of memory" in text)


def release_cached(opts) -> None:
    """The allocator's cached blocks back to the device (CUDA), before a case is judged again after running out:
    first the first attempt's tensors, which reference cycles of its frames may still hold (`gc.collect`)."""
    import gc

    gc.collect()
    if str(opts.device).startswith("cuda"):
        import torch

        torch.cuda.empty_cache()


RETRIED_OOM = "out of device memory"  # CaseOutcome.retried key: judged again alone after running out


YARDSTICK = "yardstick"
UNTOUCHED = "untouched-input check"
RERUN = "determinism and canary re-run"
ISOLATION = "request isolation"
HEADROOM = 0.9  # of the free memory a step may take (allocator rounding, the lowering's temporaries)


def _meminfo_available() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def free_bytes(case, opts) -> int | None:
    """Bytes the next step may take: `opts.memory_bytes` less the case's inputs when set, else measured
    on the device; None when it cannot be measured (the step runs)."""
    if opts.memory_bytes is not None:
        return opts.memory_bytes - footprint.input_bytes(case)
    if str(opts.device).startswith("cuda"):
        import torch

        free, _ = torch.cuda.mem_get_info()
        return free + cached_unused_bytes(torch.cuda.memory_stats_as_nested_dict())
    return _meminfo_available()


def cached_unused_bytes(stats: dict) -> int:
    """Bytes torch's caching allocator holds and no tensor uses (reserved less allocated, all pools), from one
    `torch.cuda.memory_stats_as_nested_dict()`: what `memory_reserved() - memory_allocated()` gives, without the two
    flattenings of every counter those make (H200 run 87: 1.2 ms of a case's host time per `fits`, 1.6 a case)."""
    def current(key: str) -> int:
        return int(stats.get(key, {}).get("all", {}).get("current", 0))
    return current("reserved_bytes") - current("allocated_bytes")


def skip_message(check: str, what: str, need: int, free: int, device: str) -> str:
    return (f"{check} skipped: {what} needs {footprint.human(need)}, {footprint.human(max(0, free))} free on "
            f"{device}")


def fits(outcome, check: str, case, opts, need: int, what: str) -> bool:
    """Whether `need` bytes fit now; if not, records why under `outcome.skipped[check]` (when an outcome
    is given) and returns False."""
    free = free_bytes(case, opts)
    if free is None or need <= free * HEADROOM:
        return True
    if outcome is not None:
        outcome.skipped[check] = skip_message(check, what, need, free, opts.device)
    return False


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
    import fcntl
    import json

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
    import tempfile
    from pathlib import Path

    import torch

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
        import time

        if not str(self.opts.device).startswith("cuda") or self.opts.memory_bytes is not None:
            return self
        import torch

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
            import torch

            release(self.path)
            torch.cuda.empty_cache()
