"""Merge of the later block keys into a causal decode (docs/semantics.md 4.3), in the forms production uses.

Every form has one signature:

    merge(q, k_block, v_block, o_a, lse_a, *, scale, right, lse_a_base) -> (out, lse)

`q [B, K, Hq, D]`; `k_block, v_block [B, K, Hkv, D]` (the block's own keys); `o_a [B, K, Hq, D]` and
`lse_a [B, K, Hq]` (fp32, base `lse_a_base`) from part A, the causal decode anchored at each query.
Part B is the attention of query `i` over the block keys `j` with `i < j <= min(K-1, i+right)`
(`right = -1`: all later block keys). The merge, in fp32 and rounded once:
`LSE = logaddexp(LSE_A, LSE_B)`, `O = O_A + sigmoid(LSE_B - LSE_A) * (O_B - O_A)`; an empty part B
has `LSE_B = -inf`, weight 0, and leaves `O_A` bit for bit. Returns `out` in o_a's dtype and `lse` in
`lse_a_base`.
"""

from __future__ import annotations

import types
from typing import Callable

import torch

from lowerings import counters
from oracle.rules import LN2


def merges_future_block_keys(block_size: int, right: int) -> bool:
    """False where no block key follows a query (`K == 1` or `right == 0`): no merge, part A is exact."""
    return block_size > 1 and right != 0


def part_b(q: torch.Tensor, k_block: torch.Tensor, v_block: torch.Tensor, *, scale: float, right: int):
    """Attention over the later block keys: `o_b [B, K, Hq, D]` fp32 (0 where empty) and natural-log
    `lse_b [B, K, Hq]` fp32 (`-inf` where empty)."""
    B, K, Hq, D = q.shape
    Hkv = k_block.shape[2]
    G = Hq // Hkv
    i = torch.arange(K, device=q.device).view(-1, 1)
    j = torch.arange(K, device=q.device).view(1, -1)
    allowed = j > i
    if right != -1:
        allowed = allowed & (j <= i + right)
    qf = q.float().view(B, K, Hkv, G, D)
    s = torch.einsum("bihgd,bjhd->bhgij", qf, k_block.float()) * scale
    s = s.masked_fill(~allowed, float("-inf"))
    m = s.amax(dim=-1, keepdim=True)
    m_safe = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    p = torch.exp(s - m_safe)
    l = p.sum(dim=-1, keepdim=True)
    o = torch.einsum("bhgij,bjhd->bhgid", p, v_block.float())
    has = l > 0
    o = torch.where(has, o / torch.where(has, l, torch.ones_like(l)), torch.zeros_like(o))
    lse = torch.where(has, m_safe + torch.log(torch.where(has, l, torch.ones_like(l))), torch.full_like(l, float("-inf")))
    return (o.permute(0, 3, 1, 2, 4).reshape(B, K, Hq, D),
            lse.squeeze(-1).permute(0, 3, 1, 2).reshape(B, K, Hq))


def merge_states(o_a: torch.Tensor, lse_a: torch.Tensor, o_b: torch.Tensor, lse_b: torch.Tensor):
    """Merge two partial states with natural-log LSEs, in fp32: returns `(out fp32, lse natural)`."""
    lse_a = lse_a.float()
    lse_b = lse_b.float()
    lse = torch.logaddexp(lse_a, lse_b)
    # sigmoid(LSE_B - LSE_A) with -inf on either side handled: -inf - finite -> weight 0.
    diff = lse_b - lse_a
    w = torch.where(torch.isneginf(lse_b), torch.zeros_like(diff), torch.sigmoid(diff))
    o = o_a.float() + w.unsqueeze(-1) * (o_b.float() - o_a.float())
    return o, lse


def merge_eager(q, k_block, v_block, o_a, lse_a, *, scale: float, right: int, lse_a_base: float = 2.0,
                return_part_b: bool = False):
    """The eager merge (dozens of small kernels, as efa53ad had it)."""
    counters.record("torch.merge_eager")
    lse_a_nat = lse_a.float() * LN2 if lse_a_base == 2.0 else lse_a.float()
    o_b, lse_b = part_b(q, k_block, v_block, scale=scale, right=right)
    o, lse = merge_states(o_a, lse_a_nat, o_b, lse_b)
    out = o.to(o_a.dtype)
    lse_out = lse / LN2 if lse_a_base == 2.0 else lse
    if return_part_b:
        return out, lse_out, o_b, lse_b
    return out, lse_out


def _merge_unrolled(q, k_block, v_block, o_a, lse_a, scale: float, right: int, lse_a_base: float):
    """The same math unrolled over the (at most K) later block keys: what torch.compile fuses."""
    B, K, Hq, D = q.shape
    Hkv = k_block.shape[2]
    G = Hq // Hkv
    qf = q.float().view(B, K, Hkv, G, D)
    kf = k_block.float()
    vf = v_block.float()
    lse_nat = lse_a.float().view(B, K, Hkv, G) * (LN2 if lse_a_base == 2.0 else 1.0)
    m = lse_nat
    acc_l = torch.ones_like(lse_nat)          # exp(LSE_A - m) with m = LSE_A
    acc_o = o_a.float().view(B, K, Hkv, G, D)  # O_A weighted by exp(LSE_A - m) = 1
    for d in range(1, K):                     # key j = i + d
        if right != -1 and d > right:
            break
        s = (qf[:, : K - d] * kf[:, d:].unsqueeze(3)).sum(-1) * scale  # [B, K-d, Hkv, G]
        m_old = m[:, : K - d]
        m_new = torch.maximum(m_old, s)
        a = torch.exp(m_old - m_new)
        p = torch.exp(s - m_new)
        head = acc_o[:, : K - d] * a.unsqueeze(-1) + p.unsqueeze(-1) * vf[:, d:].unsqueeze(3)
        acc_o = torch.cat([head, acc_o[:, K - d:]], dim=1)
        acc_l = torch.cat([acc_l[:, : K - d] * a + p, acc_l[:, K - d:]], dim=1)
        m = torch.cat([m_new, m[:, K - d:]], dim=1)
    out = (acc_o / acc_l.unsqueeze(-1)).reshape(B, K, Hq, D).to(o_a.dtype)
    lse = (m + torch.log(acc_l)).reshape(B, K, Hq)
    if lse_a_base == 2.0:
        lse = lse / LN2
    return out, lse


_COMPILED: dict[tuple, Callable] = {}  # compiled_family -> its torch.compile'd function


def _counting_backend(inner: str):
    def backend(gm, example_inputs):
        counters.record_compile("torch.compile[merge_unrolled]")
        if inner == "inductor":
            from torch._inductor.compile_fx import compile_fx
            return compile_fx(gm, example_inputs)
        from torch._dynamo import lookup_backend
        return lookup_backend(inner)(gm, example_inputs)

    return backend


def _no_silent_eager_fallback() -> None:
    """Past dynamo's recompile limit a compiled function silently runs eagerly: raise the limit so one
    process can hold every shape family a sweep draws, and make hitting it an error, not a fallback."""
    import torch._dynamo.config as dc

    for name in ("recompile_limit", "cache_size_limit"):  # the name changed in torch 2.6
        if hasattr(dc, name):
            setattr(dc, name, max(getattr(dc, name), 512))
    if hasattr(dc, "accumulated_recompile_limit"):
        dc.accumulated_recompile_limit = max(dc.accumulated_recompile_limit, 4096)
    elif hasattr(dc, "accumulated_cache_size_limit"):
        dc.accumulated_cache_size_limit = max(dc.accumulated_cache_size_limit, 4096)
    if hasattr(dc, "fail_on_recompile_limit_hit"):
        dc.fail_on_recompile_limit_hit = True


def compiled_family(q: torch.Tensor, k_block: torch.Tensor, *, scale: float, right: int, lse_a_base: float) -> tuple:
    """What one deployed drafter fixes for its merge: device, dtype, K, Hq, Hkv, D, window, LSE base, scale.
    Only the batch varies within it (docs/semantics.md 4.3; seed 000: automatic dynamic shapes)."""
    B, K, Hq, D = q.shape
    return (q.device.type, str(q.dtype).replace("torch.", ""), K, Hq, k_block.shape[2], D, right, lse_a_base,
            float(scale))


def _fresh_merge_unrolled(family: tuple) -> Callable:
    """`_merge_unrolled` with a code object of its own. dynamo keeps its guards, recompiles and
    automatic-dynamic state per code object: one code object across every shape family of a sweep would
    see K and the head counts change and compile graphs with those symbolic too, graphs no deployment
    builds (`tests/lowerings/test_specialization.py` shows both)."""
    code = _merge_unrolled.__code__
    _, dtype, K, Hq, Hkv, D, right, _, _ = family
    name = f"_merge_unrolled_{dtype}_K{K}_{Hq}x{Hkv}_D{D}_r{right if right >= 0 else 'all'}_{len(_COMPILED)}"
    fn = types.FunctionType(code.replace(co_name=name), _merge_unrolled.__globals__, name)
    fn.__qualname__ = name
    return fn


def merge_compiled(q, k_block, v_block, o_a, lse_a, *, scale: float, right: int, lse_a_base: float = 2.0):
    """The unrolled merge under torch.compile with automatic dynamic shapes, compiled per shape family
    (`compiled_family`) as a deployed drafter compiles it: a static graph at the first batch size, then
    one with a symbolic batch. Inductor on CUDA; dynamo's `eager` backend on CPU, where an inductor
    build per shape family would cost CI minutes (the graph capture, its guards and its recompiles are
    the same)."""
    inner = "inductor" if q.is_cuda else "eager"
    family = compiled_family(q, k_block, scale=scale, right=right, lse_a_base=lse_a_base)
    fn = _COMPILED.get(family)
    if fn is None:
        _no_silent_eager_fallback()
        fn = torch.compile(_fresh_merge_unrolled(family), backend=_counting_backend(inner), dynamic=None)
        _COMPILED[family] = fn
    counters.record("torch.compile[merge_unrolled]")
    return fn(q, k_block, v_block, o_a, lse_a, scale, right, lse_a_base)


def merge_triton(q, k_block, v_block, o_a, lse_a, *, scale: float, right: int, lse_a_base: float = 2.0):
    """One hand-written Triton kernel (`lowerings/_merge_kernel.py`)."""
    from lowerings import _merge_kernel as mk

    launches: list[str] = []
    with counters.count_triton_compiles("triton.merge_future_block_keys", *mk.KERNELS):
        out = mk.merge_future_block_keys_triton(q, k_block, v_block, o_a, lse_a, scale=scale, right=right,
                                                lse_a_base=lse_a_base, launches=launches)
    for name in launches:
        counters.record(f"triton.{name}")
    return out


MERGE_FORMS: dict[str, Callable] = {"eager": merge_eager, "compiled": merge_compiled, "triton": merge_triton}
