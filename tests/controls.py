"""Controls: correct lowerings in the three computation orders a real kernel may use, which the default verdict must
never fail (issue 47: a golden oracle, and a yardstick that says what it measures).

- `control[fp32-one-rounding]`: fp32 inside (scores of the stored values, softmax, P.V), the output rounded once.
- `control[p-rounded]`: the order of flash kernels: keys and values as the working dtype holds them (an fp8 pool
  dequantized and rounded to it), tiles of keys with a running maximum, the weights `exp(s - m)` rounded to the
  working dtype before P.V, row sums of the unrounded weights, fp32 accumulators, one rounding of the output.
- `control[split-kv-4]`: the keys in four splits, each split's output rounded to the working dtype with its fp32
  LSE (flashinfer's `merge_state` inputs), merged by the LSEs in fp32, rounded once.

Each reads the pool through `oracle.reference.gather_keys` (what the controls vary is the arithmetic, not the
reading) and keys in chunks, so production cases fit. Natural-log LSE, fp32. `tests/controls_plugin.py` registers
them for `check --plugin` (the GPU record); `tests/parity/test_controls.py` checks them on CPU.
Not a test module (no `test_` prefix).
"""

from __future__ import annotations

import math

import torch

from lowerings import counters
from lowerings.protocol import BASE_E, LoweringResult
from lowerings.torch_emulation import TorchLoweringBase
from oracle.case import Case
from oracle.inputs import Inputs
from oracle.reference import gather_keys

ONLINE_CHUNK = 4096  # keys per step of the fp32 orders
FLASH_TILE = 256  # keys per tile of the flash order (real kernels tile 64-128; the rounding is the same kind)
SPLITS = 4


def _chunk_visible(case: Case, lens: torch.Tensor, t0: int, t1: int) -> torch.Tensor:
    """`[B, K, C]`: which of positions `t0..t1-1` each query sees (docs/semantics.md 2, the case's window)."""
    K = case.block_size
    left, right = case.window
    t = torch.arange(t0, t1, device=lens.device).view(1, 1, -1)
    p = lens.view(-1, 1, 1) + torch.arange(K, device=lens.device).view(1, -1, 1)
    vis = (t < lens.view(-1, 1, 1) + K) & (p >= 0)
    if left != -1:
        vis = vis & (t >= p - left)
    if right != -1:
        vis = vis & (t <= p + right)
    return vis


def online(inputs: Inputs, lo: int, hi: int, step: int, *, kv_rounded: bool = False, round_p: bool = False):
    """fp32 online softmax over key positions `[lo, hi)`: `(acc [B, Hkv, G, K, D], m, l [B, Hkv, G, K])`, acc
    unnormalized; `round_p`: the weights rounded to the working dtype before P.V (the row sums unrounded)."""
    c = inputs.case
    B, K, Hkv, G, D = c.batch_size, c.block_size, c.num_kv_heads, c.group_size, c.head_dim
    dev, f32 = inputs.q.device, torch.float32
    lens = inputs.context_lens.to(torch.long)
    q = inputs.q.to(f32).view(B, K, Hkv, G, D)
    m = torch.full((B, Hkv, G, K), -math.inf, dtype=f32, device=dev)
    l = torch.zeros((B, Hkv, G, K), dtype=f32, device=dev)
    acc = torch.zeros((B, Hkv, G, K, D), dtype=f32, device=dev)
    for t0 in range(lo, hi, step):
        t1 = min(hi, t0 + step)
        k, v, valid = gather_keys(inputs, t0, t1, lens, f32, kv_rounded=kv_rounded)
        vis = (_chunk_visible(c, lens, t0, t1) & valid.unsqueeze(1)).view(B, 1, 1, K, t1 - t0)
        s = torch.einsum("bkhgd,bchd->bhgkc", q.flip(-1), k.flip(-1)) * c.softmax_scale  # D summed last to first
        s = s.masked_fill(~vis, -math.inf)
        m_new = torch.maximum(m, s.amax(-1))
        m_safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
        alpha = torch.exp(m - m_safe)
        p = torch.exp(s - m_safe.unsqueeze(-1))
        l = l * alpha + p.sum(-1)
        pw = p.to(inputs.q.dtype).to(f32) if round_p else p
        acc = acc * alpha.unsqueeze(-1) + torch.einsum("bhgkc,bchd->bhgkd", pw, v)
        m = m_new
    return acc, m, l


def finish(inputs: Inputs, acc, m, l) -> tuple[torch.Tensor, torch.Tensor]:
    """`(out [B, K, Hq, D] fp32, lse [B, K, Hq] natural log)` of an online softmax's state; empty rows (0, -inf)."""
    c = inputs.case
    B, K, Hq, D = c.batch_size, c.block_size, c.num_q_heads, c.head_dim
    has = l > 0
    safe = torch.where(has, l, torch.ones_like(l))
    out = torch.where(has.unsqueeze(-1), acc / safe.unsqueeze(-1), torch.zeros_like(acc))
    lse = torch.where(has, m + torch.log(safe), torch.full_like(l, -math.inf))
    return out.permute(0, 3, 1, 2, 4).reshape(B, K, Hq, D), lse.permute(0, 3, 1, 2).reshape(B, K, Hq)


class Control(TorchLoweringBase):
    """A correct lowering in one computation order (module docstring); `form` names it."""

    form = ""
    lse_base = BASE_E

    def __init__(self) -> None:
        self.name = f"control[{self.form}]"

    def expected_calls(self, case: Case) -> dict[str, int]:
        return {f"control.{self.form}": 1}

    def run(self, inputs: Inputs) -> LoweringResult:
        counters.record(f"control.{self.form}")
        out, lse = self.attend(inputs)
        return LoweringResult(out=out.to(inputs.q.dtype), lse=lse)

    def attend(self, inputs: Inputs) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError


class Fp32OneRounding(Control):
    form = "fp32-one-rounding"

    def attend(self, inputs):
        return finish(inputs, *online(inputs, 0, inputs.case.max_keys, ONLINE_CHUNK))


class PRounded(Control):
    form = "p-rounded"

    def attend(self, inputs):
        return finish(inputs, *online(inputs, 0, inputs.case.max_keys, FLASH_TILE, kv_rounded=True, round_p=True))


class SplitKV(Control):
    form = f"split-kv-{SPLITS}"

    def attend(self, inputs):
        T = inputs.case.max_keys
        per = max(1, math.ceil(T / SPLITS))
        outs, lses = [], []
        for lo in range(0, T, per):
            o, lse = finish(inputs, *online(inputs, lo, min(T, lo + per), ONLINE_CHUNK))
            outs.append(o.to(inputs.q.dtype).to(torch.float32))  # a split's output in the working dtype
            lses.append(lse)
        lse = torch.stack(lses)  # [S, B, K, Hq], fp32
        mx = lse.amax(0)
        safe = torch.where(torch.isinf(mx), torch.zeros_like(mx), mx)
        w = torch.exp(lse - safe)  # exp(-inf) = 0 for a split that saw nothing
        total = w.sum(0)
        has = total > 0
        out = (w.unsqueeze(-1) * torch.stack(outs)).sum(0) / torch.where(has, total, torch.ones_like(total)).unsqueeze(-1)
        out = torch.where(has.unsqueeze(-1), out, torch.zeros_like(out))
        return out, torch.where(has, safe + torch.log(torch.where(has, total, torch.ones_like(total))),
                                torch.full_like(total, -math.inf))


CONTROLS = (Fp32OneRounding, PRounded, SplitKV)


def controls() -> list[Control]:
    return [cls() for cls in CONTROLS]
