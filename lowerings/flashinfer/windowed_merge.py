"""Non-causal windowed = causal windowed decode + merge, through flashinfer (docs/semantics.md 4.3, seed 000):
`windowed_merge[flashinfer-eager|flashinfer-compiled|flashinfer-triton|flashinfer-merge_state]`.

Part A = CUDA-core decode rows anchored per query (`seq_len = L+i+1`, `window_left = left`), part B
+ merge by one of `lowerings.merges`' forms, or by `flashinfer.merge_state_in_place`.
"""

from __future__ import annotations

from typing import Callable

import torch

from lowerings import counters
from lowerings.flashinfer.base import FlashinferBase
from lowerings.flashinfer.library import cuda_core_group_reason, flashinfer_module, head_dim_reason
from lowerings.flashinfer.names import (C_DECODE, C_MERGE_STATE, K_DECODE, K_MERGE_STATE, K_MERGE_TRITON,
                                        K_PREFILL_FA2, K_PREFILL_FA3, M_CASCADE, append_calls, append_kernels,
                                        jit_module_name, page_modules)
from lowerings.merges import MERGE_FORMS, merge_eager, merges_future_block_keys, part_b
from lowerings.protocol import BASE_2, BASE_E, LoweringResult, Partial
from oracle.rules import LN2
from oracle.case import Case
from oracle.inputs import Inputs

MERGE_STATE_FORM = "merge_state"
WINDOWED_MERGE_FORMS = ("eager", "compiled", "triton", MERGE_STATE_FORM)


class FlashinferWindowedMerge(FlashinferBase):
    """docs/semantics.md 4.3 (seed 000): part A from CUDA-core decode rows anchored at each query
    (`seq_len = L+i+1`, `window_left = left`: keys `max(0, p_i - left) .. p_i`), part B over the later
    block keys, merged by one form. No merge where no block key follows a query (`K == 1` or
    `right == 0`): the output is part A exactly.

    `merge_state`: part B by `lowerings.merges.part_b` (fp32, natural LSE, -inf where empty), its LSE
    converted to base 2 and its output rounded to the working dtype, then
    `flashinfer.merge_state_in_place` on copies this adapter owns, with `mask` clearing the rows whose
    part B is empty (`i = K-1`): those rows are part A bit for bit (the kernel's -inf handling is not
    relied on; their `s_other` is -inf and `v_other` zero all the same).

    CUDA-graph safe in every form: the merges are device work only (no host sync, no host data); the
    compiled and Triton forms must have run once (compiled) before a capture.
    """

    graph_safe = True

    def __init__(self, form: str) -> None:
        super().__init__()
        if form not in WINDOWED_MERGE_FORMS:
            raise ValueError(f"form: one of {WINDOWED_MERGE_FORMS}, got {form!r}")
        self.form = form
        self.name = f"windowed_merge[flashinfer-{form}]"
        # compiled: one static graph, then one with a symbolic batch (as the torch WindowedMerge).
        self.max_compiles = {"compiled": 2, "triton": 1}.get(form)

    def available(self, device: str) -> tuple[bool, str]:
        ok, why = super().available(device)
        if ok and self.form == "triton":
            from lowerings._triton_env import triton_available
            return triton_available(device)
        return ok, why

    def supports(self, case: Case) -> str | None:
        return head_dim_reason(case) or cuda_core_group_reason(case)

    def merge_calls(self, case: Case) -> dict[str, int]:
        return {"eager": {"torch.merge_eager": 1}, "compiled": {"torch.compile[merge_unrolled]": 1},
                "triton": {"triton.merge_future_block_keys": 1},
                MERGE_STATE_FORM: {C_MERGE_STATE: 1}}[self.form]

    def expected_calls(self, case: Case) -> dict[str, int]:
        calls = {**append_calls(case), C_DECODE: 1}
        if merges_future_block_keys(case.block_size, case.window[1]):
            calls.update(self.merge_calls(case))
        return calls

    def kernel_families(self, case: Case) -> dict[str, str]:
        fams = {**append_kernels(case), C_DECODE: K_DECODE}
        if merges_future_block_keys(case.block_size, case.window[1]):
            if self.form == MERGE_STATE_FORM:
                fams[C_MERGE_STATE] = K_MERGE_STATE
            elif self.form == "triton":
                fams["triton.merge_future_block_keys"] = K_MERGE_TRITON
        return fams

    def forbidden_kernel_families(self, case: Case) -> dict[str, str]:
        return {"tensor-core decode / fa2 prefill (CUDA cores asked for)": K_PREFILL_FA2,
                "fa3 prefill": K_PREFILL_FA3}

    def jit_modules(self, case: Case) -> tuple[str, ...]:
        mods = [*page_modules(case), jit_module_name("decode", case, case.window[0])]
        if merges_future_block_keys(case.block_size, case.window[1]):
            mods.append({"eager": "", "compiled": "torch.compile merge_unrolled (inductor)",
                         "triton": f"triton merge_future_block_keys D={case.head_dim}",
                         MERGE_STATE_FORM: M_CASCADE}[self.form])
        return tuple(m for m in mods if m)

    def _build(self, inputs: Inputs, graph: bool) -> Callable[[], LoweringResult]:
        c = inputs.case
        left, right = c.window
        B, K, Hq, D = inputs.q.shape
        q, k_block, v_block = inputs.q, inputs.k_block, inputs.v_block
        append = self._append_step(inputs, graph)
        rows = [b for b in range(B) for _ in range(K)]
        lens = [L + i + 1 for L in inputs.context_lens_host for i in range(K)]
        part_a = self._decode_step(inputs, rows, lens, window_left=left, tensor_cores=False, graph=graph)
        merges = merges_future_block_keys(K, right)
        form = self.form
        mask = None
        if merges and form == MERGE_STATE_FORM:
            mask = (torch.arange(K, device=inputs.device) < K - 1).repeat(B).to(torch.uint8)  # row (b, i): i < K-1
        # Graph mode: the merged result lands in fixed buffers, so each call returns the same tensors
        # (merge_state merges in place there; the other forms allocate, their result is copied there).
        fixed = self.graph_outputs(inputs, f"merge[{form}]") if graph and merges else None

        def call() -> LoweringResult:
            append()
            o, l2 = part_a()
            o_a, lse_a = o.view(B, K, Hq, D), l2.view(B, K, Hq)
            partials = {"A": Partial(out=o_a, lse=lse_a, lse_base=BASE_2, window=(left, 0))}
            if not merges:
                return LoweringResult(out=o_a, lse=lse_a, partials=partials)
            if form != MERGE_STATE_FORM:
                if form == "eager":
                    out, lse, o_b, lse_b = merge_eager(q, k_block, v_block, o_a, lse_a, scale=c.softmax_scale,
                                                       right=right, lse_a_base=BASE_2, return_part_b=True)
                    partials["B"] = Partial(out=o_b, lse=lse_b, lse_base=BASE_E, window=(-1, -1),
                                            future_block_keys_right=right)
                else:
                    out, lse = MERGE_FORMS[form](q, k_block, v_block, o_a, lse_a, scale=c.softmax_scale,
                                                 right=right, lse_a_base=BASE_2)
                if fixed is not None:
                    out, lse = fixed[0].copy_(out), fixed[1].copy_(lse)
                return LoweringResult(out=out, lse=lse, partials=partials)
            fi = flashinfer_module()
            o_b, lse_b = part_b(q, k_block, v_block, scale=c.softmax_scale, right=right)
            partials["B"] = Partial(out=o_b, lse=lse_b, lse_base=BASE_E, window=(-1, -1),
                                    future_block_keys_right=right)
            if fixed is not None:
                v = fixed[0].view(B * K, Hq, D).copy_(o_a.reshape(B * K, Hq, D))
                s = fixed[1].view(B * K, Hq).copy_(lse_a.reshape(B * K, Hq))
            else:
                v = o_a.reshape(B * K, Hq, D).clone(memory_format=torch.contiguous_format)
                s = lse_a.reshape(B * K, Hq).to(torch.float32).clone(memory_format=torch.contiguous_format)
            v_other = o_b.to(o_a.dtype).reshape(B * K, Hq, D).contiguous()
            s_other = (lse_b.float() / LN2).reshape(B * K, Hq).contiguous()  # -inf stays -inf
            counters.record(C_MERGE_STATE, rows=B * K)
            fi.merge_state_in_place(v, s, v_other, s_other, mask=mask)
            return LoweringResult(out=v.view(B, K, Hq, D), lse=s.view(B, K, Hq), partials=partials)

        return call
