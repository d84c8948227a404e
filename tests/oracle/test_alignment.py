"""Every tensor the framework hands a lowering starts 16-byte aligned, whatever the case's sizes: Triton specializes
a pointer argument on its 16-byte alignment (and a vectorized kernel may require it), so a buffer whose alignment
followed the batch size made a correct kernel compile one more variant per shape family on the H200, a false alarm
of the compile bound (session 17, runs 58-60: the guarded LSE view). A serving stack's `torch.empty` is aligned;
the framework's tensors must be too, for the inputs as built, their copies (`Inputs.clone`, the pristine source of
re-runs) and the poisoned output buffers."""

from __future__ import annotations

import pytest
import torch

from oracle.inputs import attach_output_buffers, materialize
from tests.oracle.oracle_cases import build_case

ALIGN = 16

# Odd sizes on purpose: B, K, head counts and lengths whose products are not multiples of 16 bytes.
CASES = [
    # run 58's family: B=55, K=7, Hq=3 (an LSE of 1,155 fp32 values, a guard as long as the view)
    build_case(tuple((37 * i) % 50 for i in range(55)), 7, 3, 1, 128, 1, dtype="float16"),
    build_case((25, 24, 0, 127, 1042, 24, 23), 7, 3, 1, 128, 1, dtype="float16"),
    build_case((5, 40, 1), 3, 1, 5, 64, 16, kv_dtype="float8_e4m3fn", page_table_pad=3),
    build_case((33,), 1, 2, 3, 64, 7, layout="HND", block_storage="appended", page_table_dtype="int64"),
    build_case((0, 1, 2, 3, 4), 5, 1, 1, 64, 3, dtype="float16", kv_dtype="float8_e4m3fn", block_storage="appended"),
]


def _misaligned(named: dict[str, torch.Tensor]) -> dict[str, int]:
    return {k: t.data_ptr() % ALIGN for k, t in named.items() if t is not None and t.data_ptr() % ALIGN}


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.short()[:50])
@pytest.mark.parametrize("build", ["host", "device"])
def test_every_tensor_a_lowering_gets_is_16_byte_aligned(case, build):
    inputs = materialize(case, "cpu", build=build)
    out, lse = attach_output_buffers(inputs)
    assert _misaligned(inputs.tensors()) == {}
    assert _misaligned({"out": inputs.out, "lse_out": inputs.lse_out}) == {}
    again = inputs.clone()
    attach_output_buffers(again)
    assert _misaligned(again.tensors()) == {}
    assert _misaligned({"out": again.out, "lse_out": again.lse_out}) == {}
