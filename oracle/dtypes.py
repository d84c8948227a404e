"""The torch dtypes a case names, the page table as the oracle's own Triton kernels read it, and whether those
kernels run under Triton's interpreter.

Below `oracle.inputs` (which builds a case's tensors) and the Triton launchers (`oracle._fast`, the device build
`oracle._device_values`), which all read these and import nothing of each other's for them.
"""

from __future__ import annotations

import os

import torch

from oracle.errors import InvalidInput

TORCH_DTYPES = {
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float8_e4m3fn": getattr(torch, "float8_e4m3fn", None),
    "int32": torch.int32,
    "int64": torch.int64,
}


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a case's dtype name (`Case.dtype`, `kv_dtype`, `page_table_dtype`); InvalidInput where
    this torch has none (fp8 on an old torch)."""
    dt = TORCH_DTYPES.get(name)
    if dt is None:
        raise InvalidInput("dtype", f"{name!r} is not available in torch {torch.__version__}")
    return dt


def page_table_int32(table: torch.Tensor) -> torch.Tensor:
    """The page table as the framework's kernels read it (the oracle's and the case builder's): int32, the same ids (a
    pool has fewer than 2**31 pages; the padding past a row's pages, never read, may wrap). One pointer type, so one
    compiled variant where an int64 table made its own. The lowerings still get the case's own table."""
    return table.to(torch.int32) if table.dtype == torch.int64 else table


def interpreting() -> bool:
    """Whether `TRITON_INTERPRET` asks for Triton's interpreter (read without importing triton): where the oracle's
    Triton kernels run on a CPU."""
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "on", "yes")
