"""Decode rows through flashinfer (seed 002): `decode_rows[flashinfer]` (CUDA-core decode kernel),
`decode_rows[flashinfer-tc]` (tensor-core decode, i.e. flashinfer's fa2 prefill kernel behind the decode
wrapper).

`B*K` single-query decode rows over repeated page tables with `seq_len = L+K` when `B <= 32`
(`oracle.rules.DECODE_ROWS_MAX_BATCH`), else the context form (fa2 paged prefill).
"""

from __future__ import annotations

from typing import Callable

from lowerings.flashinfer.base import FlashinferBase
from lowerings.flashinfer.library import cuda_core_group_reason, head_dim_reason
from lowerings.flashinfer.names import (C_DECODE, C_DECODE_TC, K_DECODE, K_PREFILL_FA2, K_PREFILL_FA3, append_calls,
                                        append_kernels, c_prefill, jit_module_name, page_modules)
from lowerings.protocol import LoweringResult
from oracle.rules import DECODE_ROWS_MAX_BATCH, decode_rows_window_reason
from oracle.case import Case
from oracle.inputs import Inputs


class FlashinferDecodeRows(FlashinferBase):
    """Decode rows (seed 002): `B*K` single-query rows, row `(b, i)` repeats request `b`'s pages with
    `seq_len = L_b + K`, when `B <= 32`; else the context form (fa2 paged prefill). Non-causal
    unwindowed layers only."""

    threshold = DECODE_ROWS_MAX_BATCH
    graph_safe = True

    def __init__(self, tensor_cores: bool = False) -> None:
        super().__init__()
        self.tensor_cores = bool(tensor_cores)
        self.name = "decode_rows[flashinfer-tc]" if self.tensor_cores else "decode_rows[flashinfer]"

    def uses_rows(self, case: Case) -> bool:
        return case.batch_size <= self.threshold

    def supports(self, case: Case) -> str | None:
        why = decode_rows_window_reason(case) or head_dim_reason(case)
        if why:
            return why
        if not self.tensor_cores and self.uses_rows(case):
            why = cuda_core_group_reason(case)
            if why:
                return f"{why}; B={case.batch_size} <= {self.threshold} takes the decode rows"
        return None

    def expected_calls(self, case: Case) -> dict[str, int]:
        if not self.uses_rows(case):
            return {**append_calls(case), c_prefill("fa2"): 1}
        return {**append_calls(case), (C_DECODE_TC if self.tensor_cores else C_DECODE): 1}

    def kernel_families(self, case: Case) -> dict[str, str]:
        if not self.uses_rows(case):
            return {**append_kernels(case), c_prefill("fa2"): K_PREFILL_FA2}
        if self.tensor_cores:
            return {**append_kernels(case), C_DECODE_TC: K_PREFILL_FA2}
        return {**append_kernels(case), C_DECODE: K_DECODE}

    def forbidden_kernel_families(self, case: Case) -> dict[str, str]:
        if not self.uses_rows(case):
            return {"decode kernel (rows above the threshold)": K_DECODE, "fa3 prefill": K_PREFILL_FA3}
        if self.tensor_cores:
            return {"CUDA-core decode (tensor cores asked for)": K_DECODE, "fa3 prefill": K_PREFILL_FA3}
        return {"tensor-core decode / fa2 prefill (CUDA cores asked for)": K_PREFILL_FA2,
                "fa3 prefill": K_PREFILL_FA3}

    def jit_modules(self, case: Case) -> tuple[str, ...]:
        # The tensor-core decode runs flashinfer's fa2 prefill module (the same one context[fa2] loads).
        kernel = "fa2" if self.tensor_cores or not self.uses_rows(case) else "decode"
        return (*page_modules(case), jit_module_name(kernel, case, -1))

    def _build(self, inputs: Inputs, graph: bool) -> Callable[[], LoweringResult]:
        c = inputs.case
        if not self.uses_rows(c):
            return self._prefill_sequence(inputs, "fa2", window_left=-1, graph=graph)
        B, K, Hq, D = inputs.q.shape
        append = self._append_step(inputs, graph)
        rows = [b for b in range(B) for _ in range(K)]
        lens = [L + K for L in inputs.context_lens_host for _ in range(K)]
        decode = self._decode_step(inputs, rows, lens, window_left=-1, tensor_cores=self.tensor_cores, graph=graph)

        def call() -> LoweringResult:
            append()
            out, lse = decode()
            return LoweringResult(out=out.view(B, K, Hq, D), lse=lse.view(B, K, Hq))

        return call
