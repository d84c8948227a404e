"""Whether the next step of a case fits in the device's memory; a step that does not is skipped, and says so.

`run_case` asks `fits(...)` before each step that holds more tensors than the case's inputs (the
yardstick's copy and working set, the untouched-input snapshot, the determinism / canary re-run, the
request-isolation run, the profiled run that reads kernel names), with the bytes the step needs
(`parity.footprint`). Free memory is measured (CUDA: `cudaMemGetInfo` plus what torch's caching
allocator holds unused; CPU: `MemAvailable`), or, when `RunOptions.memory_bytes` is set, that budget less
the case's inputs. A step that would not fit in `HEADROOM` of it is not run: the case's outcome records
why under `skipped[check]`, the lowering's report counts the cases per check, and `summary.md` lists them.
Never silent: a verdict without its hardening says so.
"""

from __future__ import annotations

from parity import footprint

YARDSTICK = "yardstick"
UNTOUCHED = "untouched-input check"
RERUN = "determinism and canary re-run"
ISOLATION = "request isolation"
KERNEL_NAMES = "kernel names"
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
        return free + torch.cuda.memory_reserved() - torch.cuda.memory_allocated()
    return _meminfo_available()


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
