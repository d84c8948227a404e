"""The production-scale mutants (issue 13): bugs past a few thousand keys, in positions held in a narrow
dtype, in the dispatch, in fp8 scales; caught by the default `ci` profile's draws and boundary cases
(`strategies.check_cases`, tests/parity/test_production_mutants.py). Part of the catalogue of
`tests.mutants` (`PRODUCTION_MUTANTS`).

Not a test module (no `test_` prefix): import it as `tests.production_mutants`.
"""

from __future__ import annotations

import torch

from lowerings import counters, paged
from lowerings.protocol import LoweringResult
from lowerings.torch_emulation import DecodeRows, decode_rows_attention, ensure_block_in_pool
from oracle.inputs import Inputs
from tests.mutant_bases import ContextMutant, WindowedMutant, context_read


def paged_attention_hooked(q, k_pool, v_pool, page_table, kv_lens, *, layout, page_size, scale, window_left=-1,
                            causal=False, k_scale=1.0, v_scale=1.0, first_key=None, read_lens=None, pos_dtype=None,
                            skip_key=None):
    """`lowerings.paged.paged_attention`, copied, with four hooks (None: the original, bit for bit, which
    test_mutants checks): row `n` attends only to keys `t >= first_key[n]`; it reads `read_lens[n]` keys
    through its page table (the valid ones; its queries stay at the end of `kv_lens[n]`); the mask compares
    positions held in `pos_dtype`; row `n` never attends to key `skip_key[n]` (-1: none)."""
    N, M, Hq, D = q.shape
    dev = q.device
    if N == 0:
        return q.new_zeros(q.shape), torch.zeros((0, M, Hq), device=dev)
    Hkv = k_pool.shape[2] if layout == "NHD" else k_pool.shape[1]
    lens = torch.tensor(kv_lens, device=dev, dtype=torch.long)
    reads = torch.tensor(read_lens if read_lens is not None else kv_lens, device=dev, dtype=torch.long)
    firsts = torch.tensor(first_key, device=dev, dtype=torch.long) if first_key is not None else None
    skips = torch.tensor(skip_key, device=dev, dtype=torch.long) if skip_key is not None else None
    T = max(int(reads.max()), 1)
    rows_per = max(1, paged.MAX_GATHER_ELEMS // max(1, T * Hkv * D))
    outs, lses = [], []
    for n0 in range(0, N, rows_per):
        n1 = min(N, n0 + rows_per)
        t = torch.arange(T, device=dev).view(1, -1)
        ln = lens[n0:n1].view(-1, 1)
        valid = t < reads[n0:n1].view(-1, 1)
        col = torch.clamp(t // page_size, max=page_table.shape[1] - 1).expand(n1 - n0, -1)
        pid = torch.gather(page_table[n0:n1].to(torch.long), 1, col)
        pid = torch.where(valid, pid, torch.zeros_like(pid))
        slot = (t % page_size).expand(n1 - n0, -1)
        k = paged.read_pool(k_pool, pid, slot, layout, k_scale, q.dtype)
        v = paged.read_pool(v_pool, pid, slot, layout, v_scale, q.dtype)
        z = torch.zeros((), dtype=q.dtype, device=dev)
        k = torch.where(valid.view(n1 - n0, T, 1, 1), k, z)
        v = torch.where(valid.view(n1 - n0, T, 1, 1), v, z)
        pos = ln - M + torch.arange(M, device=dev).view(1, -1)  # [n, M]
        tt, pp = (t, pos) if pos_dtype is None else (t.to(pos_dtype), pos.to(pos_dtype))
        mask = valid.view(-1, 1, T) & torch.ones((1, M, 1), dtype=torch.bool, device=dev)
        if firsts is not None:
            mask = mask & (t.view(1, 1, T) >= firsts[n0:n1].view(-1, 1, 1))
        if skips is not None:
            mask = mask & (t.view(1, 1, T) != skips[n0:n1].view(-1, 1, 1))
        if window_left >= 0:
            mask = mask & (tt.view(1, 1, T) >= (pp - window_left).unsqueeze(-1))
        if causal:
            mask = mask & (tt.view(1, 1, T) <= pp.unsqueeze(-1))
        o, lse = paged.attend(q[n0:n1], k, v, mask, scale)
        outs.append(o)
        lses.append(lse)
    return torch.cat(outs), torch.cat(lses)


def context_read_hooked(inputs: Inputs, **hooks):
    """`context_read` (Context's paged prefill read) through `paged_attention_hooked`."""
    c = inputs.case
    return paged_attention_hooked(
        inputs.q, inputs.k_pool, inputs.v_pool, inputs.page_table, [L + c.block_size for L in inputs.context_lens_host],
        layout=c.layout, page_size=c.page_size, scale=c.softmax_scale, window_left=c.window[0], causal=False,
        k_scale=c.k_scale, v_scale=c.v_scale, **hooks)


SPLIT_KEYS = 2048  # keys per split of the split-KV mutants
WORKSPACE_SPLITS = 2  # split partials the fixed workspace holds


class SplitWorkspaceWraps(ContextMutant):
    """BUGS 3: a fixed-size split-KV workspace: room for 2 splits of 2048 keys (the longest context it was
    tested on), split `s` written at slot `s % 2`. Past 4096 keys a third split overwrites the first, and
    the merge sees keys from 2048 on only. Exact up to 4096 keys: shrinks to `L + K = 4097`."""

    name = "mutant:split_workspace_wraps"
    bugs_row = 3

    def read(self, inputs):
        K = inputs.case.block_size
        first = []
        for L in inputs.context_lens_host:
            splits = -(-(L + K) // SPLIT_KEYS)
            first.append(max(0, splits - WORKSPACE_SPLITS) * SPLIT_KEYS)  # BUG: the overwritten splits' keys
        return context_read_hooked(inputs, first_key=first)


class LastSplitUnclamped(ContextMutant):
    """BUGS 9/10: split-KV past 4096 keys (chunks of 4096); the last chunk's end is not clamped to the
    row's length: it reads on through the page table to the chunk's end (the tail of the last page,
    then the last page again). One chunk (up to 4096 keys) is exact: shrinks to `L + K = 4097`."""

    name = "mutant:last_split_unclamped"
    bugs_row = "9/10"

    def read(self, inputs):
        K = inputs.case.block_size
        chunk = 2 * SPLIT_KEYS
        reads = [-(-(L + K) // chunk) * chunk if L + K > chunk else L + K for L in inputs.context_lens_host]  # BUG
        return context_read_hooked(inputs, read_lens=reads)


class PositionsNarrow(WindowedMutant):
    """Part A's window mask compares positions held in `pos_dtype` (a float type: exact only below
    2 ** (significand bits + 1))."""

    pos_dtype = torch.float32

    def part_a(self, inputs):
        c = inputs.case
        B, K, Hq, D = inputs.q.shape
        ensure_block_in_pool(inputs)
        counters.record("torch.paged_decode", rows=B * K)
        table = inputs.page_table.repeat_interleave(K, dim=0)
        lens = [L + i + 1 for L in inputs.context_lens_host for i in range(K)]
        out, lse2 = paged_attention_hooked(inputs.q.reshape(B * K, 1, Hq, D), inputs.k_pool, inputs.v_pool, table,
                                            lens, layout=c.layout, page_size=c.page_size, scale=c.softmax_scale,
                                            window_left=c.window[0], k_scale=c.k_scale, v_scale=c.v_scale,
                                            pos_dtype=self.pos_dtype)
        return out.view(B, K, Hq, D), lse2.view(B, K, Hq)


class PositionsFp16(PositionsNarrow):
    """BUGS 4: part A's sliding-window mask compares positions in fp16, exact only up to 2048: from
    position 2049 on (rounded to 2048) a window edge moves by a key. Shrinks to `L = 2049`."""

    mutant_name = "mutant:positions_fp16"
    bugs_row = 4
    pos_dtype = torch.float16  # BUG


class PositionsBf16(PositionsNarrow):
    """BUGS 4: part A's sliding-window mask compares positions in bf16, exact only up to 256: from position
    257 on a window edge moves. Shrinks to `L = 257`."""

    mutant_name = "mutant:positions_bf16"
    bugs_row = 4
    pos_dtype = torch.bfloat16  # BUG


class DispatchThresholdLow(DecodeRows):
    """BUGS 17: the dispatch tests `B < 32` while the declared threshold is `B <= 32`: B = 32 silently runs
    the context form (right numbers, the wrong kernel)."""

    name = "mutant:dispatch_threshold_low"
    bugs_row = 17

    def run(self, inputs):
        out, lse2 = decode_rows_attention(inputs, threshold=self.threshold - 1)  # BUG
        return LoweringResult(out=out, lse=lse2)


class Fp8ScalesSwapped(ContextMutant):
    """BUGS 14: the fp8 pool's dequant scales passed in the wrong order (`k_scale` for V, `v_scale` for K):
    right whenever `k_scale == v_scale`, wrong otherwise."""

    name = "mutant:fp8_scales_swapped"
    bugs_row = 14

    def read(self, inputs):
        c = inputs.case
        return context_read(inputs, k_scale=c.v_scale, v_scale=c.k_scale)  # BUG


