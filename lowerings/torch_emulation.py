"""The production decompositions of docs/semantics.md section 4, in torch, on any device.

- `sdpa`: torch SDPA in the working dtype over each request's gathered pages (the former yardstick;
  now what `tests/parity/test_yardstick.py` measures the default yardstick against).
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
from lowerings.limits import Limits
from lowerings.merges import MERGE_FORMS, merge_eager, merges_future_block_keys
from lowerings.protocol import BASE_2, BASE_E, LoweringResult, Partial
from oracle.rules import DECODE_ROWS_MAX_BATCH, context_window_reason, decode_rows_window_reason
from oracle.case import Case
from oracle.inputs import Inputs
from oracle import footprint

SDPA_GROUPED_ELEMENTS = 1 << 26  # past this many K elements (Hq x T x D), sdpa runs one KV head's group at a time
CPU_PRODUCTION_CONTEXT = 8192  # the torch lowerings' longest drawn context on a CPU (strategies._production)


class TorchLoweringBase:
    devices: tuple[str, ...] = ("cpu", "cuda")
    lse_base: float = BASE_E
    deterministic: bool = True
    max_compiles: int | None = None
    name = "torch-base"
    supports_by_shape = True  # supports() reads shape fields only (lowerings.protocol.OptionalHooks)

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
    """torch SDPA in the working dtype over gathered pages, requests batched (a yardstick: `parity.engine.yardstick`).

    It returns an LSE of its own (the fp32 scores over the same gathered keys and mask, `with_lse`), judged as
    any lowering's: a check of its gather and mask the output can hide. SDPA itself returns none: the form a
    user plugs in, output only (`lse_base = NO_LSE`), is `examples/plugin_output_only.py`."""

    name = "sdpa"
    lse_base = BASE_E
    # As the yardstick it runs on a case's inputs, not a copy (`parity.engine.case_run.run_yardstick`): it only
    # reads them (gathers, concatenates, attends), and its own untouched-input check says so whenever it is
    # checked as a lowering.
    reads_inputs_only = True

    def expected_calls(self, case: Case) -> dict[str, int]:
        return {"torch.sdpa": len(sdpa_batches(case))}

    def run(self, inputs: Inputs) -> LoweringResult:
        out, lse = self._attend(inputs, with_lse=True)
        return LoweringResult(out=out, lse=lse)

    def run_output(self, inputs: Inputs) -> torch.Tensor:
        """The output alone `[B, K, Hq, D]`, the same bits as `run(inputs).out`: what the yardstick needs
        (`parity.engine.case_run.run_yardstick`), without the fp32 score matrix the LSE costs (at production scale
        the LSE was 40% of the yardstick's time)."""
        return self._attend(inputs, with_lse=False)[0]

    def _attend(self, inputs: Inputs, *, with_lse: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One SDPA call per batch of requests (`sdpa_batches`) over their keys gathered from the pages,
        `[n, Hkv, T, D]` (T: the batch's longest `L+K`; a shorter request's keys past its own `L+K` are
        zeros its mask hides), each key read once. GQA by grouping the queries, not repeating the keys:
        each KV head attends with its `G` query heads' `G*K` rows at once (`[n, Hkv, G*K, D]`), so no
        `G`-fold copy of K/V is made or read. Every row is computed on its own either way: a batch of
        requests is the per-request computation with masked keys added, which add exact zeros; torch's
        kernels may block a batch of calls differently, so an element can differ from the request alone by
        one rounding (tests/lowerings/test_protocol.py). Batched because a case is host-bound on a GPU: one
        request at a time cost about 25 launches per request (B up to 64 in the `gpu` profile; batched, the
        yardstick phase took a third of the time, docs/gpu/2026-12-02-h200-session12.md)."""
        c = inputs.case
        B, K, Hq, D = inputs.q.shape
        out = torch.empty((B, K, Hq, D), dtype=inputs.q.dtype, device=inputs.device)
        lse = torch.empty((B, K, Hq), dtype=torch.float32, device=inputs.device) if with_lse else None
        batches = sdpa_batches(c)
        metas = batch_index_vectors(inputs, batches)
        for rows, meta in zip(batches, metas):
            counters.record("torch.sdpa")
            o, l = sdpa_batch(inputs, rows, with_lse=with_lse, meta=meta)
            if rows == list(range(B)):  # the whole batch in order: no scatter
                out.copy_(o)
                if with_lse:
                    lse.copy_(l)
                continue
            at = meta[-len(rows):]  # the batch's requests
            out.index_copy_(0, at, o)
            if with_lse:
                lse.index_copy_(0, at, l)
        return out, lse


SDPA_BATCH_KEYS = footprint.SDPA_BATCH_KEYS  # a batch of the yardstick: at most max(this, the longest L+K) padded keys


def sdpa_batches(case: Case) -> list[list[int]]:
    """The yardstick's batches of requests: by decreasing `L+K` (ties in batch order), each batch of `n`
    requests padded to its first's `T = L+K`, with `n * T <= max(SDPA_BATCH_KEYS, the case's longest L+K)`:
    the padded keys of a batch never exceed the longest request's alone by more than `SDPA_BATCH_KEYS`
    (`oracle.footprint.yardstick_bytes`), and a case of short requests is one batch."""
    K = case.block_size
    T = [L + K for L in case.context_lens]
    budget = max(SDPA_BATCH_KEYS, max(T, default=K))
    batches: list[list[int]] = []
    for b in sorted(range(len(T)), key=lambda b: (-T[b], b)):
        if batches and (len(batches[-1]) + 1) * T[batches[-1][0]] <= budget:
            batches[-1].append(b)
        else:
            batches.append([b])
    return batches


def batch_index_vectors(inputs: Inputs, batches: list[list[int]]) -> list[torch.Tensor]:
    """Each batch's small index vectors on the device, `[n + 2*n*K + n]` int64: the requests' `L` (n), the block's
    request and position per block key (`bi`, `bt`: n*K each) and the requests (n), all batches in ONE
    host-to-device copy. A copy from pageable host memory waits for the work queued before it, so one per
    batch kept the host from running ahead of the device (a case of 59 long requests is 59 batches)."""
    K = inputs.case.block_size
    flat: list[int] = []
    sizes = []
    for rows in batches:
        n = len(rows)
        lens = [inputs.context_lens_host[b] for b in rows]
        flat += lens
        flat += [i for i in range(n) for _ in range(K)]
        flat += [L_b + j for L_b in lens for j in range(K)]
        flat += rows
        sizes.append(2 * n + 2 * n * K)
    return list(torch.tensor(flat).to(inputs.device, non_blocking=True).split(sizes))


def sdpa_batch(inputs: Inputs, rows: list[int], *, with_lse: bool, meta: torch.Tensor | None = None):
    """SDPA over requests `rows` (decreasing `L+K`): out `[n, K, Hq, D]`, LSE `[n, K, Hq]` fp32 base e or None.
    The keys are gathered straight into `[n, Hkv, T, D]`; each (request, KV head) is one item of a 3-D SDPA
    call `[n*Hkv, G*K, D]`, as each KV head of one request was before batching (the same torch kernel).

    SDPA's math backend (the one 3-D inputs take: its fused kernels need 4-D) computes a working-dtype call in
    fp32: it upcasts q, k and v, turns a boolean mask into an additive one, and casts the output back (and
    its probabilities, which it then drops). Here the call gets what it would compute: q, k, v upcast, the
    additive mask (0 / -inf) built once per batch, the output cast to the working dtype after it; the same
    values go through the same arithmetic, so the output is the same bits
    (`tests/lowerings/test_yardstick_calls.py` against the form that passed working-dtype tensors), in fewer
    operations and less memory traffic: on a GPU the yardstick is launch-bound (docs/performance.md, "Where a
    case's time goes")."""
    c = inputs.case
    ps, K, D, G, Hkv = c.page_size, c.block_size, c.head_dim, c.group_size, c.num_kv_heads
    dev, dt = inputs.device, inputs.q.dtype
    n = len(rows)
    lens_host = [inputs.context_lens_host[b] for b in rows]
    T = lens_host[0] + K
    whole = rows == list(range(c.batch_size))
    # The batch's small index vectors (`meta`, from `batch_index_vectors`): L [n], the block's request and
    # position per key (bi, bt: [n*K]) and its requests (idx [n], for a batch other than the whole case in order).
    if meta is None:  # `batch_index_vectors` for this batch alone
        meta = batch_index_vectors(inputs, [rows])[0]
    L, bi, bt = meta[:n].view(n, 1), meta[n:n + n * K], meta[n + n * K:n + 2 * n * K]
    pick = (lambda x: x) if whole else (lambda x: x.index_select(0, meta[n + 2 * n * K:]))
    t = torch.arange(T, device=dev).view(1, T)
    ctx = t < L                                                      # [n, T]: a context key of its row
    table = pick(inputs.page_table).to(torch.long)
    pid = torch.where(ctx, torch.gather(table, 1, (t // ps).clamp(max=table.shape[1] - 1).expand(n, T)), 0)
    pid, slot, h = pid.view(n, 1, T), (t % ps).view(1, 1, T), torch.arange(Hkv, device=dev).view(1, Hkv, 1)
    # The block's keys sit right after each row's context, at L_b .. L_b+K-1; keys past L_b+K are padding.
    pad = ~(t < L + K)
    kv = []
    for pool, blk, sc in ((inputs.k_pool, inputs.k_block, c.k_scale), (inputs.v_pool, inputs.v_block, c.v_scale)):
        x = pool[pid, slot, h] if c.layout == "NHD" else pool[pid, h, slot]  # [n, Hkv, T, D]
        x = (x.float() * sc).to(dt) if x.dtype == paged.FP8 else x
        x[bi, :, bt] = pick(blk).reshape(n * K, Hkv, D)
        x.masked_fill_(pad.view(n, 1, T, 1), 0)  # padding: zeros, never a canary (NaN * 0 is NaN)
        kv.append(x)
    k, v = kv
    # query head h*G + g, row i -> row g*K + i; upcast as SDPA's math backend would (the same values)
    q = pick(inputs.q).transpose(1, 2).to(torch.float32, memory_format=torch.contiguous_format).view(n, Hkv, G * K, D)
    pos = L.view(n, 1, 1) + torch.arange(K, device=dev).view(1, K, 1)  # [n, K, 1]
    tt = t.view(1, 1, T)
    mask = (tt < L.view(n, 1, 1) + K).expand(n, K, T)
    left, right = c.window
    if left != -1:
        mask = mask & (tt >= pos - left)
    if right != -1:
        mask = mask & (tt <= pos + right)
    # SDPA's own conversion of a boolean mask (0 where visible, -inf elsewhere), once for every head:
    # [n, G*K, T], the same keys for each query head of a KV head.
    add_mask = torch.where(mask, 0.0, float("-inf")).repeat(1, G, 1)
    # All KV heads at once, or one at a time past SDPA_GROUPED_ELEMENTS (the same values: each head's
    # attention is computed on its own).
    heads = [(0, Hkv)] if n * c.num_q_heads * T * D <= SDPA_GROUPED_ELEMENTS else [(h, h + 1) for h in range(Hkv)]
    o_parts, lse_parts = [], []
    for h0, h1 in heads:
        m = h1 - h0
        qh = q[:, h0:h1].reshape(n * m, G * K, D)
        kh, vh = (x[:, h0:h1].to(torch.float32, memory_format=torch.contiguous_format).view(n * m, T, D) for x in (k, v))
        if m == 1 or n == 1:  # broadcasts over the heads of one request
            mh = add_mask
        else:
            mh = add_mask.unsqueeze(1).expand(n, m, G * K, T).reshape(n * m, G * K, T)
        o_parts.append(F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mh, scale=c.softmax_scale)
                       .to(dt).view(n, m, G * K, D))
        if with_lse:
            s = torch.matmul(qh, kh.transpose(-1, -2)) * c.softmax_scale
            seen = (mh == 0).expand(n * m, G * K, T)
            lse_parts.append(torch.logsumexp(s.masked_fill(~seen, float("-inf")), dim=-1).view(n, m, G * K))
            del s
    o = torch.cat(o_parts, dim=1).view(n, Hkv, G, K, D).reshape(n, c.num_q_heads, K, D).transpose(1, 2)
    lse = torch.cat(lse_parts, dim=1).view(n, c.num_q_heads, K).transpose(1, 2) if with_lse else None
    return o, lse


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
