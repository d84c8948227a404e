"""flashinfer's trtllm-gen entry points: `trtllm_gen[decode]`, `trtllm_gen[context]`.

SM100/SM103 only; `available()` says so everywhere else and `run()` refuses to call them (off SM100 they
route to xqa or stall on a cubin download). Best effort: never run on this project's GPUs.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any, Callable

import torch

from lowerings import counters
from lowerings.flashinfer.base import FlashinferBase
from lowerings.flashinfer.library import device_desc, flashinfer_status, head_dim_reason
from lowerings.flashinfer.names import (C_TRTLLM_CONTEXT, C_TRTLLM_DECODE, FP8, K_DECODE, K_PREFILL_FA2, K_TRTLLM,
                                        append_calls, append_kernels, page_modules)
from lowerings.protocol import LoweringResult
from oracle.case import Case
from oracle.inputs import Inputs

TRTLLM_NEED = "trtllm-gen kernels need SM100/SM103 (Blackwell)"


class TrtllmGen(FlashinferBase):
    """flashinfer's trtllm-gen entry points, as TensorRT-LLM's DFlash drafter calls them (seed 002):
    `decode`: `B*K` single-query decode rows over repeated page tables, `seq_len = L+K`
    (`flashinfer.decode.trtllm_batch_decode_with_kv_cache(backend="trtllm-gen")`); `context`: one
    non-causal `flashinfer.prefill.trtllm_batch_context_with_kv_cache` call. Non-causal unwindowed only.

    Never called off SM100/SM103: there `trtllm_batch_decode_with_kv_cache` routes to xqa (which has no
    LSE) and the trtllm-gen cubins stall ~50 s on a download before failing. UNTESTED in this project
    (no Blackwell GPU): the LSE base (2, as docs/semantics.md states for trtllm-gen) and the argument names
    are taken from flashinfer's source and checked with `inspect.signature` before the call.
    """

    def __init__(self, kind: str) -> None:
        super().__init__()
        if kind not in ("decode", "context"):
            raise ValueError(f"kind: 'decode' or 'context', got {kind!r}")
        self.kind = kind
        self.name = f"trtllm_gen[{kind}]"

    def available(self, device: str) -> tuple[bool, str]:
        if device != "cuda":
            return False, f"{self.name} runs on cuda only, not {device} ({TRTLLM_NEED})"
        if not torch.cuda.is_available():
            return False, f"no CUDA device visible to torch ({TRTLLM_NEED})"
        major, minor, gpu = device_desc()
        if (major, minor) not in ((10, 0), (10, 3)):
            return False, f"{TRTLLM_NEED}; this GPU is sm_{major}{minor} ({gpu})"
        return flashinfer_status()

    def supports(self, case: Case) -> str | None:
        if case.window != (-1, -1):
            return f"{self.name}: non-causal unwindowed layers only (as TensorRT-LLM uses it), got window={case.window}"
        return head_dim_reason(case)

    def _call_name(self) -> str:
        return C_TRTLLM_DECODE if self.kind == "decode" else C_TRTLLM_CONTEXT

    def expected_calls(self, case: Case) -> dict[str, int]:
        return {**append_calls(case), self._call_name(): 1}

    def kernel_families(self, case: Case) -> dict[str, str]:
        return {**append_kernels(case), self._call_name(): K_TRTLLM}

    def forbidden_kernel_families(self, case: Case) -> dict[str, str]:
        return {"flashinfer CUDA-core decode": K_DECODE, "flashinfer fa2 prefill": K_PREFILL_FA2}

    def jit_modules(self, case: Case) -> tuple[str, ...]:
        return (*page_modules(case), f"flashinfer trtllm-gen fmha ({self.kind})")

    def prepare(self, inputs: Inputs) -> Callable[[], LoweringResult]:
        raise NotImplementedError(f"{self.name}: prepare() for CUDA graphs is not supported (trtllm-gen's seq_lens, "
                                  f"block tables and max lengths are built per call here, and it is untested)")

    def _guard(self) -> None:
        ok, why = self.available("cuda")
        major = torch.cuda.get_device_capability()[0] if torch.cuda.is_available() else None
        if not ok or major != 10:
            raise RuntimeError(f"{self.name} refuses to call trtllm-gen here: {why}")

    def run(self, inputs: Inputs) -> LoweringResult:
        self._guard()
        c = inputs.case
        B, K, Hq, D = inputs.q.shape
        dev = inputs.device
        self.append_block(inputs)
        bmm1 = c.softmax_scale * (c.k_scale if c.kv_dtype == FP8 else 1.0)
        bmm2 = c.v_scale if c.kv_dtype == FP8 else 1.0
        table = inputs.page_table.to(torch.int32).contiguous()
        kv = (inputs.k_pool, inputs.v_pool)
        ws = self.workspace(dev)
        if self.kind == "decode":
            fn = importlib.import_module("flashinfer.decode").trtllm_batch_decode_with_kv_cache
            params = inspect.signature(fn).parameters
            if "return_lse" not in params:
                raise NotImplementedError("this flashinfer's trtllm_batch_decode_with_kv_cache has no return_lse")
            seq = [L + K for L in inputs.context_lens_host for _ in range(K)]
            counters.record(C_TRTLLM_DECODE, rows=B * K)
            res = fn(query=inputs.q.reshape(B * K, Hq, D), kv_cache=kv, workspace_buffer=ws,
                     block_tables=table.repeat_interleave(K, dim=0).contiguous(),
                     seq_lens=torch.tensor(seq, dtype=torch.int32, device=dev), max_seq_len=max(seq),
                     bmm1_scale=bmm1, bmm2_scale=bmm2, window_left=-1, kv_layout=c.layout,
                     backend="trtllm-gen", return_lse=True)
        else:
            fn = importlib.import_module("flashinfer.prefill").trtllm_batch_context_with_kv_cache
            params = inspect.signature(fn).parameters
            if "is_causal" not in params:
                raise NotImplementedError("this flashinfer's trtllm_batch_context_with_kv_cache has no is_causal "
                                          "argument: it would apply a causal mask")
            lens = [L + K for L in inputs.context_lens_host]
            cum_kv = torch.zeros(B + 1, dtype=torch.int32)
            cum_kv[1:] = torch.cumsum(torch.tensor(lens, dtype=torch.int64), 0).to(torch.int32)
            extra: dict[str, Any] = {"is_causal": False, "window_left": -1, "kv_layout": c.layout}
            if "return_lse" in params:
                extra["return_lse"] = True
            counters.record(C_TRTLLM_CONTEXT, rows=B * K)
            res = fn(inputs.q.reshape(B * K, Hq, D), kv, ws, table,
                     torch.tensor(lens, dtype=torch.int32, device=dev), K, max(lens), bmm1, bmm2, B,
                     torch.arange(B + 1, dtype=torch.int32, device=dev) * K, cum_kv.to(dev), **extra)
        out, lse = (res if isinstance(res, tuple) else (res, None))
        out = out.view(B, K, Hq, D)
        return LoweringResult(out=out, lse=None if lse is None else lse.reshape(B, K, Hq))
