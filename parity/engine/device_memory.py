"""Whether the next step of a case fits in the device's memory; a step that does not is skipped, and says so.

`run_case` asks `fits(...)` (through the memory port, `parity.engine.ports`) before each step that holds more
tensors than the case's inputs (the yardstick's copy and working set, the untouched-input snapshot, the
determinism / canary re-run, the request-isolation run), with the bytes the step needs (`oracle.footprint`).
Free memory is measured (CUDA: `cudaMemGetInfo` plus what torch's caching allocator holds unused; CPU:
`MemAvailable`), or, when `RunOptions.memory_bytes` is set, that budget less the case's inputs. A step that
would not fit in `HEADROOM` of it is not run: the case's outcome records why under `skipped[check]` (the
check's name: `YARDSTICK`, `UNTOUCHED`, `RERUN`, `ISOLATION`), the lowering's report counts the cases per
check, and `summary.md` lists them. Never silent: a verdict without its hardening says so.

A step that runs out of device memory anyway (`is_out_of_memory`; a lowering's own raise becomes
`OutOfDeviceMemory`) is a condition of the shared device, not a verdict: `run_case` judges the case again with the
device's large-case memory to itself, noting it under `retried[RETRIED_OOM]`.

`InProcessMemory` is the memory port's pure default: all of the above, and a lease (`lease(case, opts)`) that
waits for nothing, as fits one process alone on its device. The process machinery's implementation
(`parity.exec.memory.SharedDeviceMemory`) leases a large case's bytes from the other processes on one GPU.

Public: `OutOfDeviceMemory`, `is_out_of_memory`, `release_cached`, `free_bytes`, `cached_unused_bytes`, `fits`,
`skip_message`, `InProcessMemory`, `NoLease`, `RETRIED_OOM`, `YARDSTICK`, `UNTOUCHED`, `RERUN`, `ISOLATION`,
`HEADROOM`.
"""

from __future__ import annotations

import gc

import torch

from oracle import footprint

RETRIED_OOM = "out of device memory"  # CaseOutcome.retried key: judged again alone after running out
YARDSTICK = "yardstick"
UNTOUCHED = "untouched-input check"
RERUN = "determinism and canary re-run"
ISOLATION = "request isolation"
HEADROOM = 0.9  # of the free memory a step may take (allocator rounding, the lowering's temporaries)


class OutOfDeviceMemory(Exception):
    """A step of a case ran out of device memory (CUDA): a condition of the shared device, which `run_case`
    answers by judging the case again with the device's large-case memory to itself, never a verdict by itself."""


def is_out_of_memory(err: BaseException) -> bool:
    """Whether `err` is the device running out of memory: `OutOfDeviceMemory`, torch's `OutOfMemoryError`, or a
    CUDA error saying so (a kernel library's allocation). A host `MemoryError` is not (nothing to wait for)."""
    if isinstance(err, OutOfDeviceMemory):
        return True
    oom = getattr(torch.cuda, "OutOfMemoryError", None)
    text = str(err).lower()
    return (oom is not None and isinstance(err, oom)) or ("cuda" in text and "out of memory" in text)


def release_cached(opts) -> None:
    """The allocator's cached blocks back to the device (CUDA), before a case is judged again after running out:
    first the first attempt's tensors, which reference cycles of its frames may still hold (`gc.collect`)."""
    gc.collect()
    if str(opts.device).startswith("cuda"):
        torch.cuda.empty_cache()


def _meminfo_available() -> int | None:
    """The host's `MemAvailable` in bytes (Linux), or None where it cannot be read."""
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
        free, _ = torch.cuda.mem_get_info()
        return free + cached_unused_bytes(torch.cuda.memory_stats_as_nested_dict())
    return _meminfo_available()


def cached_unused_bytes(stats: dict) -> int:
    """Bytes torch's caching allocator holds and no tensor uses (reserved less allocated, all pools), from one
    `torch.cuda.memory_stats_as_nested_dict()`: what `memory_reserved() - memory_allocated()` gives, without the
    two flattenings of every counter those make (a millisecond of host time per `fits` on a GPU host)."""
    def current(key: str) -> int:
        return int(stats.get(key, {}).get("all", {}).get("current", 0))
    return current("reserved_bytes") - current("allocated_bytes")


def skip_message(check: str, what: str, need: int, free: int, device: str) -> str:
    """`<check> skipped: <what> needs 1.2 GiB, 0.8 GiB free on <device>` (the outcome's `skipped[check]`)."""
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


class NoLease:
    """A lease that waited for nothing (`waited` 0 s): one process alone on its device."""

    waited = 0.0

    def __enter__(self) -> "NoLease":
        return self

    def __exit__(self, *exc) -> None:
        return None


class InProcessMemory:
    """The memory port's pure default (`parity.engine.ports.DeviceMemory`): the module's functions, and a lease
    that waits for nothing."""

    def fits(self, outcome, check: str, case, opts, need: int, what: str) -> bool:
        return fits(outcome, check, case, opts, need, what)

    def lease(self, case, opts, *, alone: bool = False) -> NoLease:
        return NoLease()

    def release_cached(self, opts) -> None:
        release_cached(opts)

    def is_out_of_memory(self, err: BaseException) -> bool:
        return is_out_of_memory(err)
