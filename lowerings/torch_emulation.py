"""The production decompositions of docs/semantics.md section 4, in torch, on any device.

- `sdpa`: torch SDPA in the working dtype over each request's gathered pages: the yardstick.
- `context`: one batched non-causal paged-prefill call, K queries per request over `L+K` keys.
- `decode_rows`: `B*K` single-query decode rows over repeated page tables, `seq_len = L+K`; the context
  form above the dispatch threshold (B > 32).
- `windowed_merge[eager|compiled|triton]`: part A from decode rows anchored per query (`seq_len = L+i+1`,
  `window_left = left`, base-2 LSE), part B over the later block keys, one merge form.
These are not the oracle renamed: they read through their own paging code, in the working dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from lowerings import counters, paged
from lowerings.merges import MERGE_FORMS, merge_eager, merges_future_block_keys
from lowerings.protocol import BASE_2, BASE_E, LoweringResult, Partial
from oracle.rules import DECODE_ROWS_MAX_BATCH, context_window_reason, decode_rows_window_reason
from oracle.case import Case
from oracle.inputs import Inputs

SDPA_GROUPED_ELEMENTS = 1 << 26  # past this many K elements (Hq x T x D), sdpa runs one KV head's group at a time
CPU_PRODUCTION_CONTEXT = 8192  # the torch lowerings' longest drawn context on a CPU (strategies._production)


class TorchLoweringBase:
    devices: tuple[str, ...] = ("cpu", "cuda")
    lse_base: float = BASE_E
    deterministic: bool = True
    max_compiles: int | None = None
    name = "torch-base"

    def available(self, device: str) -> tuple[bool, str]:
        if device not in self.devices:
            return False, f"runs on {', '.join(self.devices)}, not {device}"
        if device == "cuda" and not torch.cuda.is_available():
            return False, "no CUDA device visible to torch"
        return True, ""

    def supports(self, case: Case) -> str | None:
        return None

    def case_limits(self, device: str):
        """On a CPU, long contexts (to 8192 keys, past the 4096 where fixed-size buffers and split-KV
        boundaries bite) on small heads; on CUDA, the device's production defaults (None)."""
        if device == "cpu":
            from strategies import Limits
            return Limits(max_production_context=CPU_PRODUCTION_CONTEXT)
        return None

    def __repr__(self) -> str:
        return f"<lowering {self.name}>"


def ensure_block_in_pool(inputs: Inputs) -> None:
    """The production append step (`append_paged_kv_cache`) when the block is not in the pool yet."""
    c = inputs.case
    if c.block_storage == "dense":
        paged.append_paged_kv(inputs.k_pool, inputs.v_pool, inputs.page_table, list(inputs.context_lens_host),
                               inputs.k_block, inputs.v_block, layout=c.layout, page_size=c.page_size,
                               k_scale=c.k_scale, v_scale=c.v_scale)


def _append_calls(case: Case) -> dict[str, int]:
    return {"torch.append_paged_kv": 1} if case.block_storage == "dense" else {}


class Sdpa(TorchLoweringBase):
    """torch SDPA in the working dtype over gathered pages, one call per request (the yardstick)."""

    name = "sdpa"
    lse_base = BASE_E
    # As the yardstick it runs on a case's inputs, not a copy (`parity.case_run.run_yardstick`): it only
    # reads them (gathers, concatenates, attends), and its own untouched-input check says so whenever it is
    # checked as a lowering.
    reads_inputs_only = True

    def expected_calls(self, case: Case) -> dict[str, int]:
        return {"torch.sdpa": case.batch_size}

    def run(self, inputs: Inputs) -> LoweringResult:
        out, lse = self._attend(inputs, with_lse=True)
        return LoweringResult(out=out, lse=lse)

    def run_output(self, inputs: Inputs) -> torch.Tensor:
        """The output alone `[B, K, Hq, D]`, the same bits as `run(inputs).out`: what the yardstick needs
        (`parity.case_run.run_yardstick`), without the fp32 score matrix the LSE costs (measured on the H200
        at production scale, session 6 run 22: the LSE was 40% of the yardstick's 0.39 s per case)."""
        return self._attend(inputs, with_lse=False)[0]

    def _attend(self, inputs: Inputs, *, with_lse: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One SDPA call per request over its keys gathered from the pages, `[Hkv, L+K, D]`, each read once.
        GQA by grouping the queries, not repeating the keys: each KV head attends with its `G` query heads'
        `G*K` rows at once (`[Hkv, G*K, D]`, the mask repeated per head), so no `G`-fold copy of K/V is made
        or read (on the H200 the yardstick phase went from 10.9-13.9 to 8.8-11.3 ms per production case,
        with the other host-work changes of that commit range: docs/gpu/2026-12-02-h200-session11.md
        run 36). Every row is computed on its own either way."""
        c = inputs.case
        ps, K, D = c.page_size, c.block_size, c.head_dim
        G, Hkv = c.group_size, c.num_kv_heads
        dev, dt = inputs.device, inputs.q.dtype
        outs, lses = [], []
        for b, L in enumerate(inputs.context_lens_host):
            T = L + K
            t = torch.arange(L, device=dev)
            pid = inputs.page_table[b].to(torch.long)[t // ps]
            k = torch.empty((T, Hkv, D), dtype=dt, device=dev)
            v = torch.empty((T, Hkv, D), dtype=dt, device=dev)
            k[:L] = paged.read_pool(inputs.k_pool, pid, t % ps, c.layout, c.k_scale, dt)
            v[:L] = paged.read_pool(inputs.v_pool, pid, t % ps, c.layout, c.v_scale, dt)
            k[L:], v[L:] = inputs.k_block[b], inputs.v_block[b]
            k, v = k.transpose(0, 1), v.transpose(0, 1)  # [Hkv, T, D] views
            q = inputs.q[b].transpose(0, 1).reshape(Hkv, G * K, D)  # query head h*G + g, row i -> row g*K + i
            pos = L + torch.arange(K, device=dev).view(-1, 1)
            tt = torch.arange(T, device=dev).view(1, -1)
            left, right = c.window
            mask = torch.ones((K, T), dtype=torch.bool, device=dev)
            if left != -1:
                mask &= tt >= pos - left
            if right != -1:
                mask &= tt <= pos + right
            mask = mask.repeat(G, 1)  # [G*K, T]: the same keys for each query head of a KV head
            counters.record("torch.sdpa")
            # All KV heads at once, or one at a time past SDPA_GROUPED_ELEMENTS (the same values: each head's
            # attention is computed on its own).
            groups = [(0, Hkv)] if c.num_q_heads * T * D <= SDPA_GROUPED_ELEMENTS else [(h, h + 1) for h in range(Hkv)]
            o_parts, lse_parts = [], []
            for h0, h1 in groups:
                qh, kh, vh = q[h0:h1], k[h0:h1], v[h0:h1]
                o_parts.append(F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=c.softmax_scale))
                if with_lse:
                    s = torch.matmul(qh.float(), kh.float().transpose(-1, -2)) * c.softmax_scale
                    lse_parts.append(torch.logsumexp(s.masked_fill(~mask, float("-inf")), dim=-1))
                    del s
            o = torch.cat(o_parts).view(Hkv, G, K, D).reshape(c.num_q_heads, K, D)
            outs.append(o.transpose(0, 1))
            if with_lse:
                lses.append(torch.cat(lse_parts).view(c.num_q_heads, K).transpose(0, 1))
        return torch.stack(outs), (torch.stack(lses) if with_lse else None)


class Context(TorchLoweringBase):
    """Context FMHA: one batched paged prefill, K queries per request over `L+K` keys, `causal=False`,
    an end-aligned left window only (exact iff `K <= W`, i.e. `K - 1 <= right`)."""

    name = "context"
    lse_base = BASE_2

    def supports(self, case: Case) -> str | None:
        return context_window_reason(case)

    def expected_calls(self, case: Case) -> dict[str, int]:
        return {**_append_calls(case), "torch.paged_prefill": 1}

    def run(self, inputs: Inputs) -> LoweringResult:
        c = inputs.case
        ensure_block_in_pool(inputs)
        counters.record("torch.paged_prefill", rows=c.batch_size * c.block_size)
        kv_lens = [L + c.block_size for L in inputs.context_lens_host]
        out, lse2 = paged.paged_attention(inputs.q, inputs.k_pool, inputs.v_pool, inputs.page_table, kv_lens,
                                           layout=c.layout, page_size=c.page_size, scale=c.softmax_scale,
                                           window_left=c.window[0], causal=False, k_scale=c.k_scale, v_scale=c.v_scale)
        return LoweringResult(out=out, lse=lse2)


def decode_rows_attention(inputs: Inputs, *, threshold: int = DECODE_ROWS_MAX_BATCH):
    """Seed 002's dispatch: `B*K` decode rows when `B <= threshold`, else the context form."""
    c = inputs.case
    ensure_block_in_pool(inputs)
    B, K, Hq, D = inputs.q.shape
    kv_lens = [L + K for L in inputs.context_lens_host]
    if B <= threshold:
        rows = B * K
        counters.record("torch.paged_decode", rows=rows)
        q_rows = inputs.q.reshape(rows, 1, Hq, D)
        table = inputs.page_table.repeat_interleave(K, dim=0)
        lens = [n for n in kv_lens for _ in range(K)]
        out, lse2 = paged.paged_attention(q_rows, inputs.k_pool, inputs.v_pool, table, lens, layout=c.layout,
                                           page_size=c.page_size, scale=c.softmax_scale,
                                           k_scale=c.k_scale, v_scale=c.v_scale)
        return out.view(B, K, Hq, D), lse2.view(B, K, Hq)
    counters.record("torch.paged_prefill", rows=B * K)
    return paged.paged_attention(inputs.q, inputs.k_pool, inputs.v_pool, inputs.page_table, kv_lens,
                                  layout=c.layout, page_size=c.page_size, scale=c.softmax_scale,
                                  k_scale=c.k_scale, v_scale=c.v_scale)


class DecodeRows(TorchLoweringBase):
    """Decode rows (seed 002): exact for non-causal unwindowed layers only."""

    name = "decode_rows"
    lse_base = BASE_2
    threshold = DECODE_ROWS_MAX_BATCH

    def supports(self, case: Case) -> str | None:
        return decode_rows_window_reason(case)

    def dispatch_boundaries(self) -> dict[str, tuple[int, ...]]:
        """Decode rows up to B = threshold, the context form from threshold + 1: both drawn first."""
        return {"batch_size": (self.threshold,)}

    def expected_calls(self, case: Case) -> dict[str, int]:
        kernel = "torch.paged_decode" if case.batch_size <= self.threshold else "torch.paged_prefill"
        return {**_append_calls(case), kernel: 1}

    def run(self, inputs: Inputs) -> LoweringResult:
        out, lse2 = decode_rows_attention(inputs, threshold=self.threshold)
        return LoweringResult(out=out, lse=lse2)


def causal_decode_part_a(inputs: Inputs):
    """Part A: row `(b, i)` with `seq_len = L_b + i + 1` and `window_left = left` (each query anchored at
    its own position). Returns `out [B, K, Hq, D]` and base-2 `lse [B, K, Hq]`."""
    c = inputs.case
    B, K, Hq, D = inputs.q.shape
    ensure_block_in_pool(inputs)
    counters.record("torch.paged_decode", rows=B * K)
    table = inputs.page_table.repeat_interleave(K, dim=0)
    lens = [L + i + 1 for L in inputs.context_lens_host for i in range(K)]
    out, lse2 = paged.paged_attention(inputs.q.reshape(B * K, 1, Hq, D), inputs.k_pool, inputs.v_pool, table, lens,
                                       layout=c.layout, page_size=c.page_size, scale=c.softmax_scale,
                                       window_left=c.window[0], k_scale=c.k_scale, v_scale=c.v_scale)
    return out.view(B, K, Hq, D), lse2.view(B, K, Hq)


@dataclass
class WindowedMerge(TorchLoweringBase):
    """Non-causal windowed = causal windowed decode + merge of the later block keys (seed 000).

    No merge at all where no block key follows a query (`K == 1` or `right == 0`): the output is part
    A exactly. The merge form is selectable: `eager`, `compiled`, `triton`.
    """

    form: str = "eager"
    lse_base: float = BASE_2

    def __post_init__(self) -> None:
        if self.form not in MERGE_FORMS:
            raise ValueError(f"form: one of {sorted(MERGE_FORMS)}, got {self.form!r}")
        self.name = f"windowed_merge[{self.form}]"
        # compiled: one static graph, then one with a symbolic batch (automatic dynamic shapes).
        self.max_compiles = {"compiled": 2, "triton": 1}.get(self.form)

    def available(self, device: str) -> tuple[bool, str]:
        ok, why = super().available(device)
        if not ok or self.form != "triton":
            return ok, why
        from lowerings._triton_env import triton_available
        return triton_available(device)

    def case_limits(self, device: str):
        """The Triton merge runs interpreted on a CPU; torch.compile traces once per shape family."""
        from strategies import Limits
        if device == "cuda":
            return Limits(max_context=2048)
        if self.form == "triton":
            return Limits(max_batch=4, max_context=140, max_kv_heads=2, max_group=4, head_dims=(64,),
                          max_production_context=0)
        if self.form == "compiled":
            return Limits(max_batch=33, max_context=200, max_kv_heads=2, max_group=4, head_dims=(64,),
                          max_production_context=CPU_PRODUCTION_CONTEXT)
        return super().case_limits(device)

    def merge_calls(self, case: Case) -> dict[str, int]:
        return {"eager": {"torch.merge_eager": 1}, "compiled": {"torch.compile[merge_unrolled]": 1},
                "triton": {"triton.merge_future_block_keys": 1}}[self.form]

    def expected_calls(self, case: Case) -> dict[str, int]:
        calls = {**_append_calls(case), "torch.paged_decode": 1}
        if merges_future_block_keys(case.block_size, case.window[1]):
            calls.update(self.merge_calls(case))
        return calls

    def run(self, inputs: Inputs) -> LoweringResult:
        c = inputs.case
        left, right = c.window
        o_a, lse_a = causal_decode_part_a(inputs)
        part_a = Partial(out=o_a, lse=lse_a, lse_base=BASE_2, window=(left, 0))
        if not merges_future_block_keys(c.block_size, right):
            return LoweringResult(out=o_a, lse=lse_a, partials={"A": part_a})
        partials = {"A": part_a}
        if self.form == "eager":
            out, lse, o_b, lse_b = merge_eager(inputs.q, inputs.k_block, inputs.v_block, o_a, lse_a,
                                               scale=c.softmax_scale, right=right, lse_a_base=BASE_2, return_part_b=True)
            partials["B"] = Partial(out=o_b, lse=lse_b, lse_base=BASE_E, window=(-1, -1), future_block_keys_right=right)
        else:
            out, lse = MERGE_FORMS[self.form](inputs.q, inputs.k_block, inputs.v_block, o_a, lse_a,
                                              scale=c.softmax_scale, right=right, lse_a_base=BASE_2)
        return LoweringResult(out=out, lse=lse, partials=partials)
