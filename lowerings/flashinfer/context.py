"""Context FMHA through flashinfer (docs/semantics.md 4.1): `context[flashinfer-fa2]`, `context[flashinfer-fa3]`.

[append the block] + ONE `BatchPrefillWithPagedKVCacheWrapper(backend=...)` call, `K` queries per
request over `L+K` keys, `causal=False`, `window_left=left` (exact iff `K-1 <= right`).
"""

from __future__ import annotations

from typing import Callable

from lowerings.flashinfer.base import FlashinferBase
from lowerings.flashinfer.library import device_desc, head_dim_reason
from lowerings.flashinfer.names import (FP8, K_DECODE, K_PREFILL_FA2, K_PREFILL_FA3, append_calls, append_kernels,
                                        c_prefill, jit_module_name, page_modules)
from lowerings.protocol import LoweringResult
from oracle.rules import context_window_reason
from oracle.case import Case
from oracle.inputs import Inputs


class FlashinferContext(FlashinferBase):
    """Context FMHA (docs/semantics.md 4.1): one paged prefill, `K` queries per request over `L+K` keys,
    `causal=False`, `window_left=left`: an end-aligned left window only, exact iff `K-1 <= right`."""

    graph_safe = True

    def __init__(self, backend: str) -> None:
        super().__init__()
        if backend not in ("fa2", "fa3"):
            raise ValueError(f"backend: 'fa2' or 'fa3', got {backend!r}")
        self.backend = backend
        self.name = f"context[flashinfer-{backend}]"

    def available(self, device: str) -> tuple[bool, str]:
        ok, why = super().available(device)
        if not ok or self.backend != "fa3":
            return ok, why
        major, minor, gpu = device_desc()
        if major != 9:
            return False, f"flashinfer's fa3 kernels need SM90 (Hopper); this GPU is sm_{major}{minor} ({gpu})"
        return ok, why

    def supports(self, case: Case) -> str | None:
        why = context_window_reason(case) or head_dim_reason(case)
        if why:
            return why
        if self.backend == "fa3" and case.kv_dtype == FP8:
            return (f"flashinfer's fa3 (SM90) prefill has no {case.dtype}-query x fp8-KV kernel (fa3 fp8 needs an "
                    f"fp8 query too; determine_attention_backend never picks fa3 for fp8 KV)")
        return None

    def expected_calls(self, case: Case) -> dict[str, int]:
        return {**append_calls(case), c_prefill(self.backend): 1}

    def kernel_families(self, case: Case) -> dict[str, str]:
        k = K_PREFILL_FA3 if self.backend == "fa3" else K_PREFILL_FA2
        return {**append_kernels(case), c_prefill(self.backend): k}

    def forbidden_kernel_families(self, case: Case) -> dict[str, str]:
        if self.backend == "fa3":
            return {"fa2 paged prefill (fa3 silently replaced by fa2)": K_PREFILL_FA2, "CUDA-core decode": K_DECODE}
        return {"fa3 prefill (not asked for)": K_PREFILL_FA3, "CUDA-core decode": K_DECODE}

    def jit_modules(self, case: Case) -> tuple[str, ...]:
        return (*page_modules(case), jit_module_name(self.backend, case, case.window[0]))

    def _build(self, inputs: Inputs, graph: bool) -> Callable[[], LoweringResult]:
        return self._prefill_sequence(inputs, self.backend, window_left=inputs.case.window[0], graph=graph)
