"""Where the tests run their tensors, so that one suite means the same on CI (CPU, Triton interpreted)
and on a GPU runner (Triton compiled for the GPU, no `TRITON_INTERPRET`).

- `TRITON_DEVICE`: the device the Triton kernels of this process take tensors on ("cpu" interpreted,
  "cuda" compiled). Tests of the Triton kernels and lowerings run there.
- `interpreter_only`: a mark for the few tests that only make sense under the interpreter (they skip on a
  GPU runner with that reason, shown in the summary).
"""

from __future__ import annotations

import pytest

from lowerings import triton_device

TRITON_DEVICE = triton_device()
TRITON_COMPILED = TRITON_DEVICE != "cpu"

interpreter_only = pytest.mark.skipif(
    TRITON_COMPILED, reason="checks the CPU path of a Triton lowering, which needs the Triton interpreter "
    "(TRITON_INTERPRET=1); here the kernels are compiled for the GPU and their tests run on cuda")
