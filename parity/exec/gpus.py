"""Several GPUs of one host: one process per GPU.

- `check --jobs N` on cuda: each child gets `CUDA_VISIBLE_DEVICES` naming one GPU, the least busy of the
  visible ones when it starts (`GpuSlots`), so N children spread over the GPUs round-robin.
- pytest-xdist: worker `gwN` runs on GPU `N mod device_count` (`pin_xdist_worker`: `torch.cuda.set_device`,
  and its child processes get `CUDA_VISIBLE_DEVICES` narrowed to that GPU), when the session uses the
  plugin. `DFLASH_NO_GPU_PIN=1` turns it off.

Nothing here changes anything on a machine with fewer than two GPUs.

Public: `visible_gpus`, `narrowed_visible_devices`, `GpuSlots`, `xdist_gpu_index`, `pin_xdist_worker`.
"""

from __future__ import annotations

import os


def visible_gpus() -> int:
    """How many CUDA devices torch sees (0 without CUDA)."""
    try:
        import torch
    except ImportError:  # pragma: no cover
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def narrowed_visible_devices(visible: str | None, index: int, device_count: int) -> str:
    """`CUDA_VISIBLE_DEVICES` for a child pinned to GPU `index` of this process's `device_count`: that one
    entry of the parent's list (ids, UUIDs or MIG names), or the plain index when the parent had none."""
    entries = [e.strip() for e in visible.split(",") if e.strip()] if visible else []
    if len(entries) == device_count and 0 <= index < len(entries):
        return entries[index]
    return str(index)


class GpuSlots:
    """Which GPU the next child process gets: the one with the fewest children running (the lowest index
    on a tie). With fewer than two GPUs every child keeps this process's view (`take` gives None)."""

    def __init__(self, count: int, visible: str | None = None) -> None:
        self.count = count
        self.visible = visible
        self.busy = [0] * count

    def take(self) -> int | None:
        if self.count < 2:
            return None
        index = min(range(self.count), key=lambda i: (self.busy[i], i))
        self.busy[index] += 1
        return index

    def give_back(self, index: int | None) -> None:
        if index is not None:
            self.busy[index] -= 1

    def env(self, index: int | None) -> dict[str, str]:
        """The environment entries of a child on GPU `index` ({} for None)."""
        if index is None:
            return {}
        return {"CUDA_VISIBLE_DEVICES": narrowed_visible_devices(self.visible, index, self.count)}


def xdist_gpu_index(worker_id: str | None, device_count: int) -> int | None:
    """The GPU of pytest-xdist worker `gwN`: `N mod device_count`; None outside xdist (no or another id)
    or without a GPU."""
    if not worker_id or not worker_id.startswith("gw") or device_count < 1:
        return None
    try:
        n = int(worker_id[2:])
    except ValueError:
        return None
    return n % device_count if n >= 0 else None


def pin_xdist_worker(worker_id: str | None) -> int | None:
    """Pin this xdist worker to its GPU (`torch.cuda.set_device`) when the machine has more than one;
    child processes (isolated case runners) inherit a `CUDA_VISIBLE_DEVICES` naming that GPU only.
    Returns the index, or None when nothing was pinned (`DFLASH_NO_GPU_PIN=1`, one GPU or none)."""
    if os.environ.get("DFLASH_NO_GPU_PIN"):
        return None
    count = visible_gpus()
    index = xdist_gpu_index(worker_id, count)
    if index is None or count < 2:
        return None
    import torch

    torch.cuda.set_device(index)  # initializes CUDA with the parent's view before the variable changes
    os.environ["CUDA_VISIBLE_DEVICES"] = narrowed_visible_devices(os.environ.get("CUDA_VISIBLE_DEVICES"),
                                                                  index, count)
    return index
