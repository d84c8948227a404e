"""Mutants for the hardening checks: lowerings that read, write or depend on memory they should not, or
that kill or hang their process. `tests/parity/test_hardening.py` asserts each is caught with the right
message; the crashing ones only ever run in an isolated worker (`parity.exec.isolation`).

Not a test module (no `test_` prefix): import it as `tests.hardening_mutants`. Nothing registers on
import; `register_all()` does (the worker loads `tests/hardening_plugin.py`, which calls it), so the
parent's registry stays as it was.
"""

from __future__ import annotations

import hashlib
import os
import signal
import tempfile
import time

import torch

from lowerings import counters, paged
from lowerings.protocol import LoweringResult
from lowerings.torch_emulation import Context, Sdpa
from oracle.inputs import Inputs


def _given_or_new(inputs: Inputs, like_out: torch.Tensor, like_lse: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    out = inputs.out if inputs.out is not None else torch.empty_like(like_out)
    lse = inputs.lse_out if inputs.lse_out is not None else torch.empty_like(like_lse, dtype=torch.float32)
    return out, lse


class SdpaIntoGiven(Sdpa):
    """Correct: SDPA, its result copied into the given `out`/`lse_out` (no false alarm expected)."""

    name = "hardening:sdpa_into_given"
    writes_given_output = True

    def run(self, inputs: Inputs) -> LoweringResult:
        res = super().run(inputs)
        out, lse = _given_or_new(inputs, res.out, res.lse)
        out.copy_(res.out)
        lse.copy_(res.lse)
        return LoweringResult(out=out, lse=lse)


class ReadsPageTail(Sdpa):
    """Reads every slot of each request's last page past its keys (the tail no request owns), and hides the
    NaN canary there: NaN scores become -inf, NaN values 0. With NaN canaries the output is right; with
    large finite ones the tail's keys dominate the softmax."""

    name = "hardening:reads_page_tail"

    def expected_calls(self, case):  # one attention per request (the yardstick batches them)
        return {"torch.sdpa": case.batch_size}

    def run(self, inputs: Inputs) -> LoweringResult:
        c = inputs.case
        ps, K, G = c.page_size, c.block_size, c.group_size
        outs, lses = [], []
        for b, L in enumerate(inputs.context_lens_host):
            counters.record("torch.sdpa")
            start = L + (K if c.block_storage == "appended" else 0)
            t_ctx = torch.arange(L, device=inputs.device)
            t_tail = torch.arange(start, len(c.pages[b]) * ps, device=inputs.device)
            keys, vals = [], []
            for t in (t_ctx, t_tail):
                pid = inputs.page_table[b].to(torch.long)[t // ps]
                keys.append(paged.read_pool(inputs.k_pool, pid, t % ps, c.layout, c.k_scale, inputs.q.dtype))
                vals.append(paged.read_pool(inputs.v_pool, pid, t % ps, c.layout, c.v_scale, inputs.q.dtype))
            k = torch.cat([keys[0], inputs.k_block[b], keys[1]]).float().transpose(0, 1).repeat_interleave(G, 0)
            v = torch.cat([vals[0], inputs.v_block[b], vals[1]]).float().transpose(0, 1).repeat_interleave(G, 0)
            q = inputs.q[b].float().transpose(0, 1)  # [Hq, K, D]
            n_tail = t_tail.numel()
            pos = L + torch.arange(K, device=inputs.device).view(-1, 1)
            tt = torch.arange(L + K, device=inputs.device).view(1, -1)
            left, right = c.window
            mask = torch.ones((K, L + K), dtype=torch.bool, device=inputs.device)
            if left != -1:
                mask &= tt >= pos - left
            if right != -1:
                mask &= tt <= pos + right
            mask = torch.cat([mask, torch.ones((K, n_tail), dtype=torch.bool, device=inputs.device)], dim=1)
            s = (q @ k.transpose(-1, -2)) * c.softmax_scale
            s = s.nan_to_num(nan=float("-inf")).masked_fill(~mask, float("-inf"))
            lse = torch.logsumexp(s, dim=-1)
            p = torch.softmax(s, dim=-1).nan_to_num(0.0)
            o = p @ v.nan_to_num(0.0)
            outs.append(o.transpose(0, 1).to(inputs.q.dtype))
            lses.append(lse.transpose(0, 1))
        return LoweringResult(out=torch.stack(outs), lse=torch.stack(lses))


class LastQueryUnwritten(SdpaIntoGiven):
    """Copies its result into the given `out` for queries 0..K-2 only: query K-1 is never stored."""

    name = "hardening:last_query_unwritten"

    def run(self, inputs: Inputs) -> LoweringResult:
        res = Sdpa.run(self, inputs)
        out, lse = _given_or_new(inputs, res.out, res.lse)
        out[:, :-1].copy_(res.out[:, :-1])
        lse.copy_(res.lse)
        return LoweringResult(out=out, lse=lse)


class WritesPastEnd(SdpaIntoGiven):
    """Writes its result, then one element past the end of the given `out` (a tail loop's off-by-one)."""

    name = "hardening:writes_past_end"

    def run(self, inputs: Inputs) -> LoweringResult:
        res = super().run(inputs)
        flat = res.out.as_strided((res.out.numel() + 1,), (1,))
        flat[-1] = 0.0
        return res


class ReturnsNewTensor(SdpaIntoGiven):
    """Declares `writes_given_output` but returns a fresh tensor and leaves the given buffers alone."""

    name = "hardening:returns_new_tensor"

    def run(self, inputs: Inputs) -> LoweringResult:
        return Sdpa.run(self, inputs)


class AccumulatesIntoGiven(SdpaIntoGiven):
    """Adds its result into the given `out` as if the caller had zeroed it (`out += o`)."""

    name = "hardening:accumulates_into_given"

    def run(self, inputs: Inputs) -> LoweringResult:
        res = Sdpa.run(self, inputs)
        out, lse = _given_or_new(inputs, res.out, res.lse)
        out.add_(res.out)
        lse.copy_(res.lse)
        return LoweringResult(out=out, lse=lse)


class UninitializedAccumulator(Sdpa):
    """Accumulates the output into a buffer it never zeroes: allocated (zeroed) once per shape, then
    reused, so it holds the previous call's sums, as uninitialized workspace memory does after an
    earlier kernel. The first call of a shape is right; every later one adds to stale values.

    (Modelled this way rather than with `torch.empty`: what `torch.empty` returns on a CPU depends on
    the heap, so that version failed and then passed on hypothesis's replay, and was not shrunk, on
    one CI run in five.)"""

    name = "hardening:uninitialized_accumulator"
    _stale: dict = {}

    def run(self, inputs: Inputs) -> LoweringResult:
        res = super().run(inputs)
        key = (tuple(res.out.shape), str(res.out.device))
        acc = self._stale.get(key)
        if acc is None:
            acc = self._stale[key] = torch.zeros(res.out.shape, dtype=torch.float32, device=res.out.device)
        acc += res.out.float()
        return LoweringResult(out=acc.to(res.out.dtype), lse=res.lse)


class StaleRunningMax(Sdpa):
    """Seeds each row's running max from a workspace the previous call left behind (the kernel's
    `m = max(m_prev, s)` with `m_prev` read from a scratch slot it never initializes), and stores its row
    maxima there. Softmax is invariant to the offset, so every result is within tolerance; but the rounding
    follows the offset: a call after a different case (whose maxima exceed this one's) gives LSEs ~6e-8
    apart from a call after the same case, with output bits mostly unchanged. Only running the same
    inputs again shows it, and only the first call after another case differs. CPU and GPU alike."""

    name = "hardening:stale_running_max"
    ROWS = 1 << 14

    def __init__(self) -> None:
        super().__init__()
        # device -> fp32 [ROWS]: what this instance's previous calls left (-inf before the first). Per instance,
        # as a kernel's workspace is: a fresh mutant (`catalogue()`) starts clean whatever ran before it in the
        # process (a class-level dict made test_hardening's result depend on test_flakiness running first).
        self._workspace: dict = {}

    def expected_calls(self, case):  # one attention per request (the yardstick batches them)
        return {"torch.sdpa": case.batch_size}

    def run(self, inputs: Inputs) -> LoweringResult:
        c = inputs.case
        ps, K, G, Hq = c.page_size, c.block_size, c.group_size, c.num_q_heads
        dev = inputs.device
        ws = self._workspace.get(str(dev))
        if ws is None:
            ws = self._workspace[str(dev)] = torch.full((self.ROWS,), float("-inf"), dtype=torch.float32, device=dev)
        outs, lses = [], []
        for b, L in enumerate(inputs.context_lens_host):
            counters.record("torch.sdpa")
            t = torch.arange(L, device=dev)
            pid = inputs.page_table[b].to(torch.long)[t // ps]
            k_ctx = paged.read_pool(inputs.k_pool, pid, t % ps, c.layout, c.k_scale, inputs.q.dtype)
            v_ctx = paged.read_pool(inputs.v_pool, pid, t % ps, c.layout, c.v_scale, inputs.q.dtype)
            k = torch.cat([k_ctx, inputs.k_block[b]]).float().transpose(0, 1).repeat_interleave(G, 0)
            v = torch.cat([v_ctx, inputs.v_block[b]]).float().transpose(0, 1).repeat_interleave(G, 0)
            pos = L + torch.arange(K, device=dev).view(-1, 1)
            tt = torch.arange(L + K, device=dev).view(1, -1)
            left, right = c.window
            mask = torch.ones((K, L + K), dtype=torch.bool, device=dev)
            if left != -1:
                mask &= tt >= pos - left
            if right != -1:
                mask &= tt <= pos + right
            s = (inputs.q[b].float().transpose(0, 1) @ k.transpose(-1, -2)) * c.softmax_scale  # [Hq, K, T]
            s = s.masked_fill(~mask, float("-inf"))
            rows = (b * K * Hq + torch.arange(K * Hq, device=dev)) % self.ROWS  # row (i, h) of request b
            stale = ws[rows].view(K, Hq).transpose(0, 1)  # BUG: the previous call's maxima, never reset
            m_row = s.amax(-1)
            m = torch.maximum(m_row, stale)
            p = torch.exp(s - m[..., None])
            l = p.sum(-1)
            o = (p @ v) / l[..., None]
            lse = m + torch.log(l)
            ws[rows] = m_row.transpose(0, 1).reshape(-1)
            outs.append(o.transpose(0, 1).to(inputs.q.dtype))
            lses.append(lse.transpose(0, 1))
        return LoweringResult(out=torch.stack(outs), lse=torch.stack(lses))


class ReadsBeforeWritten(Sdpa):
    """A missing stream sync, modelled on a CPU: on one call in `every` the caller gets the output buffer
    before the work that fills it has run (it holds what the kernel's first step left: zeros, and -inf
    in the LSE). A per-instance call counter stands in for the timing, so a derandomized sweep replays the
    same way. Identical runs differ; the GPU version is `tests.gpu_mutants.ReturnsBeforeSideStream`."""

    name = "hardening:reads_before_written"
    every = 3

    def __init__(self) -> None:
        self.calls = 0

    def run(self, inputs: Inputs) -> LoweringResult:
        res = super().run(inputs)
        self.calls += 1
        if self.calls % self.every == 0:  # BUG: returned before the (asynchronous) work was done
            return LoweringResult(out=torch.zeros_like(res.out), lse=torch.full_like(res.lse, float("-inf")))
        return res


class MutatesQ(Sdpa):
    """Uses the last query row of `q` as scratch after reading it (zeroes it in place)."""

    name = "hardening:mutates_q"

    def run(self, inputs: Inputs) -> LoweringResult:
        res = super().run(inputs)
        inputs.q[:, -1].zero_()
        return res


class AppendSpills(Context):
    """Appends K+1 slots (an inclusive end): the extra, zeroed slot at position L+K lands on the tail of the
    request's last page, or on the next page of its table row (a spare one, or another request's)."""

    name = "hardening:append_spills"

    def run(self, inputs: Inputs) -> LoweringResult:
        c = inputs.case
        if c.block_storage == "dense":
            paged.append_paged_kv(inputs.k_pool, inputs.v_pool, inputs.page_table, list(inputs.context_lens_host),
                                   inputs.k_block, inputs.v_block, layout=c.layout, page_size=c.page_size,
                                   k_scale=c.k_scale, v_scale=c.v_scale)
            cols = inputs.page_table.shape[1]
            for b, L in enumerate(inputs.context_lens_host):
                t = L + c.block_size
                page = int(inputs.page_table[b, min(t // c.page_size, cols - 1)])
                for pool in (inputs.k_pool, inputs.v_pool):
                    (pool[page, t % c.page_size] if c.layout == "NHD" else pool[page, :, t % c.page_size]).zero_()
        counters.record("torch.paged_prefill", rows=c.batch_size * c.block_size)
        kv_lens = [L + c.block_size for L in inputs.context_lens_host]
        out, lse2 = paged.paged_attention(inputs.q, inputs.k_pool, inputs.v_pool, inputs.page_table, kv_lens,
                                           layout=c.layout, page_size=c.page_size, scale=c.softmax_scale,
                                           window_left=c.window[0], causal=False, k_scale=c.k_scale, v_scale=c.v_scale)
        return LoweringResult(out=out, lse=lse2)


# ---- process killers: isolated runs only ------------------------------------------------------------------

def _crosses_a_page(inputs: Inputs) -> bool:
    return max(inputs.context_lens_host) > inputs.case.page_size


class Segfault(Sdpa):
    """SIGSEGV when a request's context crosses a page boundary (a second-page address computed wrong)."""

    name = "hardening:segfault"

    def run(self, inputs: Inputs) -> LoweringResult:
        if _crosses_a_page(inputs):
            os.kill(os.getpid(), signal.SIGSEGV)
        return super().run(inputs)


_OOB_KERNEL = None


def _oob_kernel():
    """A Triton kernel that copies 16 floats from `x + off` (decorated on first use: the interpreter on CPU)."""
    global _OOB_KERNEL
    if _OOB_KERNEL is None:
        from lowerings import ensure_interpreter_on_cpu
        ensure_interpreter_on_cpu()
        import triton
        import triton.language as tl

        @triton.jit
        def _copy16(x_ptr, out_ptr, off):
            i = tl.arange(0, 16)
            tl.store(out_ptr + i, tl.load(x_ptr + off + i))

        _OOB_KERNEL = _copy16
    return _OOB_KERNEL


class TritonOutOfBounds(Sdpa):
    """A Triton kernel whose load offset is a byte count used as an element count past the first page:
    2**40 elements out of bounds, a real segfault under the interpreter (and an illegal address on a GPU)."""

    name = "hardening:triton_oob"

    def run(self, inputs: Inputs) -> LoweringResult:
        x = torch.zeros(16, device=inputs.device)
        scratch = torch.empty(16, device=inputs.device)
        off = (1 << 40) if _crosses_a_page(inputs) else 0
        _oob_kernel()[(1,)](x, scratch, off)
        return super().run(inputs)


CRASH_ONCE_MARKS = os.path.join(tempfile.gettempdir(), "dflash-parity-crash-once")


class CrashOnce(Sdpa):
    """SIGSEGV the first time it sees a case whose context crosses a page, fine on the replay (a crash that
    depends on timing or state): hypothesis calls it flaky."""

    name = "hardening:crash_once"

    def run(self, inputs: Inputs) -> LoweringResult:
        if _crosses_a_page(inputs):
            mark = os.path.join(CRASH_ONCE_MARKS, hashlib.sha1(inputs.case.to_json().encode()).hexdigest())
            if not os.path.exists(mark):
                os.makedirs(CRASH_ONCE_MARKS, exist_ok=True)
                open(mark, "w").close()
                os.kill(os.getpid(), signal.SIGSEGV)
        return super().run(inputs)


class Abort(Sdpa):
    """`os.abort()` (SIGABRT): a failed C++ assertion."""

    name = "hardening:abort"

    def run(self, inputs: Inputs) -> LoweringResult:
        os.abort()


class Exit3(Sdpa):
    """`os._exit(3)`: a library that exits the process on an error."""

    name = "hardening:exit3"

    def run(self, inputs: Inputs) -> LoweringResult:
        os._exit(3)


class Hang(Sdpa):
    """Never returns (a deadlock, a spin on a flag nobody sets)."""

    name = "hardening:hang"

    def run(self, inputs: Inputs) -> LoweringResult:
        time.sleep(3600)
        return super().run(inputs)


CLASSES = (SdpaIntoGiven, ReadsPageTail, LastQueryUnwritten, WritesPastEnd, ReturnsNewTensor, AccumulatesIntoGiven,
           UninitializedAccumulator, StaleRunningMax, ReadsBeforeWritten, MutatesQ, AppendSpills, Segfault, TritonOutOfBounds, CrashOnce, Abort, Exit3,
           Hang)


def catalogue() -> dict:
    """Fresh instances by name."""
    return {cls.name: cls() for cls in CLASSES}


def register_all() -> list[str]:
    from lowerings import register

    return [register(m, replace=True).name for m in catalogue().values()]
