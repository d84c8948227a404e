"""The flashinfer library as the adapters see it: the lazy import, whether it imports here, the GPU's
compute capability, and what flashinfer 0.7.x instantiates its kernels for (head dims, GQA groups).

flashinfer is imported inside functions only: this package imports on a CPU machine without it.
"""

from __future__ import annotations

from typing import Any

import torch

from oracle.case import Case

# GQA groups the CUDA-core batch-decode kernel is instantiated for (DISPATCH_GQA_GROUP_SIZE; measured on
# flashinfer 0.7.2.post1): any other group raises inside plan().
CUDA_CORE_DECODE_GROUPS = (1, 2, 3, 4, 6, 8, 16)
HEAD_DIMS = (64, 128, 256)  # DISPATCH_HEAD_DIM of the decode / fa2 / fa3 kernels (64 and 128 measured)


def flashinfer_status() -> tuple[bool, str]:
    """`(True, "flashinfer <version>")` when `import flashinfer` works, else `(False, why)`."""
    try:
        import flashinfer  # noqa: F401
    except Exception as exc:  # ImportError, or a broken install (missing CUDA libs) raising anything
        return False, f"flashinfer is not importable: {type(exc).__name__}: {exc}"
    return True, f"flashinfer {getattr(flashinfer, '__version__', '?')}"


def flashinfer_module() -> Any:
    """`import flashinfer` (call only where `flashinfer_status()` said it imports)."""
    import flashinfer

    return flashinfer


def device_desc() -> tuple[int, int, str]:
    """The current CUDA device's compute capability `(major, minor)` and name."""
    major, minor = torch.cuda.get_device_capability()
    return major, minor, torch.cuda.get_device_name()


def head_dim_reason(case: Case) -> str | None:
    """Why flashinfer has no kernel for the case's head dim (None: it has one)."""
    if case.head_dim not in HEAD_DIMS:
        return f"flashinfer's kernels are instantiated for head_dim in {HEAD_DIMS}, got {case.head_dim}"
    return None


def cuda_core_group_reason(case: Case) -> str | None:
    """Why the CUDA-core batch-decode kernel cannot take the case's GQA group (None: it can)."""
    if case.group_size not in CUDA_CORE_DECODE_GROUPS:
        return (f"the CUDA-core batch-decode kernel dispatches GQA groups {CUDA_CORE_DECODE_GROUPS} only, got "
                f"G={case.group_size} ({case.num_q_heads}/{case.num_kv_heads} heads)")
    return None
