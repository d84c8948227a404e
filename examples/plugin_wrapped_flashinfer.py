"""An example plugin: flashinfer's kernels behind a user's own names and glue (`--plugin
examples/plugin_wrapped_flashinfer.py`). None of these lowerings has a tolerance entry of its own.

- `my_fa2_context` and `my_tc_decode_rows` wrap the project's adapters `context[flashinfer-fa2]` and
  `decode_rows[flashinfer-tc]` by composition, as a user's serving code would call them. They record the
  adapters' counter names (`flashinfer.BatchPrefill[fa2].run`, `flashinfer.BatchDecode[tc].run`), which
  launch flashinfer's fa2 prefill kernel, so the measured `[kernel."BatchPrefillWithPagedKVCacheKernel"
  .bfloat16]` entry of `tolerances.toml` sets their LSE bound.
- `my_direct_fa2_context` calls `flashinfer.BatchPrefillWithPagedKVCacheWrapper(backend="fa2")` itself
  (appended block storage only: the block is in the pool already, no append). It records nothing through
  the project's counters; the framework observes the wrapper's `run` (`lowerings.flashinfer_observer`) and
  the same entry applies.

`parity.json` lists, per lowering, the entry that set each case's bounds and why ("bounds"). CUDA only.
"""

from __future__ import annotations

import torch

from lowerings import LoweringResult, register
from lowerings import flashinfer as fp


class Wrapped:
    """A user's lowering that calls one of the project's adapters (attributes and hooks delegated)."""

    def __init__(self, inner, name: str) -> None:
        self.inner, self.name = inner, name
        self.devices, self.lse_base = inner.devices, inner.lse_base
        self.deterministic, self.max_compiles = inner.deterministic, inner.max_compiles

    def available(self, device):
        return self.inner.available(device)

    def supports(self, case):
        return self.inner.supports(case)

    def expected_calls(self, case):
        return self.inner.expected_calls(case)

    def case_limits(self, device):
        return self.inner.case_limits(device)

    def jit_modules(self, case):  # `--warm-up` compiles them first
        return self.inner.jit_modules(case)

    def run(self, inputs):
        return self.inner.run(inputs)


class DirectFa2Context:
    """Context FMHA through flashinfer's fa2 paged-prefill wrapper, called directly."""

    name = "my_direct_fa2_context"
    devices = ("cuda",)
    lse_base = 2.0
    deterministic = True
    max_compiles = None

    def __init__(self) -> None:
        self.adapter = fp.FlashinferContext("fa2")  # for available() / supports() / the JIT warm-up only
        self.workspace = None
        self.wrappers = {}

    def available(self, device):
        return self.adapter.available(device)

    def supports(self, case):
        if case.block_storage != "appended":
            return "my_direct_fa2_context reads the block from the pool: appended block storage only"
        return self.adapter.supports(case)

    def expected_calls(self, case):
        return {}  # it calls flashinfer directly: nothing recorded through lowerings.counters

    def case_limits(self, device):
        return self.adapter.case_limits(device)

    def jit_modules(self, case):
        return self.adapter.jit_modules(case)

    def run(self, inputs):
        import flashinfer

        c = inputs.case
        B, K, Hq, D = inputs.q.shape
        dev = inputs.device
        if self.workspace is None:
            self.workspace = torch.zeros(fp.WORKSPACE_BYTES, dtype=torch.uint8, device=dev)
        key = (c.layout, c.dtype, c.kv_dtype, c.head_dim, c.page_size)
        w = self.wrappers.get(key)
        if w is None:
            w = self.wrappers[key] = flashinfer.BatchPrefillWithPagedKVCacheWrapper(self.workspace, c.layout,
                                                                                     backend="fa2")
        lens = [L + K for L in inputs.context_lens_host]
        pg = fp.build_paging(inputs.page_table, range(B), lens, c.page_size, dev)
        qo_indptr = torch.arange(B + 1, dtype=torch.int32, device=dev) * K
        w.plan(qo_indptr, pg.indptr, pg.indices, pg.last_page_len, c.num_q_heads, c.num_kv_heads, c.head_dim,
               c.page_size, causal=False, pos_encoding_mode="NONE", window_left=c.window[0],
               sm_scale=c.softmax_scale, q_data_type=inputs.q.dtype, kv_data_type=inputs.k_pool.dtype)
        scales = ({"k_scale": float(c.k_scale), "v_scale": float(c.v_scale)} if c.kv_dtype == fp.FP8 else {})
        out, lse = w.run(inputs.q.reshape(B * K, Hq, D), (inputs.k_pool, inputs.v_pool), return_lse=True, **scales)
        return LoweringResult(out=out.view(B, K, Hq, D), lse=lse.view(B, K, Hq))


register(Wrapped(fp.FlashinferContext("fa2"), "my_fa2_context"))
register(Wrapped(fp.FlashinferDecodeRows(tensor_cores=True), "my_tc_decode_rows"))
register(DirectFa2Context())
